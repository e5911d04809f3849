"""vLLM 0.34's elastic EP decisions: the resize plan, the request body, the FT size kept apart, the serving gate."""

from __future__ import annotations

import asyncio

import pytest

from heteroflow.contracts.engine_protocol import (
    ELASTIC_EP_RETIRED_TEXT,
    ELASTIC_EP_SCALING_TEXT,
    ApplyParams,
    ApplyRequest,
    ElasticEpStatus,
    ProtocolError,
    elastic_ep_drain_timeout_text,
    parse_scale_elastic_ep,
)
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim import state as sm
from heteroflow.engine_sim.elastic import ElasticEpRefusal, launched_ranks, plan_resize, redundant_experts_after
from heteroflow.engine_sim.settings import Topology
from heteroflow.engine_sim.state import ConfigurationError
from heteroflow.engine_sim.testing import FakeEngineCluster


def test_physical_experts_per_rank_stay_fixed_across_a_resize() -> None:
    # (E + R) * new // cur - E, external_elastic_ep.py L253-255
    assert redundant_experts_after(num_experts=4, num_redundant_experts=4, cur=2, new=3) == 8
    assert redundant_experts_after(num_experts=4, num_redundant_experts=8, cur=3, new=2) == 4
    assert redundant_experts_after(num_experts=8, num_redundant_experts=4, cur=4, new=3) == 1


def test_a_target_that_cannot_hold_every_expert_is_refused_with_vllms_text() -> None:
    with pytest.raises(ElasticEpRefusal) as refused:
        redundant_experts_after(num_experts=8, num_redundant_experts=0, cur=4, new=3)
    assert str(refused.value) == (
        "Cannot scale external Elastic EP from DP size 4 to 3: the target topology cannot retain all model experts."
    )


def test_the_max_size_is_checked_before_the_experts() -> None:
    with pytest.raises(ElasticEpRefusal) as refused:
        plan_resize(rank=0, cur=4, new=9, num_experts=8, num_redundant_experts=0, max_dp_size=8)
    assert str(refused.value) == "Cannot scale to data_parallel_size 9; --elastic-ep-max-dp-size is 8."


