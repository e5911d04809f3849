"""The real worker backend: a torch worker subprocess spoken to in JSON lines (API-server side, no torch)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from heteroflow.engine_sim.backend import (
    CollectiveFailed,
    ElasticCommitted,
    ElasticPrepare,
    ElasticPrepared,
    EventSink,
    FaultKind,
    GenerationJob,
    JobFinished,
    Ready,
    RebuildFinished,
    TokenGenerated,
    WaveChanged,
    WorkerEvent,
    WorkerExited,
    WorkerGoneError,
    WorkerStartError,
)
from heteroflow.engine_sim.state import RebuildPlan

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """Everything the worker needs; serialised to JSON on its command line (no secrets in it)."""

    rank: int
    dp_size: int
    master_addr: str
    master_port: int
    bind_host: str
    num_experts: int
    num_redundant_experts: int
    slots_per_rank: int
    collective_timeout_sec: float
    startup_timeout_sec: float
    rebuild_timeout_sec: float
    seed: int
    max_batch: int
    idle_poll_interval_sec: float
    scale_up_launch: bool = False
    """Launched to join an elastic EP scale-up (vLLM env ``VLLM_ELASTIC_EP_SCALE_UP_LAUNCH=1``): the worker waits
    for rank 0's bootstrap instead of forming the launch group."""
    handshake_timeout_sec: float = 300.0
    """How long a scale-up-launched worker waits for that bootstrap (vLLM ``HANDSHAKE_TIMEOUT_MINS = 5``)."""


def plan_to_wire(plan: RebuildPlan) -> dict[str, Any]:
    return {
        "request_id": plan.request_id,
        "instruction": plan.instruction,
        "members": list(plan.members),
        "newly_removed": sorted(plan.newly_removed),
        "dead_ranks": sorted(plan.dead_ranks),
        "new_store": None if plan.new_store is None else {"host": plan.new_store.host, "port": plan.new_store.port},
        "digest": plan.digest,
        "checkin_timeout_sec": plan.checkin_timeout_sec,
    }


def event_from_wire(raw: dict[str, Any]) -> WorkerEvent | None:
    """A worker event from its JSON line; ``None`` for lines this version does not know."""
    match raw.get("ev"):
        case "token":
            return TokenGenerated(request_id=str(raw["rid"]), token=int(raw["token"]))
        case "done":
            return JobFinished(request_id=str(raw["rid"]), finish_reason=str(raw["finish_reason"]))
        case "fault":
            return CollectiveFailed(
                fault_info=str(raw["fault_info"]),
                mask=tuple(int(v) for v in raw["mask"]),
                detail=str(raw.get("detail", "")),
            )
        case "rebuilt":
            return RebuildFinished(
                request_id=str(raw["request_id"]),
                ok=bool(raw["ok"]),
                error=raw.get("error"),
                placement=raw.get("placement"),
                checkin_failed=bool(raw.get("checkin_failed", False)),
            )
        case "ready":
            redundant = raw.get("num_redundant_experts")
            return Ready(
                worker_pid=int(raw["pid"]),
                placement=raw["placement"],
                num_redundant_experts=None if redundant is None else int(redundant),
            )
        case "eep_prepared":
            return ElasticPrepared(
                epoch=raw.get("epoch"),
                ok=bool(raw["ok"]),
                error=raw.get("error"),
                timed_out=bool(raw.get("timed_out", False)),
            )
        case "eep_committed":
            return ElasticCommitted(
                ok=bool(raw["ok"]),
                retired=bool(raw.get("retired", False)),
                placement=raw.get("placement"),
                error=raw.get("error"),
                timed_out=bool(raw.get("timed_out", False)),
            )
        case "wave":
            return WaveChanged(active=bool(raw["active"]))
    return None


