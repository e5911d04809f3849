"""The seam between the API server's engine core and the worker that holds the model shard.

Two implementations: :class:`heteroflow.engine_sim.process_backend.ProcessWorkerBackend` (a torch worker
subprocess in a real gloo group) and :class:`heteroflow.engine_sim.fake.FakeWorkerBackend` (in-memory, no
processes, no torch). The backend reports what happens through :class:`WorkerEvent` values handed to a
sink; it never decides protocol states, which is the job of :mod:`heteroflow.engine_sim.state`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from heteroflow.engine_sim.state import RebuildPlan


class FaultKind(StrEnum):
    """Faults that the simulator can inject (route ``POST /sim/faults`` or signals)."""

    KILL_WORKER = "kill_worker"
    """The rank's worker exits hard: this rank ``dead``; peers notice under traffic."""
    KILL_PROCESS = "kill_process"
    """The whole rank (API server and worker) exits hard: status unreachable."""
    HANG = "hang"
    """SIGSTOP the worker: peers time out in their next collective; ``resume`` sends SIGCONT."""
    RESUME = "resume"
    TRANSIENT = "transient"
    """Every rank of the group fails its collective at once, nobody dies; ``retry`` recovers."""
    SLOW_REBUILD = "slow_rebuild"
    """The next rebuild of this rank waits ``delay_sec`` before joining its peers."""


@dataclass(frozen=True, slots=True)
class GenerationJob:
    request_id: str
    prompt_tokens: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Ready:
    worker_pid: int | None
    placement: dict[str, list[int]]
    num_redundant_experts: int | None = None
    """The redundancy the worker started with; a scale-up-launched rank takes it from rank 0's bootstrap."""


@dataclass(frozen=True, slots=True)
class TokenGenerated:
    request_id: str
    token: int


@dataclass(frozen=True, slots=True)
class JobFinished:
    request_id: str
    finish_reason: str


@dataclass(frozen=True, slots=True)
class CollectiveFailed:
    fault_info: str
    """The exception class name, as vLLM reports it."""
    mask: tuple[int, ...]
    detail: str


@dataclass(frozen=True, slots=True)
class WaveChanged:
    """The worker entered (``active``) or left a wave of lockstep forward steps."""

    active: bool


@dataclass(frozen=True, slots=True)
class WorkerExited:
    reason: str


@dataclass(frozen=True, slots=True)
class RebuildFinished:
    request_id: str
    ok: bool
    error: str | None
    placement: dict[str, list[int]] | None
    checkin_failed: bool = False
    """Not every member joined the round within its check-in: failed before any vote (retryable)."""


@dataclass(frozen=True, slots=True)
class ElasticPrepare:
    """Prepare an elastic EP resize (:class:`~heteroflow.engine_sim.elastic.Resize`) in the worker's group."""

    epoch: str | None
    """Rank 0 publishes this epoch; ``None`` on the other ranks, which wait for rank 0's."""
    cur: int
    new: int
    num_redundant_experts: int
    slots_per_rank: int
    timeout_sec: float
    """The ready barrier's and the bootstrap wait's deadline (vLLM: 300 s)."""


@dataclass(frozen=True, slots=True)
class ElasticPrepared:
    """The outcome of a prepare: every rank of ``range(new)`` got ready, or ``error``."""

    epoch: str | None
    ok: bool
    error: str | None = None
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class ElasticCommitted:
    """The outcome of a commit: the worker switched to the new group (or left it: ``retired``), or ``error``."""

    ok: bool
    retired: bool = False
    placement: dict[str, list[int]] | None = None
    error: str | None = None
    timed_out: bool = False


WorkerEvent = (
    Ready
    | TokenGenerated
    | JobFinished
    | CollectiveFailed
    | WorkerExited
    | RebuildFinished
    | WaveChanged
    | ElasticPrepared
    | ElasticCommitted
)
EventSink = Callable[[WorkerEvent], None]


class WorkerStartError(RuntimeError):
    """The worker could not join its first group (a peer never came, a port was taken, …)."""


class WorkerGoneError(RuntimeError):
    """The worker cannot take the command: it has exited (or its input is closed)."""


class WorkerBackend(Protocol):
    async def start(self, sink: EventSink) -> Ready:
        """Launch the worker and wait until it has joined the first group."""
        ...

    def submit(self, job: GenerationJob) -> None:
        """Queue a generation; tokens come back as events."""
        ...

    def cancel(self, request_id: str) -> None: ...

    def cancel_all(self) -> None: ...

    def rebuild(self, plan: RebuildPlan) -> None:
        """Start the rebuild of an accepted command; the outcome comes back as :class:`RebuildFinished`."""
        ...

    def inject(self, kind: FaultKind, *, delay_sec: float = 0.0) -> None: ...

    def elastic_prepare(self, request: ElasticPrepare) -> None:
        """Start preparing an elastic EP resize; the outcome comes back as :class:`ElasticPrepared`.

        Raises :class:`WorkerGoneError` when the command cannot reach the worker (no outcome would come)."""
        ...

    def elastic_commit(self, *, timeout_sec: float) -> None:
        """Commit the prepared resize once every old rank is ready to (``timeout_sec``: vLLM's 600 s); the
        outcome comes back as :class:`ElasticCommitted`; :class:`WorkerGoneError` as for :meth:`elastic_prepare`."""
        ...

    def tick(self, now: float) -> None:
        """Time passed (monotonic seconds); a backend with timers of its own checks them here."""
        ...

    def info(self) -> dict[str, object]:
        """Diagnostics for the sim-only info route (process ids, placement)."""
        ...

    async def close(self) -> None:
        """Stop the worker (idempotent)."""
        ...
