"""The FaultManager decision (F-10, F-12, F-13, F-59): every branch of RFC §4.3 / §4.4's diagrams."""

from __future__ import annotations

from dataclasses import replace

import pytest

from heteroflow.serving.controller.core import runtime as rt_ops
from heteroflow.serving.controller.core.decision import (
    DecisionInput,
    DecisionReason,
    DecisionTimings,
    MarkHardwareHandled,
    NoAction,
    Reconfigure,
    RunHigherPriority,
    StartFastRecovery,
    StartScaleDown,
    Wait,
    after_fast_recovery,
    decide,
)
from heteroflow.serving.controller.core.normalizer import (
    FtSnapshot,
    HardwareEvent,
    HardwareFault,
    HardwareMapping,
    MappingKind,
    map_hardware_fault,
    observe,
)
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import ranks
from heteroflow.serving.controller.core.runtime import FallbackStrategy, FtRuntime

from .helpers import context, report, runtime, snapshot, topology

ALL_U = {0: "unhealthy", 1: "unhealthy", 2: "unhealthy", 3: "unhealthy"}
U_D = {0: "unhealthy", 1: "dead", 2: "unhealthy", 3: "unhealthy"}


def given(statuses: dict[int, str], *, at: float = 0.0, rt: FtRuntime | None = None, **kw: object) -> DecisionInput:
    rt = rt or runtime()
    return DecisionInput(runtime=rt, snapshot=snapshot(statuses, at=at, dead_committed=rt.dead_committed), **kw)  # type: ignore[arg-type]


def hw(card: str = "Ascend910-1", *, at: float = 0.0, node: str = "n1", level: int = 6) -> HardwareEvent:
    fault = HardwareFault(node_name=node, card=card, fault_code="80E18402", level=level)
    return HardwareEvent(fault=fault, mapping=map_hardware_fault(fault, topology()), received_at=at)


def test_a1_complete_u_plus_d_starts_a_scale_down_from_the_dead_ranks_only() -> None:
    got = decide(given(U_D), now=0.5)
    assert isinstance(got, StartScaleDown)
    assert got.candidates == {1}
    assert got.survivors == {0, 2, 3}
    assert got.fallback == FallbackStrategy.INSTANCE_RECONFIGURATION
    assert not got.hardware_matched


def test_a10_several_dead_in_one_round() -> None:
    got = decide(given({0: "dead", 1: "unhealthy", 2: "dead", 3: "unhealthy"}), now=0.0)
    assert isinstance(got, StartScaleDown)
    assert got.candidates == {0, 2}


def test_the_original_fallback_is_frozen_into_the_decision() -> None:
    got = decide(given(U_D, original_fallback=FallbackStrategy.SCALE_P2D), now=0.0)
    assert isinstance(got, StartScaleDown)
    assert got.fallback == FallbackStrategy.SCALE_P2D


def test_a2_idle_survivors_stay_healthy_no_round_then_collection_timeout_reconfigures() -> None:
    """A2: DEAD with HEALTHY survivors is incomplete: wait (no DEL, no apply), timeout → reconfiguration."""
    data = given({1: "dead"}, at=10.0)
    waiting = decide(data, now=30.0)
    assert waiting == Wait(DecisionReason.COLLECTING, until=70.0)
    assert decide(data, now=70.0) == Reconfigure(
        FallbackStrategy.INSTANCE_RECONFIGURATION, DecisionReason.COLLECTION_TIMEOUT
    )


def test_a9_all_unhealthy_not_applicable_waits_for_dead_then_times_out() -> None:
    """A9: no guess from UNHEALTHY (nor the mask): wait for DEAD; timeout → reconfiguration."""
    data = given(ALL_U, at=0.0)
    assert decide(data, now=59.9) == Wait(DecisionReason.WAITING_FOR_DEAD, until=60.0)
    assert decide(data, now=60.0).kind == "reconfigure"


def test_a8_all_unhealthy_and_applicable_fast_recovery_after_the_stability_window() -> None:
    """A8 / F-59: fast recovery only after every rank stayed UNHEALTHY for the stability window."""
    data = given(ALL_U, at=5.0, fast_recovery_applicable=True)
    assert decide(data, now=6.0) == Wait(DecisionReason.STABILITY_WINDOW, until=7.0)
    assert decide(data, now=7.0) == StartFastRecovery()


