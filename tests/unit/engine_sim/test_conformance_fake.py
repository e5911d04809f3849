"""The conformance suite against the in-process fake engine (the same suite runs against real processes)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import pytest

from heteroflow.engine_sim import conformance, v034_conformance
from heteroflow.engine_sim.placement import PlacementError
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


def test_a_smaller_contiguous_world_after_a_lost_rank_serves_and_scales_down_again() -> None:
    """Rank 0 of 4 (4 experts + 4 redundant, 2 slots per rank) is lost: the survivors relaunch as 3 ranks with
    the same 2 slots each, 3 x 2 - 4 = 2 redundant experts; the same outputs, and a second loss scales down."""
    seen: list[list[str]] = []

    async def before(h: FakeEngineCluster) -> None:
        seen.append(await conformance.outputs(h, 0))

    run(before, dp_size=4, num_experts=4, num_redundant_experts=4)
    run(
        lambda h: v034_conformance.v034_smaller_world(h, seen[0]),
        dp_size=3,
        num_experts=4,
        num_redundant_experts=2,
        slots_per_rank=2,
    )


@pytest.mark.parametrize(
    ("layout", "refusal"),
    [
        (
            {"dp_size": 3, "num_experts": 4, "num_redundant_experts": 4},
            "EPLB currently only supports even distribution of experts across ranks. Got 8 experts and 3 EP ranks.",
        ),
        ({"dp_size": 1, "num_experts": 4, "num_redundant_experts": -2}, "Input should be greater than or equal to 0"),
        ({"dp_size": 3, "num_experts": 4, "num_redundant_experts": 2, "slots_per_rank": 3}, "--slots-per-rank 3"),
    ],
)
def test_an_expert_layout_vllm_refuses_does_not_start(layout: dict[str, int], refusal: str) -> None:
    with pytest.raises(PlacementError, match=re.escape(refusal)):
        FakeEngineCluster(**layout)  # type: ignore[arg-type]
