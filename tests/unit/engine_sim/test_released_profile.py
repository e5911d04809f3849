"""The simulator in profile ``vllm-released`` against the observed list of ``engine-protocol.md``.

The same checks (``released_conformance.released_*``) run against two real vLLM ranks in ``tests/vllm``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx

from heteroflow.engine_sim import conformance, released_conformance
from heteroflow.engine_sim.testing import FakeEngineCluster


class FakeReleased:
    """:class:`released_conformance.ReleasedHarness` over the in-process fake cluster."""

    def __init__(self, cluster: FakeEngineCluster) -> None:
        self.cluster = cluster
        self.dp_size = cluster.dp_size

    def client(self, rank: int) -> httpx.AsyncClient:
        return self.cluster.client(rank)

    async def eventually(self, check: Callable[[], Awaitable[bool]], *, within: float, what: str) -> None:
        await self.cluster.eventually(check, within=within, what=what)

    async def kill_worker(self, rank: int) -> None:
        await conformance.wait_idle(self.cluster, range(self.dp_size))  # the last request's wave has ended
        self.cluster.kill_worker(rank)


PUMP_SEC = 0.05
"""Engine seconds the fake clock moves per real 10 ms while a scenario awaits a request (autojump)."""


def run(scenario: Callable[[FakeReleased], Awaitable[object]], **cluster_args: object) -> None:
    async def main() -> None:
        cluster = FakeEngineCluster(dp_size=2, profile_name="vllm-0.32", **cluster_args)  # type: ignore[arg-type]
        await cluster.start()

        async def pump() -> None:
            # a request awaited by the scenario needs engine time to pass (a peer's loss is seen at a step)
            while True:
                await asyncio.sleep(0.01)
                cluster.clock.advance(PUMP_SEC)
                cluster.tick()

        pumping = asyncio.create_task(pump())
        try:
            await scenario(FakeReleased(cluster))
        finally:
            pumping.cancel()
            await cluster.close()

    asyncio.run(main())


def test_routes_and_error_bodies_are_vllms() -> None:
    run(lambda h: released_conformance.released_routes_and_errors(h, 0))


def test_retry_on_a_healthy_engine_gets_the_engines_own_id_and_a_rejection() -> None:
    run(lambda h: released_conformance.released_rejection_on_healthy(h, 1))


def test_fault_dead_abort_hang_and_failed_retry() -> None:
    async def scenario(h: FakeReleased) -> None:
        figures = await released_conformance.released_fault(h, victim=1, survivor=0, hang_probe_sec=0.5)
        assert set(figures) == {"dead_after", "retry_failed_after"}

    run(scenario, rebuild_timeout_sec=5.0)


def test_the_next_push_drops_the_outcome_and_the_timer_runs_from_the_fault() -> None:
    async def scenario(h: FakeReleased) -> None:
        cluster = h.cluster
        engine_id = await released_conformance.released_rejection_on_healthy(h, 0)
        assert (await released_conformance.released_status(h, 0))["last_ft_request_id"] == engine_id
        await h.kill_worker(1)
        await released_conformance.released_completion(h, 0)

        async def pushed() -> bool:
            entry = await released_conformance.released_status(h, 0)
            return bool(entry["status"] == "unhealthy")

        await cluster.eventually(pushed, within=30, what="rank 0 unhealthy")
        entry = await released_conformance.released_status(h, 0)
        assert not {"last_ft_request_id", "ft_error"} & set(entry), entry
        deadline = cluster.cores[0].state.recovery_deadline
        assert deadline is not None
        resp = await released_conformance.released_apply(h, 0, b'{"instruction": "retry"}')
        assert resp.status_code == 202
        await cluster.settle()
        assert cluster.cores[0].state.recovery_deadline == deadline  # an accepted retry does not restart it

    run(scenario, rebuild_timeout_sec=5.0)


def test_ft_routes_stay_open_while_openai_routes_need_the_key() -> None:
    async def scenario(h: FakeReleased) -> None:
        resp = await h.client(0).post("/v1/completions", json={"prompt": "x"}, headers=released_conformance.WRONG_KEY)
        assert resp.status_code == 401
        assert (await released_conformance.released_status(h, 0))["status"] == "healthy"

    run(scenario)


def test_at_the_recovery_timeout_health_answers_503_before_the_process_goes() -> None:
    async def scenario(h: FakeReleased) -> None:
        cluster = h.cluster
        await h.kill_worker(1)

        async def exiting() -> bool:
            return cluster.cores[1].exiting

        await cluster.eventually(exiting, within=30, what="rank 1 decides to exit at its recovery timeout")
        assert not cluster.is_gone(1)
        assert (await h.client(1).get("/health")).status_code == 503
        assert (await released_conformance.released_status(h, 1))["status"] == "dead"  # the stale entry still answers

        async def gone() -> bool:
            return cluster.is_gone(1)

        await cluster.eventually(gone, within=10, what="rank 1's process exits after the linger")

    run(scenario, engine_recovery_timeout_sec=10.0, exit_linger_sec=2.0)