def test_a8_fast_recovery_failure_is_reconfiguration_never_scale_down() -> None:
    assert after_fast_recovery(succeeded=False) == Reconfigure(
        FallbackStrategy.INSTANCE_RECONFIGURATION, DecisionReason.FAST_RECOVERY_FAILED
    )
    assert after_fast_recovery(succeeded=True).kind == "no_action"


def test_f13_fast_recovery_cannot_be_preempted_by_scale_down() -> None:
    assert decide(given(U_D, running="fast_recovery"), now=0.0) == NoAction(DecisionReason.STRATEGY_RUNNING)


def test_f10_all_dead_reconfigures() -> None:
    got = decide(given({0: "dead", 1: "dead", 2: "dead", 3: "dead"}), now=0.0)
    assert got == Reconfigure(FallbackStrategy.INSTANCE_RECONFIGURATION, DecisionReason.ALL_DEAD)


def test_no_evidence_no_action() -> None:
    assert decide(given({}), now=100.0) == NoAction(DecisionReason.NO_FAULT)


def test_a18_feature_off_decides_nothing() -> None:
    off = rt_ops.new_runtime("decode-0", [0, 1, 2, 3], enabled=False)
    assert decide(given(U_D, rt=off), now=0.0) == NoAction(DecisionReason.FEATURE_DISABLED)


def test_f10_higher_priority_special_strategy_comes_first() -> None:
    assert decide(given(U_D, higher_priority_pending=True), now=0.0) == RunHigherPriority()
    assert decide(given(U_D, higher_priority_pending=True, running="scale_down"), now=0.0) == RunHigherPriority()
    got = decide(given(U_D, higher_priority_pending=True, running="higher_priority"), now=0.0)
    assert got == NoAction(DecisionReason.STRATEGY_RUNNING)


@pytest.mark.parametrize("phase", ["round", "reconfiguring"])
def test_f13_reports_during_a_round_or_fallback_never_start_another(phase: str) -> None:
    rt = runtime()
    if phase == "round":
        rt = rt_ops.start_round(rt, context(rt, dead=(1,)))
    else:
        rt = rt_ops.start_reconfiguration(rt, FallbackStrategy.INSTANCE_RECONFIGURATION, "x")
    assert decide(given({0: "unhealthy", 1: "dead", 2: "dead", 3: "unhealthy"}, rt=rt), now=0.0).kind == "no_action"


def test_a4_next_round_from_scaled_down_running_uses_active_ranks_only() -> None:
    """A4 / F-10: active = original - dead_committed; committed rank 1 is not needed for completeness."""
    rt = runtime()
    for step in (rt_ops.begin_apply, rt_ops.engines_recovered, rt_ops.record_commit, rt_ops.finish_round):
        rt = step(rt_ops.start_round(rt, context(rt, dead=(1,)))) if rt.phase == FtPhase.NORMAL else step(rt)
    assert rt.phase == FtPhase.SCALED_DOWN_RUNNING
    got = decide(given({0: "unhealthy", 2: "dead", 3: "unhealthy"}, rt=rt), now=0.0)
    assert isinstance(got, StartScaleDown)
    assert got.candidates == {2}
    assert got.survivors == {0, 3}


# == hardware first (F-12) =====================================================================================
def test_a11_hardware_first_matched_within_the_window_scales_down_from_software_dead() -> None:
    """A11: the apply's candidates come from software DEAD; hardware only validates the correlation."""
    data = given(U_D, at=3.0, hardware=(hw(at=0.0),))
    got = decide(data, now=3.0)
    assert isinstance(got, StartScaleDown)
    assert got.candidates == {1}
    assert got.hardware_matched
    assert got.fallback == FallbackStrategy.INSTANCE_RECONFIGURATION  # F-14
    assert got.hardware_keys == (hw().fault.key,)


def test_a11_a_hardware_first_window_waits_for_the_software_snapshot() -> None:
    assert decide(given({}, hardware=(hw(at=0.0),)), now=1.0) == Wait(DecisionReason.CORRELATION_WINDOW, until=5.0)
    assert decide(given({1: "dead"}, at=2.0, hardware=(hw(at=0.0),)), now=2.0).kind == "wait"


def test_a11_all_unhealthy_in_the_window_counts_as_matched_then_f10() -> None:
    data = given(ALL_U, at=1.0, hardware=(hw(at=0.0),))
    assert decide(data, now=1.0) == Wait(DecisionReason.WAITING_FOR_DEAD, until=61.0)


