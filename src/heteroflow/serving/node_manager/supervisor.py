"""ProcessSupervisor (F-2): launches the engines and notices the moment one of their processes exits.

Each engine is an API-server process started in its own session, plus the subprocesses it spawns (the
engine core / workers; the simulator's worker). When the engine first becomes ready the supervisor adopts
the API server's descendants that exist then (helpers that come and go before readiness are not the
engine). From then on, the API server exiting, or any adopted descendant exiting or turning zombie, is an
engine death, reported once per incarnation with the endpoint id — independently of the FT status route,
so a DEAD candidate exists even when that route is unreachable.

An adopted subprocess that stays *stopped* (``/proc`` state ``T``: SIGSTOP, a job-control stop; ``t``: a
tracer's stop) for ``stopped_dead_sec`` is a death too: a stopped worker still holds its place in the DP group,
so every peer's collective waits on it until the collective timeout, while its API server goes on answering
``healthy`` — nobody else can tell which rank hangs (gloo's timeout names no peer). The supervisor reports it
and kills the engine's session, which makes the evidence true (as F-51 fences DEAD evidence from
unreachability) and lets the peers see the rank leave at once ("Connection closed by peer") instead of at
their collective timeout. A stopped API server alone is not a death: its worker keeps stepping with the
peers, so the instance keeps serving, and the poller's unreachability rule (F-1) covers it; so does a stop of
the whole engine (API server and worker: a frozen pod), which ends when the same engine answers again.

Processes are behind :class:`ProcessLauncher` / :class:`ProcessHandle`: :class:`PopenLauncher` is the real
one (``/proc`` on Linux), ``testing.FakeLauncher`` the in-memory one. Engines never outlive their NodeManager,
even one that is SIGKILLed: a restarted NodeManager must find its engines' ports free, as after the restart of
a pod's container. :meth:`ProcessSupervisor.check` is
synchronous and returns the new deaths; the daemon calls it every ``supervisor_interval_sec``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

import structlog

from heteroflow.contracts.serving import EngineIdentity
from heteroflow.serving.node_manager.spec import EngineCommand

_log = structlog.get_logger(__name__)

_EXIT_SETTLE_SEC = 0.5
"""How long a death whose API server is still exiting waits for that server's exit code before it is reported
without one (an exit stuck in the kernel, e.g. on a driver, must not hide the death)."""


class ProcessHandle(Protocol):
    @property
    def pid(self) -> int: ...

    def exit_code(self) -> int | None:
        """The API server's exit code once it exited (reaped), else ``None``."""
        ...

    def descendants(self) -> frozenset[int]:
        """Live descendants of the API server now."""
        ...

    def is_gone(self, pid: int) -> bool:
        """Whether a descendant exited (or is a zombie nobody reaped yet)."""
        ...

    def is_stopped(self, pid: int) -> bool:
        """Whether a descendant is stopped now (SIGSTOP, a job-control or a tracer's stop)."""
        ...

    def is_exiting(self) -> bool:
        """Whether the API server is exiting now: the kernel is tearing it down, its exit code follows."""
        ...

    def identity(self) -> EngineIdentity | None: ...

    def signal_session(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every process of the engine's session."""
        ...

    def wait(self, timeout: float) -> bool:
        """Wait until the API server exited; whether it did within ``timeout`` seconds."""
        ...


class ProcessLauncher(Protocol):
    def launch(self, command: EngineCommand) -> ProcessHandle: ...


@dataclass(frozen=True, slots=True)
class EngineExit:
    """One engine death, as reported (ENGINE_DEAD)."""

    endpoint_id: int
    incarnation: int
    detail: str
    exit_code: int | None
    identity: EngineIdentity | None


@dataclass
class _Incarnation:
    number: int
    handle: ProcessHandle
    identity: EngineIdentity | None
    adopted: frozenset[int] = frozenset()
    ready: bool = False
    stopping: bool = False
    exited: EngineExit | None = None
    stopped_since: dict[int, float] = field(default_factory=dict)
    exiting_since: float | None = None
    """When the API server was first seen exiting with its subprocesses gone (``now`` of ``check``)."""
    """Adopted subprocesses seen stopped, since when (the ``now`` of :meth:`ProcessSupervisor.check`)."""


class ProcessSupervisor:
    def __init__(self, launcher: ProcessLauncher, *, stopped_dead_sec: float = 0.0) -> None:
        """``stopped_dead_sec``: how long an adopted subprocess may stay stopped before it is a death
        (0 = never)."""
        self._launcher = launcher
        self._stopped_dead_sec = stopped_dead_sec
        self._engines: dict[int, _Incarnation] = {}
        self._counter = 0

    def launch(self, command: EngineCommand) -> int:
        """Start an engine; its incarnation number. A running incarnation must be stopped first."""
        current = self._engines.get(command.endpoint_id)
        if current is not None and current.exited is None and not current.stopping:
            raise RuntimeError(f"engine {command.endpoint_id} is already running (pid {current.handle.pid})")
        self._counter += 1
        handle = self._launcher.launch(command)
        self._engines[command.endpoint_id] = _Incarnation(
            number=self._counter, handle=handle, identity=handle.identity()
        )
        _log.info("engine.launched", endpoint_id=command.endpoint_id, pid=handle.pid, argv=list(command.argv))
        return self._counter

    def mark_ready(self, endpoint_id: int) -> None:
        """The engine answered ``/health`` 200 for the first time: adopt its subprocesses now."""
        inc = self._engines.get(endpoint_id)
        if inc is None or inc.ready:
            return
        inc.ready = True
        inc.adopted = inc.handle.descendants()
        _log.info("engine.ready", endpoint_id=endpoint_id, pid=inc.handle.pid, subprocesses=sorted(inc.adopted))

    def check(self, *, now: float = 0.0) -> list[EngineExit]:
        """New engine deaths since the last call (each incarnation reports at most once).

        ``now`` (monotonic seconds) times how long a subprocess has stayed stopped."""
        found = []
        for endpoint_id, inc in self._engines.items():
            if inc.exited is not None or inc.stopping:
                continue
            code = inc.handle.exit_code()
            detail = None
            if code is not None:
                detail = f"API server (pid {inc.handle.pid}) exited with code {code}"
            else:
                gone = sorted(pid for pid in inc.adopted if inc.handle.is_gone(pid))
                if gone and (code := inc.handle.exit_code()) is not None:
                    # the API server died first and took its subprocesses with it (they die with their
                    # parent): it became a zombie between the two reads
                    detail = f"API server (pid {inc.handle.pid}) exited with code {code}"
                elif gone and self._still_exiting(inc, now=now):
                    continue  # the same death, still being torn down: reported with its exit code next time
                elif gone:
                    detail = f"engine subprocess(es) {gone} of API server {inc.handle.pid} exited"
                else:
                    detail = self._stopped_too_long(inc, now=now)
            if detail is None:
                continue
            inc.exited = EngineExit(
                endpoint_id=endpoint_id, incarnation=inc.number, detail=detail, exit_code=code, identity=inc.identity
            )
            found.append(inc.exited)
        return found

    @staticmethod
    def _still_exiting(inc: _Incarnation, *, now: float) -> bool:
        """The API server is in the kernel's exit path (not yet a zombie), for at most ``_EXIT_SETTLE_SEC``."""
        if not inc.handle.is_exiting():
            return False
        if inc.exiting_since is None:
            inc.exiting_since = now
        return now - inc.exiting_since < _EXIT_SETTLE_SEC

    def _stopped_too_long(self, inc: _Incarnation, *, now: float) -> str | None:
        """A death when an adopted subprocess has been stopped ``stopped_dead_sec``; its session is killed."""
        if self._stopped_dead_sec <= 0:
            return None
        if inc.handle.is_stopped(inc.handle.pid):
            # the whole engine is stopped (a frozen pod, a SIGSTOP of its session): a stall of its status route
            # too, judged by the poller's unreachability rule and withdrawn when the same engine answers again
            inc.stopped_since = {}
            return None
        stopped = {pid for pid in inc.adopted if inc.handle.is_stopped(pid)}
        inc.stopped_since = {pid: inc.stopped_since.get(pid, now) for pid in stopped}  # a resumed one starts over
        hung = sorted(pid for pid, since in inc.stopped_since.items() if now - since >= self._stopped_dead_sec)
        if not hung:
            return None
        inc.handle.signal_session(signal.SIGKILL)  # no wait: the next check and stop() reap it
        _log.warning("engine.stopped_killed", pid=inc.handle.pid, stopped=hung, after_sec=self._stopped_dead_sec)
        return (
            f"engine subprocess(es) {hung} of API server {inc.handle.pid} stopped for "
            f"{self._stopped_dead_sec:g} s (the DP group cannot step without them): engine killed"
        )

    def stop(self, endpoint_id: int, *, grace_sec: float) -> bool:
        """Stop an engine on purpose (no death report): SIGTERM, then SIGKILL after ``grace_sec``."""
        inc = self._engines.get(endpoint_id)
        if inc is None:
            return False
        inc.stopping = True
        if grace_sec > 0 and inc.handle.exit_code() is None:
            inc.handle.signal_session(signal.SIGTERM)
            if inc.handle.wait(grace_sec):
                inc.handle.signal_session(signal.SIGKILL)  # its subprocesses, if any outlived it
                return True
        inc.handle.signal_session(signal.SIGKILL)
        inc.handle.wait(10.0)
        return True

    def fence(self, endpoint_id: int) -> bool:
        """SIGKILL an engine's whole session now (F-51, F-53); whether there was one running."""
        inc = self._engines.get(endpoint_id)
        if inc is None or inc.stopping:
            return False
        was_running = inc.exited is None or inc.handle.exit_code() is None
        inc.stopping = True
        inc.handle.signal_session(signal.SIGKILL)
        inc.handle.wait(10.0)
        _log.warning("engine.fenced", endpoint_id=endpoint_id, pid=inc.handle.pid)
        return was_running

    def running(self, endpoint_id: int) -> bool:
        inc = self._engines.get(endpoint_id)
        return inc is not None and inc.exited is None and not inc.stopping

    def ready(self, endpoint_id: int) -> bool:
        inc = self._engines.get(endpoint_id)
        return inc is not None and inc.ready and inc.exited is None and not inc.stopping

    def incarnation(self, endpoint_id: int) -> int | None:
        inc = self._engines.get(endpoint_id)
        return None if inc is None else inc.number

    def identity(self, endpoint_id: int) -> EngineIdentity | None:
        inc = self._engines.get(endpoint_id)
        return None if inc is None else inc.identity

    def pids(self) -> dict[int, int]:
        return {eid: inc.handle.pid for eid, inc in self._engines.items()}

    def stop_all(self, *, grace_sec: float) -> list[int]:
        return [eid for eid in sorted(self._engines) if self.stop(eid, grace_sec=grace_sec)]


# == the real implementation ================================================================================
def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # after ')': state(0), ppid(1), pgrp(2), session(3) … starttime(19)


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0  # pragma: no cover - every Linux has btime


def process_identity(pid: int) -> EngineIdentity | None:
    """pid + start time (seconds since the epoch), so that a reused pid is never mistaken for the engine."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    ticks = int(fields[19])
    return EngineIdentity(pid=pid, start_time=round(_boot_time() + ticks / os.sysconf("SC_CLK_TCK"), 2))


def _children(pid: int) -> list[int]:
    found: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def descendants_of(pid: int) -> frozenset[int]:
    """Live (non-zombie) descendants of ``pid`` (Linux ``/proc/<pid>/task/*/children``)."""
    seen: set[int] = set()
    queue = _children(pid)
    while queue:
        child = queue.pop()
        if child in seen:
            continue
        fields = _stat_fields(child)
        if fields is None or fields[0] == "Z":
            continue
        seen.add(child)
        queue += _children(child)
    return frozenset(seen)


def pid_gone(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


def pid_stopped(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


_PF_EXITING = 0x4  # include/linux/sched.h: set from the first step of do_exit()


def pid_exiting(pid: int) -> bool:
    """Whether ``pid`` is in the kernel's exit path (``PF_EXITING`` in ``/proc/<pid>/stat``'s flags)."""
    fields = _stat_fields(pid)
    return fields is not None and (fields[0] in ("Z", "X") or bool(int(fields[6]) & _PF_EXITING))


class PopenHandle:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._identity = process_identity(proc.pid)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def exit_code(self) -> int | None:
        return self._proc.poll()

    def descendants(self) -> frozenset[int]:
        return descendants_of(self._proc.pid)

    def is_gone(self, pid: int) -> bool:
        return pid_gone(pid)

    def is_stopped(self, pid: int) -> bool:
        return pid_stopped(pid)

    def is_exiting(self) -> bool:
        return pid_exiting(self._proc.pid)

    def identity(self) -> EngineIdentity | None:
        return self._identity

    def signal_session(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def wait(self, timeout: float) -> bool:
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


_PR_SET_PDEATHSIG = 1


def _die_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when this process dies, however it dies.

    The libc function is resolved here, in the parent, so the child only makes one system call between fork
    and exec. The kernel ties the signal to the forking *thread*: engines are launched from the event loop's
    thread, which lives as long as the process. ``None`` where ``prctl`` does not exist (not Linux).
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_death_signal() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the NodeManager died before the request took effect
            os._exit(1)

    return set_death_signal


class PopenLauncher:
    """Starts each engine in its own session (so it can be killed whole) with the command's environment.

    The kernel SIGKILLs the engine's API server when the NodeManager dies (the simulator's worker then dies
    with its API server: it has a death signal of its own).
    """

    def __init__(self, *, log_dir: Path | None = None, base_env: dict[str, str] | None = None) -> None:
        self._log_dir = log_dir
        self._base_env = dict(os.environ if base_env is None else base_env)

    def launch(self, command: EngineCommand) -> ProcessHandle:
        env = {**self._base_env, **dict(command.env), "PYTHONUNBUFFERED": "1"}
        log: IO[bytes] | int = subprocess.DEVNULL
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            log = (self._log_dir / f"engine-{command.endpoint_id}.log").open("ab")
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv built from the instance spec, no shell
                list(command.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_this_process(),  # only a prctl call: nothing that takes a lock
            )
        finally:
            if not isinstance(log, int):
                log.close()
        return PopenHandle(proc)


def session_processes(pids: Sequence[int]) -> dict[int, list[int]]:
    """Live processes of each session led by ``pids`` (for teardown checks)."""
    found: dict[int, list[int]] = {pid: [] for pid in pids}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or fields[0] == "Z":
            continue
        session = int(fields[3])
        if session in found:
            found[session].append(int(entry.name))
    return {pid: procs for pid, procs in found.items() if procs}
