"""``heteroflow up``: the whole platform on one machine, as real processes, until Ctrl-C or SIGTERM.

A thin shell over :class:`heteroflow.local.LocalCluster` (``docs/local-cluster.md``): start it, print where
everything is, wait until the instances serve, show the live view (or plain lines when stdout is not a
terminal), and stop every process on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import webbrowser
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from heteroflow.contracts.engine_protocol import profile
from heteroflow.core.logs import configure_logging
from heteroflow.local.client import ClusterClient
from heteroflow.local.cluster import ClusterError, ClusterOptions, LocalCluster
from heteroflow.local.plan import PlanError
from heteroflow.local.ports import PortUnavailableError
from heteroflow.local.state import ClusterState
from heteroflow.local.view import LineLog, render, take_snapshot

VIEW_PERIOD_SEC = 1.0


def up(
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Platform server port [8080 when free; 0 = any free port]")
    ] = None,
    controller_port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Controller port [8500 when free; 0 = any]")
    ] = None,
    coordinator_port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Coordinator port [8400 when free; 0 = any]")
    ] = None,
    data_dir: Annotated[Path, typer.Option(help="SQLite databases, configurations, logs and the state file")] = Path(
        "var/local"
    ),
    state_file: Annotated[
        Path | None, typer.Option(help="Where to write URLs, token, instances, pids [DATA_DIR/state.json]")
    ] = None,
    dp: Annotated[int, typer.Option(min=1, max=64, help="DP ranks per serving instance")] = 4,
    pods: Annotated[int, typer.Option(min=1, max=26, help="Pods (NodeManagers) per instance")] = 2,
    instances: Annotated[int, typer.Option(min=1, max=8, help="Serving instances")] = 1,
    sim_nodes: Annotated[int, typer.Option(min=0, max=64, help="Simulated GPU nodes (8 cards each) to run")] = 2,
    config: Annotated[
        Path | None, typer.Option(help="Controller YAML merged over the generated one (the file wins)")
    ] = None,
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Never open the web UI in a browser")] = False,
    netns: Annotated[
        bool,
        typer.Option(
            "--netns",
            help="Each pod in a network namespace of its own, on an address of its own (Linux, root, iproute2)",
        ),
    ] = False,
    ready_timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for the instances to serve")] = 300.0,
    engine: Annotated[
        str, typer.Option(help="Engines: sim (the simulator) or vllm (real ranks from the cached vLLM venv)")
    ] = "sim",
    model: Annotated[
        Path | None, typer.Option(help="With --engine vllm: the model directory [the generated tiny MoE model]")
    ] = None,
    ft_profile: Annotated[
        str,
        typer.Option(
            help="FT protocol profile of the simulated engines: vllm-0.34 (alias scale-down) or vllm-0.32 "
            "(alias vllm-released)"
        ),
    ] = "vllm-0.34",
) -> None:
    """Run HeteroFlow locally: platform, controller, Coordinator, NodeManagers, simulated engines and GPU nodes."""
    configure_logging(level="warning", json=False)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, request_stop)
    if engine not in ("sim", "vllm"):
        raise typer.BadParameter(f"--engine must be sim or vllm, not {engine!r}")
    try:
        sim_ft_profile = profile(ft_profile).name
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if engine == "vllm" and ready_timeout == 300.0:
        ready_timeout = 900.0  # real ranks take 50-120 s each to start on a small CPU machine
    options = ClusterOptions(
        engine="vllm" if engine == "vllm" else "sim",
        vllm_model=model,
        sim_ft_profile=sim_ft_profile,
        data_dir=data_dir,
        state_file=state_file,
        dp_size=dp,
        pods=pods,
        instances=instances,
        sim_nodes=sim_nodes,
        server_port=port,
        controller_port=controller_port,
        coordinator_port=coordinator_port,
        controller_config=config,
        network_namespaces=netns,
    )
    cluster = LocalCluster(options)
    try:
        state = cluster.start()
    except (ClusterError, PlanError, PortUnavailableError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    code = 0
    try:
        _announce(state, options.state_path)
        typer.echo("waiting until every instance serves (the simulated engines take ~30 s to start)…")
        cluster.wait_ready(timeout_sec=ready_timeout, cancel=stop.is_set)
        if not stop.is_set():
            typer.echo(_serving_hint(state, options.state_path))
            if not no_browser:
                _open_browser(state.server_url)
            _watch(cluster, state, stop)
    except ClusterError as exc:
        typer.echo(f"error: {exc}", err=True)
        code = 1
    finally:
        typer.echo("stopping…")
        report = cluster.stop()
        if report.left:
            typer.echo(f"warning: processes left behind: {list(report.left)}", err=True)
            code = code or 1
        for line in report.network_left:
            typer.echo(f"warning: network left behind: {line}", err=True)
            code = code or 1
        typer.echo(f"stopped; logs are in {state.log_dir}")
    raise typer.Exit(code)


def _announce(state: ClusterState, state_path: Path) -> None:
    rows = [
        ("platform server", state.server_url),
        ("controller", state.controller_url),
        ("coordinator (OpenAI)", state.coordinator_url),
        ("admin token", state.admin_token),
        ("API key", state.api_key or state.admin_token),
        ("state file", str(state_path)),
        ("logs", state.log_dir),
    ]
    for inst in state.instances:
        pods = ", ".join(f"{p.pod_id} {p.endpoint_ids} on {p.node_name}" for p in inst.pods)
        rows.append((inst.instance_id, f"{inst.model}, DP {inst.dp_size}: {pods}"))
    if state.network is not None:
        rows.append(("bridge", f"{state.network.bridge} {state.network.gateway} ({state.network.subnet})"))
        rows += [(pod.pod_id, f"{pod.ip} in namespace {pod.namespace}") for pod in state.network.pods]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        typer.echo(f"{name:<{width}}  {value}")


def command_prefix(argv0: str, *, cwd: Path, executable: str, on_path: str | None) -> str:
    """How to run this same ``heteroflow`` again from ``cwd``, so that a printed hint runs as printed.

    ``on_path`` is what ``heteroflow`` resolves to on ``PATH`` (``None``: not there). The plain name only when it is
    this program; a script by its path (relative to ``cwd`` when inside it, e.g. ``.venv/bin/heteroflow``);
    ``python -m heteroflow`` with this interpreter when run as a module."""
    program = Path(argv0)
    if program.name in {"__main__.py", "main.py"}:
        return f"{executable} -m heteroflow"
    if "/" not in argv0:  # found on PATH when it started
        return "heteroflow" if on_path is not None else f"{executable} -m heteroflow"
    script = Path(os.path.normpath(cwd / program))  # as named, links kept: `.venv` may be a link
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "heteroflow"
    return str(script.relative_to(cwd)) if script.is_relative_to(cwd) else str(script)


def _serving_hint(state: ClusterState, state_path: Path) -> str:
    inst = state.instances[0]
    body = json.dumps({"model": inst.model, "prompt": "hello", "max_tokens": 8})
    program = command_prefix(sys.argv[0], cwd=Path.cwd(), executable=sys.executable, on_path=shutil.which("heteroflow"))
    return (
        "serving. try:\n"
        f"  curl -s {state.coordinator_url}/v1/completions "
        f"-H 'Authorization: Bearer {state.api_key or state.admin_token}' \\\n"
        f"       -H 'content-type: application/json' -d '{body}'\n"
        f"  {program} fault kill --state-file {state_path} --instance {inst.instance_id} --rank 2\n"
        f"  {program} status --state-file {state_path}\n"
        f"web UI: {state.server_url}/ (sign in with the admin token above)"
    )


def _open_browser(url: str) -> None:
    """Only on a terminal with a graphical session: without one, Python's webbrowser would fall back to a
    console browser that takes over the terminal the live view needs."""
    graphical = bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) or sys.platform == "darwin"
    if not (sys.stdout.isatty() and graphical):
        return
    try:
        webbrowser.get().open(f"{url}/nodes/gpu-health")
    except webbrowser.Error:
        return


def _watch(cluster: LocalCluster, state: ClusterState, stop: threading.Event) -> None:
    """The live view until ``stop`` is set; plain lines when stdout is not a terminal."""
    reported: set[str] = set()

    def exits() -> list[str]:
        found = []
        for name, code in cluster.exited():
            if name not in reported:
                reported.add(name)
                found.append(f"{name} exited with code {code} (see its log in {state.log_dir})")
        return found

    with ClusterClient(state, timeout_sec=2.0) as client:
        if not sys.stdout.isatty():
            log = LineLog()
            while not stop.wait(VIEW_PERIOD_SEC):
                for line in [*exits(), *log.lines(take_snapshot(client))]:
                    typer.echo(line)
            return
        from rich.console import Console, Group
        from rich.live import Live
        from rich.text import Text

        def view() -> Group:
            return Group(render(take_snapshot(client), state), Text("Ctrl-C stops everything", style="dim"))

        console = Console()
        with Live(view(), console=console, auto_refresh=False) as live:
            while not stop.wait(VIEW_PERIOD_SEC):
                for line in exits():
                    console.print(f"[red]{line}[/red]")
                live.update(view(), refresh=True)
