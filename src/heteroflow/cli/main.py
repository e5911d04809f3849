"""``heteroflow`` — the single command surface of the platform."""

from __future__ import annotations

import typer

from heteroflow.cli import (
    admin,
    agent,
    controller,
    coordinator,
    engine_sim,
    fault,
    health,
    local,
    node_manager,
    server,
    sim,
)
from heteroflow.core.logs import configure_logging

app = typer.Typer(
    name="heteroflow",
    help="HeteroFlow keeps large GPU/NPU inference fleets serving through hardware faults.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _quiet_logs_on_stderr() -> None:
    """HeteroFlow keeps large GPU/NPU inference fleets serving through hardware faults."""
    # commands print their results on stdout; logs go to stderr, warnings and above unless a command says otherwise
    configure_logging(level="warning", json=False)


app.add_typer(admin.app, name="admin")
app.add_typer(admin.db_app, name="db")
app.add_typer(agent.app, name="agent")
app.add_typer(health.app, name="health")
app.add_typer(sim.app, name="sim")
app.command("up")(local.up)
app.command("engine-sim")(engine_sim.engine_sim)
app.command("node-manager")(node_manager.node_manager)
app.command("coordinator")(coordinator.coordinator)
app.command("controller")(controller.controller)
app.add_typer(fault.app, name="fault")
app.command("status")(fault.status)
app.command("server")(server.server)


if __name__ == "__main__":  # pragma: no cover
    app()
