"""One rank's side of an elastic EP resize (``EngineCore.scale_elastic_ep``) over a scripted worker backend: the
serving gate, the pause (``"wait"`` on a remaining rank, ``"abort"`` on a retiring one), a failed commit, a
timeout, the serialisation of requests on one API server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from heteroflow.core.testing import FakeClock
from heteroflow.engine_sim import state as sm
from heteroflow.engine_sim.backend import (
    ElasticCommitted,
    ElasticPrepare,
    ElasticPrepared,
    EventSink,
    FaultKind,
    GenerationJob,
    JobFinished,
    Ready,
    TokenGenerated,
    WorkerExited,
    WorkerGoneError,
)
from heteroflow.engine_sim.elastic import ElasticEpConfig
from heteroflow.engine_sim.engine import (
    ElasticEpFailedError,
    EngineCore,
    EngineTimeouts,
    RequestAbortedError,
)
from heteroflow.engine_sim.state import RebuildPlan


class ScriptedBackend:
    """A worker backend whose answers the test gives: it records what the engine core asked for."""

    def __init__(self) -> None:
        self.sink: EventSink | None = None
        self.prepares: list[ElasticPrepare] = []
        self.commits = 0
        self.jobs: list[GenerationJob] = []
        self.cancelled_all = 0
        self.gone = False
        """The worker's input is closed: an elastic command cannot reach it (the process backend raises)."""

    async def start(self, sink: EventSink) -> Ready:
        self.sink = sink
        return Ready(worker_pid=None, placement={})

    def emit(self, event: object) -> None:
        assert self.sink is not None
        self.sink(event)  # type: ignore[arg-type]

    def submit(self, job: GenerationJob) -> None:
        self.jobs.append(job)

    def cancel(self, request_id: str) -> None:
        _ = request_id

    def cancel_all(self) -> None:
        self.cancelled_all += 1

    def rebuild(self, plan: RebuildPlan) -> None:
        raise AssertionError(f"no FT rebuild expected: {plan}")

    def inject(self, kind: FaultKind, *, delay_sec: float = 0.0) -> None:
        _ = kind, delay_sec

    def elastic_prepare(self, request: ElasticPrepare) -> None:
        if self.gone:
            raise WorkerGoneError("the worker has exited: the prepare cannot reach it")
        self.prepares.append(request)

    def elastic_commit(self, *, timeout_sec: float) -> None:
        _ = timeout_sec
        self.commits += 1

    def tick(self, now: float) -> None:
        _ = now

    def info(self) -> dict[str, object]:
        return {}

    async def close(self) -> None:
        return None


async def _core(*, rank: int, dp_size: int) -> tuple[EngineCore, ScriptedBackend]:
    backend = ScriptedBackend()
    core = EngineCore(
        initial=sm.initial_state(rank=rank, dp_size=dp_size),
        backend=backend,
        clock=FakeClock(),
        timeouts=EngineTimeouts(),
        hard_exit=lambda: None,
        elastic=ElasticEpConfig(num_experts=4, num_redundant_experts=4, max_dp_size=4),
    )
    await core.start()
    return core, backend


