"""Where a fallback relaunches: never on a card with a standing hardware fault (``core/relaunch.py``)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import heteroflow
from heteroflow.serving.controller.config import FaultToleranceConfig
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.errors import RoundStateError
from heteroflow.serving.controller.core.gate import GateFlags
from heteroflow.serving.controller.core.normalizer import HardwareFault
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import ranks
from heteroflow.serving.controller.core.relaunch import (
    RelaunchKind,
    RelaunchPlan,
    RelaunchReason,
    faulty_ranks,
    is_standing,
    plan_relaunch,
)
from heteroflow.serving.controller.core.topology import resolve_instance
from heteroflow.serving.controller.fallbacks import ready_timeout
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import StrategyPorts

from .helpers import INSTANCE, capability, registration, runtime, topology

SCALE_DOWN_ON = GateFlags(enable_fault_tolerance=True, enable_dp_scale_down=True)
CARD_1_OF_N2 = HardwareFault(node_name="n2", card="Ascend910-1", fault_code="XID79", level=6)
"""Rank 3's card (pod b on n2 holds ranks 2, 3 on Ascend910-0 and -1)."""


def plan(
    *faults: HardwareFault,
    retired: tuple[int, ...] = (),
    replace: bool = False,
    flags: GateFlags = SCALE_DOWN_ON,
    **cap: object,
) -> RelaunchPlan:
    return plan_relaunch(
        topology=topology(),
        retired=ranks(retired),
        standing=faults,
        can_replace_pods=replace,
        flags=flags,
        capability=capability(**cap),
    )


@pytest.mark.parametrize(("level", "standing"), [(1, False), (3, False), (4, False), (5, True), (6, True)])
def test_only_l5_and_l6_faults_stand_in_the_way_of_a_relaunch(level: int, standing: bool) -> None:
    fault = HardwareFault(node_name="n2", card="Ascend910-1", fault_code="X", level=level)
    assert is_standing(fault) is standing
    assert plan(fault).kind == (RelaunchKind.WITHOUT_RANKS if standing else RelaunchKind.IN_PLACE)


def test_no_standing_fault_relaunches_in_place_with_the_fallbacks_retired_set() -> None:
    got = plan(retired=(1,))
    assert got == RelaunchPlan(RelaunchKind.IN_PLACE, retired=ranks((1,)))
    other_node = HardwareFault(node_name="n9", card="Ascend910-1", fault_code="XID79", level=6)
    assert plan(other_node).kind == RelaunchKind.IN_PLACE


def test_locally_the_instance_comes_back_without_the_ranks_on_faulty_cards() -> None:
    got = plan(CARD_1_OF_N2, retired=(0,), slots_per_rank=128)  # 2 ranks x 128 slots hold the 256 experts
    assert got.kind == RelaunchKind.WITHOUT_RANKS
    assert got.faulty == ranks((3,))
    assert got.retired == ranks((0, 3))  # what the fallback retires anyway, and the faulty rank
    assert got.faults == (CARD_1_OF_N2.key,)
    assert got.reason_code == RelaunchReason.RANKS_LEFT_OUT
    assert got.reason == (
        "ranks 3 run on cards with a standing hardware fault: the instance is relaunched without them (2 of 4 DP ranks)"
    )


def test_a_smaller_world_that_cannot_hold_every_expert_is_refused_before_anything_stops() -> None:
    # 2 ranks x 96 slots = 192 < 256 logical experts: a released engine would refuse to start that world
    for got in (plan(CARD_1_OF_N2, retired=(0,)), plan(retired=(0, 3))):
        assert got.kind == RelaunchKind.REFUSED
        assert got.reason_code == RelaunchReason.EXPERT_CAPACITY
        assert got.gate_reasons == ("EXPERT_CAPACITY_INSUFFICIENT",)
        assert got.reason == (
            "2 DP ranks hold 192 expert slots, fewer than the 256 logical experts: the engines cannot start that "
            "small, so nothing is relaunched until the cards are back or replaced"
        )
    # whatever the gate's optional capacity check says; with TP 2 each DP rank holds two EP ranks' slots
    assert plan(retired=(0, 3), tp_size=2).kind == RelaunchKind.IN_PLACE
    # three ranks hold 288: the relaunch without rank 3 goes ahead, and the whole world is never checked
    assert plan(CARD_1_OF_N2).kind == RelaunchKind.WITHOUT_RANKS
    assert plan(slots_per_rank=1).kind == RelaunchKind.IN_PLACE


def test_a_rank_already_retired_needs_nothing() -> None:
    assert plan(CARD_1_OF_N2, retired=(3,)).kind == RelaunchKind.IN_PLACE


def test_on_kubernetes_the_pods_of_faulty_cards_are_replaced_instead() -> None:
    node_level = HardwareFault(node_name="n1", card="", fault_code="NODE", level=6)
    got = plan(CARD_1_OF_N2, node_level, replace=True)
    assert got.kind == RelaunchKind.REPLACE_PODS
    assert got.pods == ("pod-a", "pod-b")
    assert got.faulty == ranks((0, 1, 3))
    assert got.retired == frozenset()  # nothing left out: the replaced pods come back whole
    assert got.reason_code == RelaunchReason.PODS_REPLACED


