"""The conformance suite against the in-process fake engine (the same suite runs against real processes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.testing import FakeEngineCluster


def run(scenario: Callable[[FakeEngineCluster], Awaitable[object]], **cluster_args: object) -> None:
    async def main() -> None:
        cluster = FakeEngineCluster(**cluster_args)  # type: ignore[arg-type]
        await cluster.start()
        try:
            await scenario(cluster)
        finally:
            await cluster.close()

    asyncio.run(main())


def test_healthy_contract() -> None:
    run(lambda h: conformance.healthy_contract(h, range(4)))


def test_apply_validation() -> None:
    run(lambda h: conformance.apply_validation(h, 1))


def test_transient_fault_then_retry_recovers_every_rank() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        baseline = await conformance.outputs(h, 0)
        await conformance.transient_retry(h, range(4), baseline, slow_rank=2)

    run(scenario)


def test_scale_down_chain() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        baseline = await conformance.outputs(h, 0)
        await conformance.scale_down_chain(h, baseline)

    run(scenario)


def test_master_relocation_round_after_round() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        await conformance.master_relocation(h, await conformance.outputs(h, 0))

    run(scenario)


def test_idle_survivors_stay_healthy() -> None:
    run(lambda h: conformance.idle_kill(h, 3, [0, 1, 2]))


def test_hung_worker_makes_busy_survivors_unhealthy() -> None:
    run(lambda h: conformance.hang_detected(h, 2, [0, 1, 3]))


def test_relaunch_with_dead_ranks_keeps_original_ids() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        await conformance.healthy_contract(h, [1, 2, 3])
        info = await conformance.sim_info(h, 2)
        assert info["store_master"] == 1
        assert info["members"] == [1, 2, 3]
        assert info["dead_ranks"] == [0]

    run(scenario, dead_ranks=frozenset({0}))
