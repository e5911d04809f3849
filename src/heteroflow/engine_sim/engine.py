"""The engine core: the thin shell around the pure FT state machine, shared by the real and fake engine.

It owns the current :class:`~heteroflow.engine_sim.state.EngineState`, feeds it the worker's events and
the clock, performs the resulting actions (abort requests, start a rebuild, exit) and keeps the in-flight
generations. It imports neither torch nor a web framework; the HTTP layer is
:mod:`heteroflow.engine_sim.assembly` (routers in :mod:`heteroflow.engine_sim.routes`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import structlog

from heteroflow.contracts.engine_protocol import ApplyRequest, ElasticEpStatus, FtStatusResponse
from heteroflow.core.clock import Clock
from heteroflow.engine_sim import state as sm
from heteroflow.engine_sim.backend import (
    CollectiveFailed,
    ElasticCommitted,
    ElasticPrepare,
    ElasticPrepared,
    FaultKind,
    GenerationJob,
    JobFinished,
    Ready,
    RebuildFinished,
    TokenGenerated,
    WaveChanged,
    WorkerBackend,
    WorkerEvent,
    WorkerExited,
    WorkerGoneError,
)
from heteroflow.engine_sim.elastic import ElasticEpConfig, plan_resize

_log = structlog.get_logger(__name__)


class EngineUnavailableError(RuntimeError):
    """The engine is not healthy: new requests get HTTP 503."""


class RequestAbortedError(RuntimeError):
    """An in-flight request was aborted because the engine stopped being healthy."""


class ElasticEpFailedError(RuntimeError):
    """An elastic EP resize failed on this rank for another reason than a timeout: HTTP 500 "Scale failed"."""


RETIRED_ABORT_REASON = "the data-parallel rank was retired by an elastic EP scale-down"


@dataclass(frozen=True, slots=True)
class EngineTimeouts:
    engine_recovery_timeout_sec: float = 120.0
    exit_linger_sec: float = 5.0
    diagnosing_sec: float = 1.0
    """vLLM 0.34: how long a faulted engine reports ``diagnosing`` before ``unhealthy``."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    accepted: bool
    message: str


@dataclass(frozen=True, slots=True)
class EngineCoreStatus:
    """A snapshot for tests and the sim-only info route."""

    state: sm.EngineState
    in_flight: int
    completed: int
    aborted: int
    placement: dict[str, list[int]]
    exit_reason: str | None
    commands_accepted: int
    commands_rejected: int
    faults_seen: int
    in_wave: bool
    """The worker is stepping in lockstep with its peers (False = idle: no collective running)."""


@dataclass(frozen=True, slots=True)
class _Abort:
    reason: str


_DONE = object()