def test_a_scale_up_admits_only_the_new_ranks_and_a_scale_down_retires_the_top_ones() -> None:
    up = plan_resize(rank=1, cur=2, new=4, num_experts=4, num_redundant_experts=4, max_dp_size=4)
    assert (up.scale_up, up.retires, up.slots_per_rank, up.num_redundant_experts) == (True, False, 4, 12)
    assert launched_ranks(cur=2, new=4) == range(2, 4)
    down = [plan_resize(rank=r, cur=4, new=2, num_experts=4, num_redundant_experts=4, max_dp_size=4) for r in range(4)]
    assert [p.retires for p in down] == [False, False, True, True]
    with pytest.raises(ValueError, match="no resize"):
        plan_resize(rank=0, cur=2, new=2, num_experts=4, num_redundant_experts=4, max_dp_size=2)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "new_data_parallel_size is required"),
        ({"new_data_parallel_size": None}, "new_data_parallel_size is required"),
        ({"new_data_parallel_size": -1}, "new_data_parallel_size must be a positive integer"),
        ({"new_data_parallel_size": 2.0}, "new_data_parallel_size must be a positive integer"),
        ({"new_data_parallel_size": True}, "new_data_parallel_size must be a positive integer"),
        ({"new_data_parallel_size": 2, "drain_timeout": "5"}, "drain_timeout must be a positive integer"),
        ({"new_data_parallel_size": 2, "drain_timeout": -5}, "drain_timeout must be a positive integer"),
        ("x", "Request body must be a JSON object."),
    ],
)
def test_the_scale_body_is_judged_in_vllms_order_with_its_texts(body: object, message: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_scale_elastic_ep(body)
    assert str(refused.value) == message


def test_the_drain_timeout_defaults_to_120_and_names_the_408() -> None:
    assert parse_scale_elastic_ep({"new_data_parallel_size": 3}) == (3, 120)
    assert elastic_ep_drain_timeout_text(120) == "Scale failed due to request drain timeout after 120 seconds"


def test_the_status_model_parses_vllms_body_and_a_bare_phase() -> None:
    body = {
        "is_scaling_elastic_ep": True,
        "phase": "committing",
        "epoch": "0123456789abcdef0123456789abcdef",
        "error": None,
        "requested_data_parallel_size": 3,
    }
    assert ElasticEpStatus.model_validate(body).model_dump() == body
    assert ElasticEpStatus.model_validate({"phase": "idle"}).epoch is None


def test_the_max_size_below_the_launch_size_is_refused_at_start_with_vllms_text() -> None:
    with pytest.raises(ConfigurationError) as refused:
        Topology(dp_size=4, dp_rank=0, master_addr="h", master_port=1, elastic_ep_max_dp_size=3).validate()
    assert str(refused.value) == (
        "--elastic-ep-max-dp-size must be greater than or equal to the initial data_parallel_size (4)."
    )
    Topology(dp_size=4, dp_rank=0, master_addr="h", master_port=1, elastic_ep_max_dp_size=6).validate()


def test_a_scale_up_launched_rank_takes_its_layout_from_rank_0() -> None:
    # 4 + 4 experts do not divide over 3 ranks: a plain launch is refused, a scale-up launch is not (rank 0's
    # bootstrap carries the recalculated redundancy)
    with pytest.raises(ConfigurationError, match="Got 8 experts and 3 EP ranks"):
        Topology(dp_size=3, dp_rank=2, master_addr="h", master_port=1, num_experts=4).validate()
    Topology(dp_size=3, dp_rank=2, master_addr="h", master_port=1, num_experts=4, scale_up_launch=True).validate()


def _scale_down(removed: list[int]) -> ApplyRequest:
    return ApplyRequest(
        instruction="scale_down",
        request_id="r",
        params=ApplyParams(removed_dp_ranks=removed, dp_master_ip="127.0.0.1", dp_store_port=29000),
    )


def test_an_elastic_resize_changes_the_group_size_but_not_the_ft_size() -> None:
    grown = sm.on_elastic_resized(sm.initial_state(rank=0, dp_size=2), new_dp_size=3).state
    assert (grown.dp_size, grown.ft_world, grown.members, grown.ft_members) == (3, 2, (0, 1, 2), (0, 1))
    faulted = sm.on_collective_fault(grown, fault_info="RuntimeError", mask=(1, 1, 0), now=0.0, recovery_timeout=60)
    refused = sm.on_command(faulted.state, _scale_down([2]))
    assert not refused.accepted
    assert refused.state.ft_error == "Invalid removed_dp_ranks [2] for engine 0 (dp_rank=0, dead_dp_ranks=[])"
    # a rank launched for the scale-up was constructed with the new size: it plans over range(3)
    launched = sm.on_collective_fault(
        sm.initial_state(rank=2, dp_size=3), fault_info="RuntimeError", mask=(0, 1, 1), now=0.0, recovery_timeout=60
    )
    accepted = sm.on_command(launched.state, _scale_down([0]))
    assert accepted.accepted
    assert accepted.actions[0].plan.members == (1, 2)  # type: ignore[union-attr]
    # the two kinds of rank plan the same round differently: their digests differ, the vote cannot agree
    old = sm.on_command(
        sm.on_collective_fault(grown, fault_info="x", mask=(1, 0, 1), now=0.0, recovery_timeout=60).state,
        _scale_down([1]),
    )
    new = sm.on_command(
        sm.on_collective_fault(
            sm.initial_state(rank=2, dp_size=3), fault_info="x", mask=(1, 0, 1), now=0.0, recovery_timeout=60
        ).state,
        _scale_down([1]),
    )
    plans = [t.actions[0].plan for t in (old, new)]  # type: ignore[union-attr]
    assert [p.members for p in plans] == [(0,), (0, 2)]
    assert plans[0].digest != plans[1].digest


def test_while_scaling_or_retired_every_path_but_the_observability_ones_answers_503() -> None:
    async def scenario() -> None:
        cluster = FakeEngineCluster(dp_size=2, enable_elastic_ep=True)
        await cluster.start()
        try:
            core, client = cluster.cores[0], cluster.client(0)
            for flag, text in (
                ("elastic_scaling", ELASTIC_EP_SCALING_TEXT),
                ("elastic_retired", ELASTIC_EP_RETIRED_TEXT),
            ):
                setattr(core, flag, True)  # the engine core's own flags, as a resize sets them
                for path in ("/v1/completions", "/v1/fault_tolerance/status", "/metrics", "/scale_elastic_ep"):
                    resp = await client.request("GET" if path.endswith(("status", "metrics")) else "POST", path)
                    assert (resp.status_code, resp.json()) == (503, {"error": text}), path
                assert (await client.get("/health")).status_code == 200
                assert (await client.post("/is_scaling_elastic_ep")).status_code == 200
                assert (await conformance.sim_info(cluster, 0))["dp_rank"] == 0  # the simulator's own routes stay
                setattr(core, flag, False)
            assert (await conformance.complete(cluster, 0, "served again")).status_code == 200
        finally:
            await cluster.close()

    asyncio.run(scenario())
