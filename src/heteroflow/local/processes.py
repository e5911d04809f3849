"""The processes of a local cluster: start each in its own session, find them again, stop them all.

Every process gets ``HETEROFLOW_LOCAL_CLUSTER_ID`` in its environment, and everything it starts inherits it
(the NodeManagers' engines and the engines' torch workers, which run in sessions of their own). So "no
process of this cluster is left" is checkable without trusting any pid list: scan ``/proc/*/environ`` for the
marker. Each process we start leads its own session (``pid`` = process group = session id), so one
``killpg`` reaches it and any helper it forked; Ctrl-C in the terminal reaches only ``heteroflow up``, which
then stops the others in order.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from heteroflow.core.files import private_file

CLUSTER_ID_ENV = "HETEROFLOW_LOCAL_CLUSTER_ID"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGTERM the child when its parent goes away (even by SIGKILL), so a crashed
    launcher leaves no cluster behind: a NodeManager stops its engines on SIGTERM. Linux only; the signal is
    tied to the *thread* that started the child, so start clusters from a thread that outlives them."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class ManagedProcess:
    """One process we started, its log, and the role it plays (``server``, ``node-manager:inst-1-pod-a``…)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    argv: tuple[str, ...]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def start_process(
    name: str, argv: Sequence[str], *, env: Mapping[str, str], log: Path, cwd: Path | None = None
) -> ManagedProcess:
    """Start ``argv`` in its own session with ``env`` (complete), output appended to ``log`` (0600), with umask
    077: whatever it writes (a database, a runtime store, engine logs) is readable by its owner only."""
    private_file(log)
    with log.open("ab") as out:  # the child keeps its own descriptor
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {name}: starting\n".encode())
        out.flush()
        popen = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments, no shell
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            umask=0o077,
            preexec_fn=_die_with_parent,  # only a prctl call: nothing that takes a lock
        )
    return ManagedProcess(name=name, popen=popen, log=log, argv=tuple(argv))


def stop_processes(processes: Iterable[ManagedProcess], *, grace_sec: float) -> list[ManagedProcess]:
    """SIGTERM each process's group, wait up to ``grace_sec`` for all, SIGKILL the groups of the rest.

    Returns the processes that had to be killed."""
    running = [p for p in processes if p.exit_code() is None]
    for proc in running:
        proc.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_sec
    for proc in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=max(deadline - time.monotonic(), 0.01))
    killed = []
    for proc in running:
        # Only a group whose leader still runs is certainly ours: once the leader is reaped its id may be
        # reused. Helpers of an exited leader carry the cluster marker, and the final sweep finds them.
        if proc.exit_code() is None:
            proc.signal_group(signal.SIGKILL)
            killed.append(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
    return killed


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # state(0) ppid(1) pgrp(2) session(3)


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat``); ``None`` when it is gone. Together
    with the pid it names one process: a reused pid starts later."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of stat, counted from the state (field 3)


def marked_processes(cluster_id: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries this cluster's marker."""
    needle = f"{CLUSTER_ID_ENV}={cluster_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return sorted(found)


def session_members(session_ids: Iterable[int]) -> dict[int, list[int]]:
    """Live processes of each session led by one of ``session_ids`` (empty sessions omitted)."""
    wanted = set(session_ids)
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is None or fields[0] in ("Z", "X"):
            continue
        session = int(fields[3])
        if session in wanted:
            found.setdefault(session, []).append(int(entry.name))
    return found


def kill_marked(cluster_id: str) -> list[int]:
    """SIGKILL every process (and its session) that carries the marker: the last sweep after an orderly
    stop, for engines whose NodeManager could not stop them. Returns the pids that were found."""
    pids = marked_processes(cluster_id)
    for pid in pids:
        fields = _stat(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if fields is not None and int(fields[3]) == pid:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
    return pids
