"""Fault injection into a running local cluster, by instance and DP rank (``heteroflow fault``).

Each injection says what it did in one sentence. Pids are never taken on trust from a state file that might
be stale: a pid is signalled only when its environment carries this cluster's marker, so a reused pid of an
unrelated process is never touched.
"""

from __future__ import annotations

import os
import signal
from enum import StrEnum
from pathlib import Path

from heteroflow.local.client import ClusterClient
from heteroflow.local.processes import CLUSTER_ID_ENV
from heteroflow.local.state import ClusterState, EndpointState, InstanceState
from heteroflow.serving.node_manager.spec import endpoint_url


class KillMode(StrEnum):
    WORKER = "worker"
    """The rank's worker dies (the simulator's ``kill_worker``): the rank reports ``dead``, its API server
    stays up; peers notice in their next collective."""
    PROCESS = "process"
    """SIGKILL of the engine's whole process group (API server and worker): the rank stops answering."""


class FaultError(Exception):
    """The fault could not be injected; the text says why."""


def endpoint_of(inst: InstanceState, rank: int) -> EndpointState:
    """The state file's endpoint of ``rank``; :class:`FaultError` naming the ranks there are."""
    try:
        return inst.endpoint(rank)
    except KeyError:
        ranks = ", ".join(str(e.id) for e in inst.endpoints)
        raise FaultError(f"{inst.instance_id} has no rank {rank} (its ranks: {ranks})") from None


def _engine_url(inst: InstanceState, rank: int) -> str:
    endpoint = endpoint_of(inst, rank)
    return endpoint_url(endpoint.ip, endpoint.port)


def _belongs_to(state: ClusterState, pid: int) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{CLUSTER_ID_ENV}={state.cluster_id}".encode() in environ.split(b"\0")


def _engine_pid(client: ClusterClient, inst: InstanceState, rank: int) -> int:
    """The engine API server's pid, as the rank's NodeManager knows it (``GET /node-manager/status``)."""
    pod = inst.pod(inst.endpoint(rank).pod)
    status = client.node_manager_status(pod.node_manager_url)
    for endpoint in status.get("endpoints", []):
        if endpoint.get("endpoint_id") == rank:
            pid = endpoint.get("pid")
            if not endpoint.get("running") or not isinstance(pid, int):
                raise FaultError(f"rank {rank} is not running under {pod.pod_id} (retired or stopped)")
            return pid
    raise FaultError(f"{pod.pod_id} does not list rank {rank}")


def _signal(state: ClusterState, pid: int, sig: signal.Signals, *, group: bool) -> None:
    if not _belongs_to(state, pid):
        raise FaultError(f"pid {pid} is not a process of this cluster (a stale state file?)")
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError as exc:
        raise FaultError(f"pid {pid} is gone") from exc


def kill(client: ClusterClient, inst: InstanceState, rank: int, *, mode: KillMode) -> str:
    url = _engine_url(inst, rank)
    if mode == KillMode.WORKER:
        client.inject(url, "kill_worker")
        return f"killed the worker of {inst.instance_id} rank {rank} (POST {url}/sim/faults kill_worker)"
    pid = _engine_pid(client, inst, rank)
    _signal(client.state, pid, signal.SIGKILL, group=True)
    return f"SIGKILL to the process group {pid} of {inst.instance_id} rank {rank} (API server and worker)"


def hang(client: ClusterClient, inst: InstanceState, rank: int, *, resume: bool = False) -> str:
    url = _engine_url(inst, rank)
    worker = client.engine_info(url).get("worker_pid")
    if not isinstance(worker, int):
        raise FaultError(f"{inst.instance_id} rank {rank} reports no worker pid (its worker is gone)")
    sig = signal.SIGCONT if resume else signal.SIGSTOP
    _signal(client.state, worker, sig, group=False)
    what = "resumed" if resume else "hung"
    return f"{what} the worker {worker} of {inst.instance_id} rank {rank} ({sig.name})"


def transient(client: ClusterClient, inst: InstanceState, rank: int) -> str:
    url = _engine_url(inst, rank)
    client.inject(url, "transient")
    return (
        f"transient collective failure from {inst.instance_id} rank {rank} (POST {url}/sim/faults transient): "
        "every rank turns unhealthy, none dead"
    )
