"""vLLM 0.34's external-LB elastic EP on real simulator ranks (torch gloo on loopback): a 2-rank world grows to 3
with a rank launched for the scale-up and shrinks back; the FT size frozen at launch; the ready barrier's
timeout. Each test starts its own 2-rank world (plus the launched rank) and kills it at the end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from heteroflow.engine_sim import v034_conformance
from heteroflow.engine_sim.testing import SimProcessCluster, session_pids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# greedy outputs of conformance.PROMPTS for the default seed (1234) and 4 experts + 4 redundant, whatever the
# data-parallel size (test_sim_cluster.py's GOLDEN)
GOLDEN = ["aed,a3t3t3t3", "a-3ea!-t!?de", "vl02d,levmuh", ",v'a3m-3,3,2", "g,uyy4dn\ne:m"]


@pytest.fixture
def elastic_world(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SimProcessCluster]:
    options: dict[str, object] = getattr(request, "param", {})
    cluster = SimProcessCluster(
        dp_size=2,
        log_dir=tmp_path / "logs",
        enable_elastic_ep=True,
        elastic_ep_max_dp_size=3,
        diagnosing_sec=0.5,
        **options,  # type: ignore[arg-type]
    )
    try:
        cluster.start()
        yield cluster
    finally:
        pids = cluster.pids()
        cluster.close()
        leftovers = {rank: session_pids(pid) for rank, pid in pids.items() if session_pids(pid)}
        assert leftovers == {}, f"processes left behind: {leftovers}"


def test_a_world_grows_with_a_launched_rank_and_shrinks_back(elastic_world: SimProcessCluster) -> None:
    async def scenario() -> dict[str, object]:
        try:
            seen = await v034_conformance.v034_elastic_ep_grow(elastic_world, GOLDEN)
            await v034_conformance.v034_elastic_ep_shrink(elastic_world, GOLDEN)
            return seen
        finally:
            await elastic_world.aclose_clients()

    seen = asyncio.run(scenario())
    status = seen["status"]
    assert isinstance(status, dict)
    assert status["phase"] == "completed"


def test_after_a_scale_up_the_old_ranks_ft_refuses_a_rank_outside_its_launch_size(
    elastic_world: SimProcessCluster,
) -> None:
    async def scenario() -> None:
        try:
            await v034_conformance.v034_elastic_ep_grow(elastic_world, GOLDEN)
            await v034_conformance.v034_elastic_ep_ft_after_grow(elastic_world)
        finally:
            await elastic_world.aclose_clients()

    asyncio.run(scenario())


@pytest.mark.parametrize("elastic_world", [{"elastic_ep_prepare_timeout_sec": 2.0}], indirect=True)
def test_a_scale_up_whose_rank_never_comes_times_out_and_the_old_world_serves_on(
    elastic_world: SimProcessCluster,
) -> None:
    async def scenario() -> None:
        try:
            await v034_conformance.v034_elastic_ep_prepare_timeout(elastic_world, GOLDEN)
        finally:
            await elastic_world.aclose_clients()

    asyncio.run(scenario())


# the launched rank needs a few seconds to start: the ready barrier must outlast that
@pytest.mark.parametrize("elastic_world", [{"elastic_ep_prepare_timeout_sec": 25.0}], indirect=True)
def test_a_rank_launched_outside_the_new_ranks_fails_the_scale_up(elastic_world: SimProcessCluster) -> None:
    async def scenario() -> None:
        try:
            await v034_conformance.v034_elastic_ep_unexpected_rank(elastic_world)
        finally:
            await elastic_world.aclose_clients()

    asyncio.run(scenario())


# rank 2 is up before the request: the ready barrier's 5 s leave it time to get ready while rank 0 waits
@pytest.mark.parametrize("elastic_world", [{"elastic_ep_prepare_timeout_sec": 5.0}], indirect=True)
def test_after_an_ft_scale_down_a_scale_up_waits_for_the_removed_rank_and_times_out(
    elastic_world: SimProcessCluster,
) -> None:
    async def scenario() -> None:
        try:
            await v034_conformance.v034_elastic_ep_after_ft_scale_down(elastic_world)
        finally:
            await elastic_world.aclose_clients()

    asyncio.run(scenario())