class EngineCore:
    def __init__(
        self,
        *,
        initial: sm.EngineState,
        backend: WorkerBackend,
        clock: Clock,
        timeouts: EngineTimeouts,
        hard_exit: Callable[[], None],
        elastic: ElasticEpConfig | None = None,
    ) -> None:
        """``elastic``: the rank takes part in elastic EP resizes (``--enable-elastic-ep``)."""
        self._state = initial
        self._backend = backend
        self._clock = clock
        self._timeouts = timeouts
        self._hard_exit = hard_exit
        self._requests: dict[str, asyncio.Queue[object]] = {}
        self._placement: dict[str, list[int]] = {}
        self._completed = 0
        self._aborted = 0
        self._commands_accepted = 0
        self._commands_rejected = 0
        self._faults_seen = 0
        self._in_wave = False
        self._exit_at: float | None = None
        self._exit_reason: str | None = None
        self._exit_code = 0
        self.exit_requested = asyncio.Event()
        self._elastic = elastic
        self._num_redundant_experts = None if elastic is None else elastic.num_redundant_experts
        self._elastic_lock = asyncio.Lock()
        self._elastic_status = ElasticEpStatus(phase="idle")
        self._elastic_waiter: asyncio.Future[ElasticPrepared | ElasticCommitted] | None = None
        self._no_requests = asyncio.Event()
        self._no_requests.set()
        self.elastic_scaling = False
        """vLLM's process-local ``_scaling_elastic_ep`` (``middleware.py`` L12): set once a prepare succeeded,
        cleared by a successful commit only (a failed commit leaves it set, ``async_llm.py`` L1376-1382)."""
        self.elastic_retired = False
        """vLLM's ``_elastic_ep_rank_retired`` (``middleware.py`` L13): this rank left the world for good."""

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> Ready:
        ready = await self._backend.start(self._on_event)
        self._placement = ready.placement
        if ready.num_redundant_experts is not None and self._num_redundant_experts is not None:
            self._num_redundant_experts = ready.num_redundant_experts
        return ready

    async def close(self) -> None:
        await self._backend.close()

    @property
    def state(self) -> sm.EngineState:
        return self._state

    @property
    def exit_code(self) -> int:
        return self._exit_code

    @property
    def exiting(self) -> bool:
        """The engine decided to exit (the process goes within ``exit_linger_sec``)."""
        return self._exit_at is not None

    def status(self) -> EngineCoreStatus:
        return EngineCoreStatus(
            state=self._state,
            in_flight=len(self._requests),
            completed=self._completed,
            aborted=self._aborted,
            placement=self._placement,
            exit_reason=self._exit_reason,
            commands_accepted=self._commands_accepted,
            commands_rejected=self._commands_rejected,
            faults_seen=self._faults_seen,
            in_wave=self._in_wave,
        )

    def ft_status(self) -> FtStatusResponse:
        return FtStatusResponse(total_engines=1, engines=[self._state.status_entry()])

    def info(self) -> dict[str, object]:
        st = self._state
        return {
            "dp_rank": st.rank,
            "dp_size": st.dp_size,
            "members": list(st.members),
            "dead_ranks": sorted(st.dead_ranks),
            "store_master": st.store_master,
            "generation": st.generation,
            "ft_dp_size": st.ft_world,
            "num_redundant_experts": self._num_redundant_experts,
            "placement": self._placement,
            "in_wave": self._in_wave,
            "elastic_ep_retired": self.elastic_retired,
            **self._backend.info(),
        }

    # -- time ------------------------------------------------------------------------------------------
    def tick(self) -> None:
        now = self._clock.monotonic()
        self._backend.tick(now)
        self._apply(sm.on_tick(self._state, now=now))
        if self._exit_at is not None and now >= self._exit_at and not self.exit_requested.is_set():
            _log.warning("engine.exit", reason=self._exit_reason, rank=self._state.rank)
            self.exit_requested.set()

    # -- commands --------------------------------------------------------------------------------------
    def apply(self, request: ApplyRequest) -> CommandResult:
        transition = sm.on_command(self._state, request)
        _log.info(
            "engine.ft_command",
            rank=self._state.rank,
            request_id=request.request_id,
            instruction=request.instruction,
            accepted=transition.accepted,
            detail=transition.message,
        )
        if transition.accepted:
            self._commands_accepted += 1
        else:
            self._commands_rejected += 1
        self._apply(transition)
        return CommandResult(accepted=transition.accepted, message=transition.message)

    def inject(self, kind: FaultKind, *, delay_sec: float = 0.0) -> None:
        _log.warning("engine.fault_injected", rank=self._state.rank, kind=kind.value, delay_sec=delay_sec)
        if kind is FaultKind.KILL_PROCESS:
            self._hard_exit()
            return
        self._backend.inject(kind, delay_sec=delay_sec)

    # -- generation ------------------------------------------------------------------------------------
    async def generate(self, *, prompt_tokens: tuple[int, ...], max_tokens: int) -> AsyncIterator[int]:
        """Token ids of a greedy generation; raises at once when not healthy, or mid-way when aborted."""
        if not self._state.serving:
            raise EngineUnavailableError(self._unavailable_reason())
        request_id = uuid.uuid4().hex
        queue: asyncio.Queue[object] = asyncio.Queue()
        self._requests[request_id] = queue
        self._no_requests.clear()
        self._backend.submit(GenerationJob(request_id, prompt_tokens, max_tokens))
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, int):
                    yield item
                elif item is _DONE:
                    finished = True
                    return
                elif isinstance(item, _Abort):
                    finished = True
                    raise RequestAbortedError(item.reason)
        finally:
            self._requests.pop(request_id, None)
            if not self._requests:
                self._no_requests.set()
            if not finished:
                self._backend.cancel(request_id)

    def _unavailable_reason(self) -> str:
        st = self._state
        if st.profile.faulted_text is not None:
            return st.profile.faulted_text
        if st.running is not None:
            return f"engine is recovering ({st.running.instruction} {st.running.request_id})"
        return f"engine is {st.health}"

    # -- elastic EP ------------------------------------------------------------------------------------
    def elastic_status(self) -> ElasticEpStatus:
        """The last resize this rank took part in (vLLM reads it from the shared store: the same on every
        rank; here each rank reports its own part)."""
        return self._elastic_status

    async def scale_elastic_ep(self, new_dp_size: int) -> None:
        """vLLM 0.34's ``AsyncLLM.scale_elastic_ep`` on one external-LB rank (``v1/engine/async_llm.py``
        L1316-1383): serialised per API server; the current size returns at once; prepare; then the serving gate,
        the pause (``"wait"``: running requests finish; ``"abort"`` on a retiring rank) and the commit.

        Raises :class:`~heteroflow.engine_sim.elastic.ElasticEpRefusal` (400), ``TimeoutError`` (408) or
        :class:`ElasticEpFailedError` (500); the failure is also in :meth:`elastic_status`."""
        if self._elastic is None:
            raise ElasticEpFailedError("Elastic EP scaling requires enable_elastic_ep=True.")
        async with self._elastic_lock:
            await self._scale(self._elastic, new_dp_size)

    async def _scale(self, config: ElasticEpConfig, new: int) -> None:
        cur = self._state.dp_size
        if new == cur:
            return
        rank = self._state.rank
        redundant = config.num_redundant_experts if self._num_redundant_experts is None else self._num_redundant_experts
        resize = plan_resize(
            rank=rank,
            cur=cur,
            new=new,
            num_experts=config.num_experts,
            num_redundant_experts=redundant,
            max_dp_size=config.max_dp_size,
        )
        epoch = uuid.uuid4().hex if rank == 0 else None
        self._elastic_status = ElasticEpStatus(
            is_scaling_elastic_ep=True, phase="preparing", epoch=epoch, requested_data_parallel_size=new
        )
        prepared = await self._elastic_call(
            lambda: self._backend.elastic_prepare(
                ElasticPrepare(
                    epoch=epoch,
                    cur=cur,
                    new=new,
                    num_redundant_experts=resize.num_redundant_experts,
                    slots_per_rank=resize.slots_per_rank,
                    timeout_sec=config.prepare_timeout_sec,
                )
            )
        )
        epoch = prepared.epoch if isinstance(prepared, ElasticPrepared) and prepared.epoch else epoch
        self._fail_unless_ok(prepared, epoch=epoch, new=new)
        self._elastic_status = ElasticEpStatus(  # not a repeat: a rank other than 0 learns the epoch from prepare
            is_scaling_elastic_ep=True, phase="preparing", epoch=epoch, requested_data_parallel_size=new
        )
        self.elastic_scaling = True
        if resize.retires:
            self.elastic_retired = True
            self._abort_all(RETIRED_ABORT_REASON)  # pause mode "abort" (external_elastic_ep.py L803-806)
        else:
            await self._no_requests.wait()  # pause mode "wait": running requests finish (core_client.py L1692-1701)
        self._elastic_status = ElasticEpStatus(
            is_scaling_elastic_ep=True, phase="committing", epoch=epoch, requested_data_parallel_size=new
        )
        try:
            committed = await self._elastic_call(
                lambda: self._backend.elastic_commit(timeout_sec=config.commit_timeout_sec)
            )
            self._fail_unless_ok(committed, epoch=epoch, new=new)
        except BaseException:
            self.elastic_retired = False  # the serving gate stays: a failed commit may leave the engine paused
            raise
        if isinstance(committed, ElasticCommitted) and committed.placement is not None:
            self._placement = committed.placement
        self._num_redundant_experts = resize.num_redundant_experts
        self._apply(sm.on_elastic_resized(self._state, new_dp_size=new))
        self._elastic_status = ElasticEpStatus(phase="completed", epoch=epoch, requested_data_parallel_size=new)
        _log.info("engine.elastic_ep_resized", rank=rank, cur=cur, new=new, retired=resize.retires)
        self.elastic_scaling = False

    async def _elastic_call(self, send: Callable[[], None]) -> ElasticPrepared | ElasticCommitted:
        """Send one resize step and wait for its outcome. Fails at once, like vLLM's call to a dead engine core,
        when the engine is not serving (a dead worker, a fault) or the command cannot reach the worker."""
        waiter: asyncio.Future[ElasticPrepared | ElasticCommitted] = asyncio.get_running_loop().create_future()
        self._elastic_waiter = waiter
        try:
            if not self._state.serving:
                raise ElasticEpFailedError(
                    f"the engine cannot resize (it is {self._state.health}): {self._unavailable_reason()}"
                )
            try:
                send()
            except WorkerGoneError as exc:
                raise ElasticEpFailedError(str(exc)) from exc
            return await waiter
        except ElasticEpFailedError as exc:
            _log.warning("engine.elastic_ep_failed", rank=self._state.rank, error=str(exc), timed_out=False)
            self._elastic_status = ElasticEpStatus(
                phase="failed",
                epoch=self._elastic_status.epoch,
                error=str(exc),
                requested_data_parallel_size=self._elastic_status.requested_data_parallel_size,
            )
            raise
        finally:
            self._elastic_waiter = None

    def _fail_unless_ok(self, outcome: ElasticPrepared | ElasticCommitted, *, epoch: str | None, new: int) -> None:
        if outcome.ok:
            return
        error = outcome.error or "External Elastic EP scaling failed."
        self._elastic_status = ElasticEpStatus(
            phase="failed", epoch=epoch, error=error, requested_data_parallel_size=new
        )
        _log.warning("engine.elastic_ep_failed", rank=self._state.rank, error=error, timed_out=outcome.timed_out)
        if outcome.timed_out:
            raise TimeoutError(error)
        raise ElasticEpFailedError(error)

    # -- events ----------------------------------------------------------------------------------------
    def _on_event(self, event: WorkerEvent) -> None:
        now = self._clock.monotonic()
        recovery = self._timeouts.engine_recovery_timeout_sec
        match event:
            case TokenGenerated(request_id=rid, token=token):
                queue = self._requests.get(rid)
                if queue is not None:
                    queue.put_nowait(token)
            case JobFinished(request_id=rid):
                queue = self._requests.get(rid)
                if queue is not None:
                    self._completed += 1
                    queue.put_nowait(_DONE)
            case CollectiveFailed(fault_info=info, mask=mask, detail=detail):
                self._in_wave = False
                _log.warning("engine.collective_failed", rank=self._state.rank, fault_info=info, detail=detail)
                self._faults_seen += 1
                self._apply(
                    sm.on_collective_fault(
                        self._state,
                        fault_info=info,
                        mask=mask,
                        now=now,
                        recovery_timeout=recovery,
                        diagnosing_sec=self._timeouts.diagnosing_sec,
                    )
                )
            case ElasticPrepared() | ElasticCommitted():
                waiter = self._elastic_waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(event)
            case WorkerExited(reason=reason):
                self._in_wave = False
                waiter = self._elastic_waiter
                if waiter is not None and not waiter.done():
                    waiter.set_exception(ElasticEpFailedError(f"worker exited: {reason}"))
                _log.warning("engine.worker_exited", rank=self._state.rank, reason=reason)
                self._apply(sm.on_worker_died(self._state, reason=reason, now=now, recovery_timeout=recovery))
            case RebuildFinished(request_id=rid, ok=ok, error=error, placement=placement, checkin_failed=checkin):
                running = self._state.running
                if running is None or running.request_id != rid:
                    _log.warning("engine.stale_rebuild_result", rank=self._state.rank, request_id=rid)
                    return
                _log.info("engine.rebuild_finished", rank=self._state.rank, request_id=rid, ok=ok, error=error)
                if ok and placement is not None:
                    self._placement = placement
                self._apply(
                    sm.on_rebuild_finished(
                        self._state,
                        request_id=rid,
                        ok=ok,
                        error=error,
                        now=now,
                        recovery_timeout=recovery,
                        checkin_failed=checkin,
                    )
                )
            case Ready(placement=placement):
                self._placement = placement
            case WaveChanged(active=active):
                self._in_wave = active

    def _apply(self, transition: sm.Transition) -> None:
        self._state = transition.state
        for action in transition.actions:
            match action:
                case sm.AbortRequests(reason=reason):
                    self._abort_all(reason)
                case sm.StartRebuild(plan=plan):
                    self._backend.rebuild(plan)
                case sm.ExitProcess(reason=reason, exit_code=code):
                    terminal = self._state.health == "dead" and self._state.ft_state == "failed"
                    # released vLLM: the engine core dies first, /health answers 503 for ~2 s, then the API
                    # server exits
                    linger = self._timeouts.exit_linger_sec if terminal or self._state.profile.dead_health_503 else 0.0
                    self._exit_reason = reason
                    self._exit_code = code
                    self._exit_at = self._clock.monotonic() + linger

    def _abort_all(self, reason: str) -> None:
        self._backend.cancel_all()
        for queue in self._requests.values():
            self._aborted += 1
            queue.put_nowait(_Abort(reason))
