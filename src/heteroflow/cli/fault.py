"""``heteroflow fault``, ``heteroflow status`` and ``heteroflow restore``: break, inspect and restore a local cluster
(``heteroflow up``) by instance and DP rank, through its state file. The injections themselves are in
:mod:`heteroflow.local.faults`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from heteroflow.cli.errors import FAILED_EXIT_CODE
from heteroflow.local import faults
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.hardware import HardwareVia
from heteroflow.local.hardware import inject as inject_hardware
from heteroflow.local.state import InstanceState, StateFileError, read_state
from heteroflow.local.view import render, take_snapshot

app = typer.Typer(help="Inject a fault into one DP rank of a local cluster (`heteroflow up`).", no_args_is_help=True)

StateFile = Annotated[Path, typer.Option(help="The state file `heteroflow up` wrote")]
Instance = Annotated[str | None, typer.Option(help="Instance id (default: the only one)")]
Rank = Annotated[int, typer.Option(min=0, help="Original global DP rank")]
DEFAULT_STATE = Path("var/local/state.json")


_CHECK_CLUSTER = "is the local cluster of this state file (`heteroflow up`) still running?"


def _with_check(exc: Exception) -> str:
    """The failure and, for a cluster that does not answer, what to check."""
    if isinstance(exc, ClusterUnreachableError):
        return f"{exc}; {_CHECK_CLUSTER}"
    return str(exc)


def _run(state_file: Path, instance: str | None, act: Callable[[ClusterClient, InstanceState], str]) -> None:
    """Load the state, run one injection, print what it did; every known failure is one line and exit code 2."""
    try:
        state = read_state(state_file)
        inst = state.instance(instance)
        with ClusterClient(state) as client:
            typer.echo(act(client, inst))
    except (StateFileError, faults.FaultError, ClusterUnreachableError) as exc:  # hardware's errors included
        typer.echo(f"error: {_with_check(exc)}", err=True)
        raise typer.Exit(FAILED_EXIT_CODE) from exc


@app.command()
def kill(
    rank: Rank,
    state_file: StateFile = DEFAULT_STATE,
    instance: Instance = None,
    mode: Annotated[
        faults.KillMode, typer.Option(help="worker: the rank's worker dies; process: SIGKILL of the whole engine")
    ] = faults.KillMode.WORKER,
) -> None:
    """Kill a rank: its worker (it reports dead) or its whole engine process group (it stops answering)."""
    _run(state_file, instance, lambda client, inst: faults.kill(client, inst, rank, mode=mode))


@app.command()
def hang(
    rank: Rank,
    state_file: StateFile = DEFAULT_STATE,
    instance: Instance = None,
    resume: Annotated[bool, typer.Option(help="SIGCONT instead: resume a hung worker")] = False,
) -> None:
    """Hang a rank's worker (SIGSTOP): busy peers time out in their next collective."""
    _run(state_file, instance, lambda client, inst: faults.hang(client, inst, rank, resume=resume))


@app.command()
def transient(rank: Rank, state_file: StateFile = DEFAULT_STATE, instance: Instance = None) -> None:
    """A transient collective failure: every rank unhealthy, none dead."""
    _run(state_file, instance, lambda client, inst: faults.transient(client, inst, rank))


@app.command()
def hardware(
    rank: Rank,
    state_file: StateFile = DEFAULT_STATE,
    instance: Instance = None,
    via: Annotated[
        HardwareVia,
        typer.Option(
            help="controller: POST /controller/report_hardware_fault; mindcluster: the node's ConfigMap document in "
            "the folder the controller follows; gpu-health: an XID in the node agent's heartbeat to the platform"
        ),
    ] = HardwareVia.CONTROLLER,
    level: Annotated[
        int | None, typer.Option(min=1, max=6, help="Fault level L1-L6, default L5 (L4-L6 open a window)")
    ] = None,
    code: Annotated[
        str | None, typer.Option(help="Fault code (default XID79; 80E18402 for mindcluster; the XID for gpu-health)")
    ] = None,
    card: Annotated[
        str | None, typer.Option(help="Name the card this way instead of the rank's own card (not for gpu-health)")
    ] = None,
    cleared: Annotated[bool, typer.Option(help="Report the fault as gone")] = False,
    wait: Annotated[
        float, typer.Option(min=0.0, help="Seconds to wait for the controller to take a fault sent via a source")
    ] = 30.0,
) -> None:
    """Report a hardware fault on the rank's card, to the controller directly or through a hardware source."""
    _run(
        state_file,
        instance,
        lambda client, inst: inject_hardware(
            client, inst, rank, via=via, level=level, code=code, card=card, cleared=cleared, wait_sec=wait
        ),
    )


def status(
    state_file: StateFile = DEFAULT_STATE,
    as_json: Annotated[bool, typer.Option("--json", help="Print the controller's status JSON as it is")] = False,
) -> None:
    """Print the controller's fault-tolerance status of a local cluster (with each NodeManager's engines)."""
    try:
        state = read_state(state_file)
        with ClusterClient(state) as client:
            if as_json:
                typer.echo(json.dumps(client.controller_status(), indent=2))
                return
            snapshot = take_snapshot(client)
    except (StateFileError, ClusterUnreachableError) as exc:
        typer.echo(f"error: {_with_check(exc)}", err=True)
        raise typer.Exit(FAILED_EXIT_CODE) from exc
    if snapshot.error is not None:
        typer.echo(f"error: the controller is unreachable: {snapshot.error}; {_CHECK_CLUSTER}", err=True)
        raise typer.Exit(FAILED_EXIT_CODE)
    from rich.console import Console

    Console().print(render(snapshot, state))


def restore(
    state_file: StateFile = DEFAULT_STATE,
    instance: Instance = None,
    wait: Annotated[
        float, typer.Option(min=0.0, help="Seconds to wait for the restore to end (0: return once it started)")
    ] = 0.0,
) -> None:
    """Bring a scaled-down instance back to its configured size: a planned relaunch of every rank at full size
    (the controller refuses, with its reason, while the retired ranks' capacity is not back)."""
    try:
        state = read_state(state_file)
        inst = state.instance(instance)
        with ClusterClient(state, timeout_sec=10) as client:
            started = client.restore(inst.instance_id)
            request_id = str(started["request_id"])
            typer.echo(f"restore {request_id} of {inst.instance_id} started")
            if wait <= 0:
                return
            deadline = time.monotonic() + wait
            while True:
                entry = client.instance_status(inst.instance_id) or {}
                last = entry.get("restore") or {}
                if last.get("request_id") == request_id and last.get("state") != "running":
                    break
                if time.monotonic() > deadline:
                    typer.echo(f"error: restore {request_id} still running after {wait:g} s", err=True)
                    raise typer.Exit(FAILED_EXIT_CODE)
                time.sleep(0.5)  # the status poll period
    except (StateFileError, ClusterUnreachableError) as exc:
        typer.echo(f"error: {_with_check(exc)}", err=True)
        raise typer.Exit(FAILED_EXIT_CODE) from exc
    if last["state"] == "succeeded":
        typer.echo(f"restored: {inst.instance_id} serves {entry.get('published_endpoints')} ({last['seconds']} s)")
        return
    typer.echo(
        f"error: restore failed: {last.get('error')}; the instance runs {last.get('degraded_phase')} scaled down",
        err=True,
    )
    raise typer.Exit(FAILED_EXIT_CODE)
