"""``heteroflow`` — the single command surface of the platform."""

from __future__ import annotations

from typing import Annotated

import typer

from heteroflow.cli import admin, agent, controller, coordinator, engine_sim, fault, health, local, node_manager, sim
from heteroflow.core.logs import configure_logging
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.server.settings import ServerSettings

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


@app.command()
def server(
    host: Annotated[str | None, typer.Option(help="Bind address [env HETEROFLOW_SERVER_HOST; 127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port [env HETEROFLOW_SERVER_PORT; 8080]")] = None,
    database_url: Annotated[
        str | None, typer.Option(help="sqlite:///PATH or postgresql://… [env HETEROFLOW_DATABASE_URL]")
    ] = None,
) -> None:
    """Run the platform server (migrates the database first)."""
    from heteroflow.cli.http_server import serve
    from heteroflow.server.app import build_context, create_app

    overrides = {
        key: value
        for key, value in {"host": host, "port": port, "database_url": database_url}.items()
        if value is not None
    }
    settings = ServerSettings.load(**overrides)
    configure_logging(level=settings.log_level)
    ctx = build_context(settings=settings, health_settings=HealthStorageSettings.load())
    serve(create_app(ctx), host=settings.host, port=settings.port, lifespan="on")


if __name__ == "__main__":  # pragma: no cover
    app()
