"""In-process fake of the worker side: the same protocol, no processes, no torch.

A :class:`FakeGroup` stands for the gloo group of one instance and is shared by the
:class:`FakeWorkerBackend` of every rank. It keeps the semantics that the control plane depends on:

- a forward step (one per request here) is a collective over every member: if a member's worker is dead,
  hung or has dropped the group, every live member of that group fails its collective (``unhealthy``);
- an idle group notices nothing (the RFC's idle row);
- a rebuild completes only when every member of the new group has joined with the same plan, and then
  for all of them at once (unanimous); expert capacity is checked with the real placement code;
- time (rebuild timeouts, slow rebuilds) comes from the injected clock, checked at :meth:`tick`.

Events are delivered with ``loop.call_soon`` so that the engine core never re-enters itself.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field

from heteroflow.contracts.engine_protocol import checkin_failure_text
from heteroflow.core.clock import Clock
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
    WorkerEvent,
    WorkerExited,
)
from heteroflow.engine_sim.placement import (
    ExpertPlacement,
    InsufficientExpertSlotsError,
    initial_placement,
    remove_ranks,
)
from heteroflow.engine_sim.state import RebuildPlan
from heteroflow.engine_sim.vocab import VOCAB_SIZE

FAKE_ELASTIC_EP_TEXT = "the in-memory worker backend does not simulate an elastic EP resize"
FAULT_CLASS = "RuntimeError"
"""What gloo raises on a closed connection or a timeout, and so what the real simulator reports."""


def fake_tokens(prompt_tokens: tuple[int, ...], max_tokens: int, *, seed: int) -> list[int]:
    """A deterministic greedy continuation: a function of the prompt only, never of the membership."""
    digest = hashlib.sha256(f"{seed}:{prompt_tokens}".encode()).digest()
    state = int.from_bytes(digest[:8], "big")
    out = []
    for _ in range(max_tokens):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((state >> 33) % VOCAB_SIZE)
    return out


@dataclass
class _Member:
    backend: FakeWorkerBackend
    alive: bool = True
    hung: bool = False
    group_id: str = "init"
    faulted: bool = False
    slow_rebuild_sec: float = 0.0


@dataclass
class _Join:
    plan: RebuildPlan
    ready_at: float


@dataclass
class _Round:
    started: float
    joins: dict[int, _Join] = field(default_factory=dict)


class FakeGroup:
    """The shared 'process group' of a fake instance (see the module docstring)."""

    def __init__(
        self,
        *,
        dp_size: int,
        clock: Clock,
        num_experts: int,
        num_redundant_experts: int,
        slots_per_rank: int,
        rebuild_timeout_sec: float,
        seed: int = 1234,
    ) -> None:
        self.dp_size = dp_size
        self.clock = clock
        self.seed = seed
        self.rebuild_timeout_sec = rebuild_timeout_sec
        self._members: dict[int, _Member] = {}
        self._groups: dict[str, tuple[int, ...]] = {"init": tuple(range(dp_size))}
        placement = initial_placement(
            dp_size=dp_size,
            num_experts=num_experts,
            num_redundant_experts=num_redundant_experts,
            slots_per_rank=slots_per_rank,
        )
        self._placements: dict[str, ExpertPlacement] = {"init": placement}
        self._rounds: dict[str, _Round] = {}

    # -- membership ------------------------------------------------------------------------------------
    def attach(self, rank: int, backend: FakeWorkerBackend) -> Ready:
        self._members[rank] = _Member(backend=backend)
        return Ready(worker_pid=None, placement=self._placements["init"].describe())

    def member(self, rank: int) -> _Member:
        return self._members[rank]

    def _usable(self, rank: int, group_id: str) -> bool:
        m = self._members.get(rank)
        return m is not None and m.alive and not m.hung and not m.faulted and m.group_id == group_id

    def _fault_group(self, group_id: str, detail: str) -> None:
        members = self._groups[group_id]
        mask = tuple(1 if r in members else 0 for r in range(self.dp_size))
        for r in members:
            m = self._members.get(r)
            if m is None or not m.alive or m.hung or m.faulted or m.group_id != group_id:
                continue
            m.faulted = True
            m.backend.emit(CollectiveFailed(fault_info=FAULT_CLASS, mask=mask, detail=detail))

    # -- traffic ---------------------------------------------------------------------------------------
    def step(self, rank: int) -> bool:
        """One forward step started by ``rank``: True when every member took part."""
        me = self._members[rank]
        if not me.alive or me.hung or me.faulted:
            return False
        members = self._groups[me.group_id]
        if all(self._usable(r, me.group_id) for r in members):
            return True
        self._fault_group(me.group_id, "a peer left the collective (connection closed or timed out)")
        return False

    def transient(self, rank: int) -> None:
        me = self._members[rank]
        if me.alive and not me.faulted:
            self._fault_group(me.group_id, "transient collective failure injected")

    def resume(self, rank: int) -> None:
        me = self._members[rank]
        me.hung = False
        if any(not self._usable(r, me.group_id) for r in self._groups[me.group_id] if r != rank):
            self._fault_group(me.group_id, "peers gave up on this rank while it was stopped")

    def kill(self, rank: int) -> None:
        self._members[rank].alive = False

    # -- rebuild ---------------------------------------------------------------------------------------
    def join(self, rank: int, plan: RebuildPlan) -> None:
        me = self._members[rank]
        now = self.clock.monotonic()
        rnd = self._rounds.setdefault(plan.request_id, _Round(started=now))
        rnd.joins[rank] = _Join(plan=plan, ready_at=now + me.slow_rebuild_sec)
        me.slow_rebuild_sec = 0.0
        self.poll()

    def poll(self) -> None:
        now = self.clock.monotonic()
        for request_id, rnd in list(self._rounds.items()):
            outcome = self._outcome(rnd, now)
            if outcome is None:
                continue
            del self._rounds[request_id]
            ok, error, placement = outcome
            checkin_failed = not ok and error is not None and error.startswith("[FT] Not all engines joined")
            for rank, join in rnd.joins.items():
                m = self._members[rank]
                if not m.alive:
                    continue
                if ok and placement is not None:
                    self._groups[request_id] = join.plan.members
                    self._placements[request_id] = placement
                    m.group_id = request_id
                    m.faulted = False
                m.backend.emit(
                    RebuildFinished(
                        request_id=request_id,
                        ok=ok,
                        error=error,
                        placement=placement.describe() if ok and placement is not None else None,
                        checkin_failed=checkin_failed,
                    )
                )

    def _outcome(self, rnd: _Round, now: float) -> tuple[bool, str | None, ExpertPlacement | None] | None:
        plans = [join.plan for join in rnd.joins.values()]
        first = plans[0]
        checkin = first.checkin_timeout_sec
        if checkin is not None and now - rnd.started >= checkin:
            arrived = {r for r, j in rnd.joins.items() if j.ready_at - rnd.started < checkin}
            if arrived != set(first.members):  # vLLM 0.34: not every survivor got the round's id within 10 s
                return False, checkin_failure_text(first.request_id, checkin), None
        if now - rnd.started >= self.rebuild_timeout_sec:
            return False, "rebuild timed out waiting for peers", None
        if set(rnd.joins) != set(first.members) or any(now < j.ready_at for j in rnd.joins.values()):
            return None
        if any(not self._members[r].alive or self._members[r].hung for r in rnd.joins):
            return None  # a member stopped mid-rebuild: the others run into the timeout, as in gloo
        if len({p.digest for p in plans}) != 1:
            return False, "survivors disagree on the round (members or dead set differ)", None
        previous = self._placements[self._members[first.members[0]].group_id]
        if first.instruction == "retry":
            return True, None, previous
        try:
            return True, None, remove_ranks(previous, first.newly_removed & set(previous.ranks))
        except InsufficientExpertSlotsError as exc:
            return False, str(exc), None


class FakeWorkerBackend:
    """One rank's fake worker (implements :class:`~heteroflow.engine_sim.backend.WorkerBackend`)."""

    def __init__(self, *, rank: int, group: FakeGroup) -> None:
        self.rank = rank
        self.group = group
        self._sink: EventSink | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: set[str] = set()

    async def start(self, sink: EventSink) -> Ready:
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        return self.group.attach(self.rank, self)

    def emit(self, event: WorkerEvent) -> None:
        if self._sink is not None and self._loop is not None:
            self._loop.call_soon(self._sink, event)

    def submit(self, job: GenerationJob) -> None:
        self._jobs.add(job.request_id)
        if not self.group.step(self.rank):
            return  # the collective failed (or never returns, when hung); the core aborts the request
        tokens = fake_tokens(job.prompt_tokens, job.max_tokens, seed=self.group.seed)
        loop = self._loop
        if loop is None:
            return

        def emit_from(index: int) -> None:
            me = self.group.member(self.rank)
            if job.request_id not in self._jobs or not me.alive or me.faulted or self._sink is None:
                return
            if index == len(tokens):
                self._jobs.discard(job.request_id)
                self._sink(JobFinished(job.request_id, "length"))
                return
            self._sink(TokenGenerated(job.request_id, tokens[index]))
            loop.call_soon(emit_from, index + 1)

        loop.call_soon(emit_from, 0)

    def cancel(self, request_id: str) -> None:
        self._jobs.discard(request_id)

    def cancel_all(self) -> None:
        self._jobs.clear()

    def rebuild(self, plan: RebuildPlan) -> None:
        self.group.join(self.rank, plan)

    def inject(self, kind: FaultKind, *, delay_sec: float = 0.0) -> None:
        me = self.group.member(self.rank)
        match kind:
            case FaultKind.KILL_WORKER | FaultKind.KILL_PROCESS:
                self.kill()
            case FaultKind.HANG:
                me.hung = True
            case FaultKind.RESUME:
                self.group.resume(self.rank)
            case FaultKind.TRANSIENT:
                self.group.transient(self.rank)
            case FaultKind.SLOW_REBUILD:
                me.slow_rebuild_sec = delay_sec

    def elastic_prepare(self, request: ElasticPrepare) -> None:
        """The in-memory group has no TCP store to meet new ranks in: every resize fails its prepare (the real
        one runs in :mod:`heteroflow.engine_sim.worker`)."""
        self.emit(ElasticPrepared(epoch=request.epoch, ok=False, error=FAKE_ELASTIC_EP_TEXT))

    def elastic_commit(self, *, timeout_sec: float) -> None:
        _ = timeout_sec
        self.emit(ElasticCommitted(ok=False, error=FAKE_ELASTIC_EP_TEXT))

    def kill(self) -> None:
        if self.group.member(self.rank).alive:
            self.group.kill(self.rank)
            self._jobs.clear()
            self.emit(WorkerExited(reason="worker killed (fault injection)"))

    def tick(self, now: float) -> None:
        _ = now
        self.group.poll()

    def info(self) -> dict[str, object]:
        return {"backend": "fake", "worker_pid": None}

    async def close(self) -> None:
        self._jobs.clear()