def test_a12_hardware_first_no_match_in_5_s_reconfigures() -> None:
    """A12: the U+D snapshot's DEAD does not cover the mapped rank; the window expires → reconfiguration."""
    mismatched = {0: "unhealthy", 1: "unhealthy", 2: "dead", 3: "unhealthy"}
    data = given(mismatched, at=1.0, hardware=(hw(at=0.0),))
    assert decide(data, now=4.9).kind == "wait"
    assert decide(data, now=5.0) == Reconfigure(
        FallbackStrategy.INSTANCE_RECONFIGURATION, DecisionReason.CORRELATION_EXPIRED
    )
    assert decide(given({}, hardware=(hw(at=0.0),)), now=5.0).kind == "reconfigure"


def test_a13_hardware_fault_on_a_committed_rank_is_handled_nothing_repeated() -> None:
    rt = rt_ops.start_round(runtime(), context(runtime(), dead=(1,)))
    for step in (rt_ops.begin_apply, rt_ops.engines_recovered, rt_ops.record_commit, rt_ops.finish_round):
        rt = step(rt)
    got = decide(given({}, rt=rt, hardware=(hw(at=0.0),)), now=10.0)
    assert got == MarkHardwareHandled(keys=(hw().fault.key,))


def test_f12_mapped_ranks_minus_committed_must_be_dead() -> None:
    """Node-level fault maps {0, 1}; 1 is committed, so only rank 0 must be DEAD."""
    rt = runtime()
    rt = replace(rt, dead_committed=ranks([1]), phase=FtPhase.SCALED_DOWN_RUNNING)
    node_fault = hw("", at=0.0)
    got = decide(given({0: "dead", 2: "unhealthy", 3: "unhealthy"}, at=1.0, rt=rt, hardware=(node_fault,)), now=1.0)
    assert isinstance(got, StartScaleDown)
    assert got.hardware_matched


@pytest.mark.parametrize("card", ["npu#4", "Ascend 910"])
def test_a14_unmappable_hardware_takes_the_original_strategy_without_a_window(card: str) -> None:
    data = given(U_D, hardware=(hw(card),), original_fallback=FallbackStrategy.SCALE_P2D)
    assert decide(data, now=0.0) == Reconfigure(FallbackStrategy.SCALE_P2D, DecisionReason.HARDWARE_UNMAPPABLE)


def test_a14_any_unmappable_event_of_the_round_wins_over_a_mappable_one() -> None:
    events = (hw(at=0.0), hw("npu#4", at=0.1))
    assert decide(given(U_D, at=1.0, hardware=events), now=1.0).kind == "reconfigure"


def test_f12_an_instance_that_is_not_active_takes_the_original_strategy() -> None:
    got = decide(given(U_D, hardware=(hw(at=0.0),), instance_active=False), now=0.0)
    assert got == Reconfigure(FallbackStrategy.INSTANCE_RECONFIGURATION, DecisionReason.INSTANCE_NOT_ACTIVE)


def test_f12_l1_to_l3_and_other_nodes_start_no_window() -> None:
    assert decide(given({}, hardware=(hw(level=3),)), now=0.0) == NoAction(DecisionReason.NO_FAULT)
    assert decide(given({}, hardware=(hw(node="n9"),)), now=0.0) == NoAction(DecisionReason.NO_FAULT)


def test_f12_software_first_decides_without_waiting_for_hardware() -> None:
    """Software evidence came first (t=0); a later mismatched hardware event opens no window."""
    later = HardwareEvent(
        fault=HardwareFault(node_name="n2", card="Ascend910-0", fault_code="x", level=6),
        mapping=HardwareMapping(MappingKind.MAPPED, ranks=ranks([2])),
        received_at=1.0,
    )
    got = decide(given(U_D, at=0.0, hardware=(later,)), now=1.0)
    assert isinstance(got, StartScaleDown)
    assert not got.hardware_matched


def test_timings_are_configurable() -> None:
    fast = DecisionTimings(software_fault_collection_timeout_sec=5.0, hardware_ft_correlation_window_sec=1.0)
    assert decide(given({1: "dead"}, timings=fast), now=5.0).kind == "reconfigure"
    assert decide(given({}, hardware=(hw(at=0.0),), timings=fast), now=1.0).kind == "reconfigure"


def test_first_seen_comes_from_the_snapshot_not_the_report_clock() -> None:
    snap = observe(FtSnapshot(), report(1, "dead"), now=100.0, dead_committed=())
    data = DecisionInput(runtime=runtime(), snapshot=snap)
    assert decide(data, now=120.0) == Wait(DecisionReason.COLLECTING, until=160.0)