class ProcessWorkerBackend:
    """Implements :class:`~heteroflow.engine_sim.backend.WorkerBackend` with a worker subprocess."""

    def __init__(self, launch: WorkerLaunch, *, startup_timeout_sec: float, python: str = sys.executable) -> None:
        self._launch = launch
        self._startup_timeout = startup_timeout_sec
        self._python = python
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._sink: EventSink | None = None
        self._placement: dict[str, list[int]] = {}
        self._hung = False

    @property
    def worker_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self, sink: EventSink) -> Ready:
        self._sink = sink
        self._proc = await asyncio.create_subprocess_exec(
            self._python,
            "-m",
            "heteroflow.engine_sim.worker",
            json.dumps(asdict(self._launch)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,
        )
        try:
            ready = await asyncio.wait_for(self._await_ready(), timeout=self._startup_timeout + 30)
        except (TimeoutError, WorkerStartError):
            await self.close()
            raise
        self._placement = ready.placement
        self._reader = asyncio.create_task(self._read_events(), name="engine-sim-worker-reader")
        return ready

    async def _await_ready(self) -> Ready:
        proc = self._proc
        if proc is None or proc.stdout is None:
            raise WorkerStartError("worker not started")
        while True:
            line = await proc.stdout.readline()
            if not line:
                code = await proc.wait()
                raise WorkerStartError(f"worker exited during start-up with code {code}")
            try:
                raw = json.loads(line)
            except ValueError:
                _log.warning("engine.worker_bad_line", line=line[:200])
                continue
            if raw.get("ev") == "fatal":
                raise WorkerStartError(f"worker could not start: {raw.get('error')}")
            event = event_from_wire(raw)
            if isinstance(event, Ready):
                return event

    async def _read_events(self) -> None:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            try:
                event = event_from_wire(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                _log.warning("engine.worker_bad_line", error=str(exc), line=line[:200])
                continue
            if isinstance(event, RebuildFinished | ElasticCommitted) and event.ok and event.placement is not None:
                self._placement = event.placement
            if event is not None and self._sink is not None:
                self._sink(event)
        code = await proc.wait()
        if self._sink is not None:
            self._sink(WorkerExited(reason=f"worker exited with code {code}"))

    def _send(self, command: dict[str, Any]) -> bool:
        """Write one command; False when the worker is gone (the command is dropped)."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None or proc.stdin.is_closing():
            return False
        # buffered by the transport: never blocks the event loop, even while the worker is stopped
        proc.stdin.write((json.dumps(command, separators=(",", ":")) + "\n").encode())
        return True

    def submit(self, job: GenerationJob) -> None:
        self._send(
            {"op": "submit", "rid": job.request_id, "tokens": list(job.prompt_tokens), "max_tokens": job.max_tokens}
        )

    def cancel(self, request_id: str) -> None:
        self._send({"op": "cancel", "rid": request_id})

    def cancel_all(self) -> None:
        self._send({"op": "cancel_all"})

    def rebuild(self, plan: RebuildPlan) -> None:
        self._send({"op": "rebuild", "plan": plan_to_wire(plan)})

    def elastic_prepare(self, request: ElasticPrepare) -> None:
        if not self._send({"op": "eep_prepare", **asdict(request)}):
            raise WorkerGoneError("the worker has exited: the prepare cannot reach it")

    def elastic_commit(self, *, timeout_sec: float) -> None:
        if not self._send({"op": "eep_commit", "timeout_sec": timeout_sec}):
            raise WorkerGoneError("the worker has exited: the commit cannot reach it")

    def _signal(self, sig: signal.Signals) -> None:
        pid = self.worker_pid
        if pid is not None and self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def inject(self, kind: FaultKind, *, delay_sec: float = 0.0) -> None:
        match kind:
            case FaultKind.KILL_WORKER | FaultKind.KILL_PROCESS:
                self._signal(signal.SIGKILL)
            case FaultKind.HANG:
                self._hung = True
                self._signal(signal.SIGSTOP)
            case FaultKind.RESUME:
                self._hung = False
                self._signal(signal.SIGCONT)
            case FaultKind.TRANSIENT:
                self._send({"op": "transient"})
            case FaultKind.SLOW_REBUILD:
                self._send({"op": "slow_rebuild", "delay_sec": delay_sec})

    def tick(self, now: float) -> None:
        _ = now

    def info(self) -> dict[str, object]:
        return {"backend": "process", "worker_pid": self.worker_pid, "api_pid": os.getpid(), "hung": self._hung}

    async def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            self._signal(signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