def test_locally_a_gate_refusal_is_said_with_its_reason_codes_and_nothing_relaunches() -> None:
    got = plan(CARD_1_OF_N2, scale_down_supported=False)
    assert got.kind == RelaunchKind.REFUSED
    assert got.reason_code == RelaunchReason.SCALE_DOWN_REFUSED
    assert got.gate_reasons == ("ENGINE_SCALE_DOWN_UNSUPPORTED",)
    assert "ENGINE_SCALE_DOWN_UNSUPPORTED" in got.reason
    off = plan(CARD_1_OF_N2, flags=GateFlags(enable_fault_tolerance=True, enable_dp_scale_down=False))
    assert off.kind == RelaunchKind.REFUSED
    assert off.gate_reasons == ("FEATURE_DISABLED",)


def test_every_rank_on_a_faulty_card_is_refused_locally() -> None:
    node_1 = HardwareFault(node_name="n1", card="", fault_code="NODE", level=5)
    node_2 = HardwareFault(node_name="n2", card="", fault_code="NODE", level=5)
    got = plan(node_1, node_2)
    assert got.kind == RelaunchKind.REFUSED
    assert got.reason_code == RelaunchReason.EVERY_RANK_FAULTY
    assert got.faulty == ranks((0, 1, 2, 3))


def test_a_replaced_pods_new_cards_are_no_longer_hit() -> None:
    replaced = registration("pod-b", (2, 3), node="n2")
    moved = replaced.model_copy(
        update={
            "endpoints": [
                e.model_copy(
                    update={
                        "device_infos": [
                            d.model_copy(update={"device_id": f"Ascend910-{4 + e.id}", "index": 4 + e.id})
                            for d in e.device_infos
                        ]
                    }
                )
                for e in replaced.endpoints
            ]
        }
    )
    after = resolve_instance([registration("pod-a", (0, 1), node="n1"), moved])
    assert faulty_ranks([CARD_1_OF_N2], topology()) == (ranks((3,)), (CARD_1_OF_N2.key,))
    assert faulty_ranks([CARD_1_OF_N2], after) == (frozenset(), ())


def test_a_fallback_that_left_ranks_out_runs_scaled_down_with_them_retired() -> None:
    start = rt.start_reconfiguration(runtime(), rt.FallbackStrategy.INSTANCE_RECONFIGURATION, "CORRELATION_EXPIRED")
    done = rt.fallback_succeeded(start, left_out=ranks((3,)))
    assert done.phase == FtPhase.SCALED_DOWN_RUNNING
    assert done.dead_committed == ranks((3,))
    assert done.alive_dp_ranks == ranks((0, 1, 2))
    assert rt.fallback_succeeded(start).phase == FtPhase.NORMAL  # nothing left out: a plain rebuild
    with pytest.raises(RoundStateError):
        rt.fallback_succeeded(start, left_out=ranks((0, 1, 2, 3)))
    with pytest.raises(RoundStateError):
        rt.fallback_succeeded(start, left_out=ranks((7,)))


def test_the_dashboard_knows_every_relaunch_kind_and_reason_code() -> None:
    logic = Path(heteroflow.__file__).parent / "platform_server" / "web" / "ui" / "logic" / "serving.js"
    text = logic.read_text(encoding="utf-8")

    def listed(name: str) -> set[str]:
        found = re.search(rf"export const {name} = Object\.freeze\(\[(.*?)\]\)", text, re.DOTALL)
        assert found is not None, name
        return set(re.findall(r'"([^"]+)"', found.group(1)))

    assert listed("RELAUNCH_REASONS") == {reason.value for reason in RelaunchReason}
    assert listed("RELAUNCH_KINDS") == {kind.value for kind in RelaunchKind} - {RelaunchKind.IN_PLACE.value}


@pytest.mark.parametrize(
    ("measured", "expected"),
    [(None, 300.0), (2.0, 30.0), (20.0, 60.0), (150.0, 300.0)],
)
def test_the_ready_wait_is_three_measured_starts_at_least_30_s_within_the_configured_bound(
    measured: float | None, expected: float
) -> None:
    ports = cast(StrategyPorts, SimpleNamespace(ft=FaultToleranceConfig.load(fallback_ready_timeout_sec=300.0)))
    inst = Instance(instance_id=INSTANCE, topology=topology(), runtime=runtime())
    inst.relaunches.measured_start_sec = measured
    assert ready_timeout(ports, inst) == expected


CARDS = [
    HardwareFault(node_name=node, card=card, fault_code="F", level=level)
    for node in ("n1", "n2")
    for card in ("", "Ascend910-0", "Ascend910-1")
    for level in (4, 5, 6)
]


@settings(max_examples=300, deadline=None)
@given(
    faults=st.lists(st.sampled_from(CARDS), max_size=4),
    retired=st.frozensets(st.integers(0, 3), max_size=3),
    replace=st.booleans(),
    scale_down=st.booleans(),
)
def test_no_plan_ever_starts_a_rank_on_a_card_with_a_standing_fault(
    faults: list[HardwareFault], retired: frozenset[int], replace: bool, scale_down: bool
) -> None:
    got = plan(*faults, retired=tuple(retired), replace=replace, scale_down_supported=scale_down)
    hit, _ = faulty_ranks(faults, topology())
    assert got.retired >= retired  # a plan never starts what the fallback retires
    if got.kind in (RelaunchKind.IN_PLACE, RelaunchKind.WITHOUT_RANKS):
        started = topology().original_dp_ranks - got.retired
        assert started
        assert not started & hit
        assert len(started) * 96 >= 256 or len(started) == 4  # a world that cannot place its experts never starts
    elif got.kind == RelaunchKind.REPLACE_PODS:
        assert replace
        assert {topology().pod_of(r).pod_id for r in got.faulty} == set(got.pods)
    else:
        assert got.kind == RelaunchKind.REFUSED
        assert not replace or got.reason_code == RelaunchReason.EXPERT_CAPACITY
        assert got.reason_code is not None
