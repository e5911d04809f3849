"""``heteroflow agent``: run the node agent, or probe what it would collect here."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import typer

from heteroflow.agent.assembly import build_agent, kernel_log_from, run_probe
from heteroflow.agent.collectors import CHOICES, CollectorChoice
from heteroflow.agent.commands import SubprocessRunner
from heteroflow.agent.runner import install_stop_signals
from heteroflow.agent.settings import AgentSettings
from heteroflow.cli.errors import http_url_problem
from heteroflow.core.clock import SystemClock
from heteroflow.core.logs import configure_logging

app = typer.Typer(help="The node agent: GPU telemetry, health counters and XID events.", no_args_is_help=True)

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_COLLECTOR_HELP = "auto | nvml | nvidia-smi | xpu-smi | cnmon"


def _collector(value: str | None) -> CollectorChoice | None:
    if value is None:
        return None
    if value not in CHOICES:
        raise typer.BadParameter(f"choose one of {', '.join(CHOICES)}", param_hint="--collector")
    return value


@app.command()
def run(
    server: Annotated[str | None, typer.Option(help="Server URL [env HETEROFLOW_AGENT_SERVER_URL]")] = None,
    token: Annotated[str | None, typer.Option(help="Token with scope 'agent' [env HETEROFLOW_AGENT_TOKEN]")] = None,
    node_name: Annotated[
        str | None, typer.Option(help="Register as this hostname [default: this machine's hostname]")
    ] = None,
    heartbeat_interval: Annotated[float | None, typer.Option(help="Seconds between heartbeats [5]", min=0.01)] = None,
    health_interval: Annotated[
        float | None, typer.Option(help="Seconds between health-counter collections [60]", min=0.01)
    ] = None,
    tick_timeout: Annotated[float | None, typer.Option(help="Time limit of one collection [20]", min=0.01)] = None,
    reconnect_max: Annotated[
        float | None, typer.Option(help="Longest wait between reconnect attempts [30]", min=0.01)
    ] = None,
    collector: Annotated[str | None, typer.Option(help=_COLLECTOR_HELP)] = None,
    simulate: Annotated[
        int | None, typer.Option(help="Report this many simulated cards (source 'simulated')", min=0, max=64)
    ] = None,
) -> None:
    """Register this node, then beat until SIGTERM (reconnects with backoff when the server is away)."""
    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "server_url": server,
            "token": token,
            "node_name": node_name,
            "heartbeat_interval_seconds": heartbeat_interval,
            "health_interval_seconds": health_interval,
            "tick_timeout_seconds": tick_timeout,
            "reconnect_max_seconds": reconnect_max,
            "collector": _collector(collector),
            "simulate_gpus": simulate,
        }.items()
        if value is not None
    }
    if node_name is not None and not _NODE_NAME.fullmatch(node_name):
        # An explicit flag is not an environment typo: refuse it rather than register another name.
        raise typer.BadParameter(
            "letters, digits, '.', '_' and '-', starting with a letter or digit", param_hint="--node-name"
        )
    settings = AgentSettings.load(**overrides)
    if (problem := http_url_problem(settings.server_url)) is not None:
        raise typer.BadParameter(problem, param_hint="--server / HETEROFLOW_AGENT_SERVER_URL")
    configure_logging(level=settings.log_level)
    if not settings.token:
        raise typer.BadParameter("a token is required (--token or HETEROFLOW_AGENT_TOKEN)", param_hint="--token")
    agent = build_agent(
        settings, runner=SubprocessRunner(), clock=SystemClock(), kernel_log=kernel_log_from(settings.kernel_log)
    )
    install_stop_signals(agent.stop_event.set)
    raise typer.Exit(agent.run())


@app.command()
def probe(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document")] = False,
    collector: Annotated[str, typer.Option(help=_COLLECTOR_HELP)] = "auto",
    timeout: Annotated[float, typer.Option(help="Time limit of the vendor tool, seconds", min=0.1)] = 20.0,
) -> None:
    """Collect once and print what was read (exit 0 even when no vendor tool is installed)."""
    configure_logging(level="warning")
    choice = _collector(collector) or "auto"
    report = run_probe(
        choice,
        runner=SubprocessRunner(),
        clock=SystemClock(),
        timeout_sec=timeout,
        kernel_log=kernel_log_from(AgentSettings().kernel_log),
    )
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(f"collector: {report['collector']}")
    for gpu in report["gpus"]:
        counters = ", ".join(
            f"{key}={'unknown' if gpu[key] is None else gpu[key]}"
            for key in (
                "ecc_uncorrected_total",
                "ecc_corrected_total",
                "retired_pages",
                "remapped_rows_pending",
                "remapped_rows_failure",
            )
        )
        typer.echo(f"  GPU {gpu['index']} {gpu['vendor']} {gpu['name']} ({gpu['uuid']}): {counters}")
    xid = report["xid_events"]
    typer.echo(f"XID events: {xid['state'].replace('_', ' ')}" + (f" ({xid['reason']})" if xid["reason"] else ""))
    for warning in report["warnings"]:
        typer.echo(f"warning: {warning}")