async def _until(check: Callable[[], bool]) -> None:
    """Let the loop run until ``check`` holds (every step is a scheduled callback: no clock involved)."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("the engine core never got there")


async def _consume(core: EngineCore) -> list[int]:
    return [token async for token in core.generate(prompt_tokens=(1, 2), max_tokens=4)]


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_a_remaining_rank_lets_running_requests_finish_before_it_commits() -> None:
    async def scenario() -> None:
        core, backend = await _core(rank=1, dp_size=2)
        request = asyncio.create_task(_consume(core))
        await _until(lambda: len(backend.jobs) == 1)
        scale = asyncio.create_task(core.scale_elastic_ep(3))
        await _until(lambda: len(backend.prepares) == 1)
        prepare = backend.prepares[0]
        assert (prepare.epoch, prepare.cur, prepare.new, prepare.num_redundant_experts, prepare.slots_per_rank) == (
            None,  # only rank 0 makes the epoch
            2,
            3,
            8,
            4,
        )
        assert core.elastic_status().phase == "preparing"
        assert not core.elastic_scaling  # the gate closes only once prepared
        backend.emit(ElasticPrepared(epoch="e" * 32, ok=True))
        await _until(lambda: core.elastic_scaling)
        for _ in range(20):
            await asyncio.sleep(0)
        assert backend.commits == 0  # pause mode "wait": the running request first
        rid = backend.jobs[0].request_id
        for token in (5, 6, 7, 8):
            backend.emit(TokenGenerated(request_id=rid, token=token))
        backend.emit(JobFinished(request_id=rid, finish_reason="length"))
        assert await request == [5, 6, 7, 8]
        await _until(lambda: backend.commits == 1)
        assert core.elastic_status().phase == "committing"
        backend.emit(ElasticCommitted(ok=True, placement={"0": [0], "1": [1], "2": [2]}))
        await scale
        status = core.elastic_status()
        assert (status.phase, status.epoch, status.requested_data_parallel_size, status.error) == (
            "completed",
            "e" * 32,
            3,
            None,
        )
        assert not core.elastic_scaling
        assert (core.state.dp_size, core.state.ft_world) == (3, 2)
        assert core.info()["num_redundant_experts"] == 8

    run(scenario)


def test_a_retiring_rank_aborts_its_requests_and_stays_retired() -> None:
    async def scenario() -> None:
        core, backend = await _core(rank=2, dp_size=3)
        request = asyncio.create_task(_consume(core))
        await _until(lambda: len(backend.jobs) == 1)
        scale = asyncio.create_task(core.scale_elastic_ep(2))
        await _until(lambda: len(backend.prepares) == 1)
        backend.emit(ElasticPrepared(epoch="f" * 32, ok=True))
        with pytest.raises(RequestAbortedError):
            await request
        assert core.elastic_retired
        await _until(lambda: backend.commits == 1)
        backend.emit(ElasticCommitted(ok=True, retired=True))
        await scale
        assert core.elastic_retired  # for good: the orchestrator removes the process
        assert core.elastic_status().phase == "completed"

    run(scenario)


def test_a_failed_commit_leaves_the_gate_closed_and_the_rank_not_retired() -> None:
    async def scenario() -> None:
        core, backend = await _core(rank=2, dp_size=3)
        scale = asyncio.create_task(core.scale_elastic_ep(2))
        await _until(lambda: len(backend.prepares) == 1)
        backend.emit(ElasticPrepared(epoch="a" * 32, ok=True))
        await _until(lambda: backend.commits == 1)
        backend.emit(
            ElasticCommitted(ok=False, error="Timed out waiting for external Elastic EP drains.", timed_out=True)
        )
        with pytest.raises(TimeoutError):
            await scale
        assert core.elastic_scaling  # async_llm.py L1376-1382: only a successful commit reopens
        assert not core.elastic_retired
        status = core.elastic_status()
        assert (status.phase, status.error) == ("failed", "Timed out waiting for external Elastic EP drains.")
        assert core.state.dp_size == 3

    run(scenario)


def test_a_failed_prepare_never_closes_the_gate() -> None:
    async def scenario() -> None:
        core, backend = await _core(rank=0, dp_size=2)
        scale = asyncio.create_task(core.scale_elastic_ep(3))
        await _until(lambda: len(backend.prepares) == 1)
        epoch = backend.prepares[0].epoch
        assert epoch is not None
        assert len(epoch) == 32
        assert core.elastic_status().epoch == epoch
        backend.emit(ElasticPrepared(epoch=epoch, ok=False, error="boom"))
        with pytest.raises(ElasticEpFailedError):
            await scale
        assert not core.elastic_scaling
        assert core.elastic_status().phase == "failed"
        assert backend.commits == 0

    run(scenario)


def test_requests_on_one_api_server_are_serialised_and_the_current_size_returns_at_once() -> None:
    async def scenario() -> None:
        core, backend = await _core(rank=1, dp_size=2)
        await core.scale_elastic_ep(2)  # no prepare, no epoch
        assert backend.prepares == []
        first = asyncio.create_task(core.scale_elastic_ep(3))
        second = asyncio.create_task(core.scale_elastic_ep(3))
        await _until(lambda: len(backend.prepares) == 1)
        backend.emit(ElasticPrepared(epoch="b" * 32, ok=True))
        await _until(lambda: backend.commits == 1)
        backend.emit(ElasticCommitted(ok=True))
        await first
        await second  # behind the lock: the size is 3 by now, so it returns at once
        assert len(backend.prepares) == 1
        assert core.state.dp_size == 3

    run(scenario)


def test_a_scale_on_a_rank_whose_worker_died_fails_at_once_and_frees_the_next_request() -> None:
    async def scenario() -> None:
        core, backend = await _core(rank=1, dp_size=2)
        backend.emit(WorkerExited(reason="worker exited with code -9"))
        assert core.state.health == "dead"
        for _ in range(2):  # the lock is released: the second request is not stuck behind the first
            with pytest.raises(ElasticEpFailedError, match="the engine cannot resize"):
                await core.scale_elastic_ep(3)
        assert backend.prepares == []  # never sent to a worker that cannot answer
        status = core.elastic_status()
        assert (status.phase, status.is_scaling_elastic_ep, status.requested_data_parallel_size) == ("failed", False, 3)
        assert status.error is not None
        assert "(it is dead)" in status.error
        assert not core.elastic_scaling

    run(scenario)


def test_a_prepare_that_cannot_reach_the_worker_fails_at_once() -> None:
    async def scenario() -> None:
        core, backend = await _core(rank=0, dp_size=2)
        backend.gone = True  # exited, its exit event not read yet: the engine still looks healthy
        assert core.state.serving
        with pytest.raises(ElasticEpFailedError, match="cannot reach"):
            await core.scale_elastic_ep(3)
        status = core.elastic_status()
        assert (status.phase, status.error) == ("failed", "the worker has exited: the prepare cannot reach it")
        assert status.epoch is not None  # rank 0 made one before it tried
        assert not core.elastic_scaling

    run(scenario)
