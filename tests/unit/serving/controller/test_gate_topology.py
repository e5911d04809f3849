"""FtGate (F-21, F-55, A15) and TopologyResolver (F-21…F-23, F-25)."""

from __future__ import annotations

import pytest

from heteroflow.contracts.serving import MAX_DP_SIZE
from heteroflow.serving.controller.core.errors import CapabilityMismatchError, TopologyError
from heteroflow.serving.controller.core.gate import GateFlags, GateReason, evaluate
from heteroflow.serving.controller.core.ranks import RequestId
from heteroflow.serving.controller.core.topology import (
    RoundTimings,
    apply_request,
    guard_lease_sec,
    plan_round,
    recyclable_pods,
    resolve_instance,
)

from .helpers import capability, registration, topology

ON = GateFlags(enable_fault_tolerance=True, enable_dp_scale_down=True)


def test_gate_allows_a_complete_capability() -> None:
    result = evaluate(flags=ON, capability=capability(), survivors=3)
    assert result.allowed
    assert result.reason_codes == ()


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"engine_ft_enabled": False}, GateReason.ENGINE_FT_REQUIRED),
        ({"scale_down_supported": False}, GateReason.ENGINE_SCALE_DOWN_UNSUPPORTED),
        ({"external_lb": False}, GateReason.EXTERNAL_LB_REQUIRED),
        ({"auto_recovery_enabled": True}, GateReason.AUTO_RECOVERY_CONFLICT),
        ({"eplb_enabled": False}, GateReason.EPLB_REQUIRED),
        ({"num_redundant_experts": 0}, GateReason.EXPERT_REDUNDANCY_REQUIRED),
    ],
)
def test_a15_each_static_gate_failure_is_recorded_with_its_reason(
    changes: dict[str, object], reason: GateReason
) -> None:
    result = evaluate(flags=ON, capability=capability(**changes), survivors=3)
    assert not result.allowed
    assert result.reason_codes == (reason,)


def test_a15_fused_mc2_is_not_a_gate() -> None:
    """The capability carries no MC2 field at all; a registration that says MC2 off is still admitted."""
    cap = capability().model_validate({**capability().model_dump(), "fused_mc2_enabled": False})
    assert evaluate(flags=ON, capability=cap, survivors=1).allowed


def test_gate_feature_survivor_topology_and_mismatch_reasons() -> None:
    assert evaluate(flags=GateFlags(), capability=capability(), survivors=3).reason_codes == (
        GateReason.FEATURE_DISABLED,
    )
    assert evaluate(flags=ON, capability=capability(), survivors=0).reason_codes == (GateReason.NO_SURVIVOR,)
    missing = evaluate(flags=ON, capability=None, survivors=3)
    assert missing.reason_codes == (GateReason.TOPOLOGY_INCOMPLETE,)
    mismatch = evaluate(flags=ON, capability=None, survivors=3, capability_mismatch=True)
    assert mismatch.reason_codes == (GateReason.CAPABILITY_MISMATCH,)
    planned = evaluate(flags=ON, capability=capability(), survivors=3, topology_error="rank 9 unknown")
    assert planned.reason_codes == (GateReason.TOPOLOGY_INCOMPLETE,)
    assert planned.warnings == ("rank 9 unknown",)


def test_f55_expert_capacity_is_a_warning_unless_the_flag_makes_it_a_gate() -> None:
    """Redundant experts are not a rank budget: the engine judges (default); the flag turns it into a gate."""
    cap = capability(num_logical_experts=256, slots_per_rank=72)  # 3 x 72 = 216 < 256
    warned = evaluate(flags=ON, capability=cap, survivors=3)
    assert warned.allowed
    assert "216" in warned.warnings[0]
    strict = GateFlags(enable_fault_tolerance=True, enable_dp_scale_down=True, gate_expert_capacity=True)
    assert evaluate(flags=strict, capability=cap, survivors=3).reason_codes == (
        GateReason.EXPERT_CAPACITY_INSUFFICIENT,
    )
    assert evaluate(flags=strict, capability=cap, survivors=4).allowed


def test_resolve_instance_assembles_pods_in_order() -> None:
    topo = topology()
    assert topo.original_dp_ranks == {0, 1, 2, 3}
    assert [pod.pod_id for pod in topo.pods] == ["pod-a", "pod-b"]
    assert topo.pod_of(3).pod_id == "pod-b"
    with pytest.raises(TopologyError):
        topo.pod_of(7)


def test_f21_capabilities_must_agree_across_pods() -> None:
    with pytest.raises(CapabilityMismatchError):
        resolve_instance(
            [registration("pod-a", (0, 1)), registration("pod-b", (2, 3), cap=capability(external_lb=False))]
        )


@pytest.mark.parametrize(
    "regs",
    [
        [],
        [registration("pod-a", (0, 1))],  # ranks 2, 3 missing
        [registration("pod-a", (0, 1)), registration("pod-b", (1, 2, 3))],  # rank 1 twice
        [registration("pod-a", (0, 1)), registration("pod-a", (2, 3))],
        [registration("pod-a", (0, 1)), registration("pod-b", (2, 3), dp_size=5)],
    ],
)
def test_f22_missing_or_inconsistent_topology_fails_closed(regs: list[object]) -> None:
    with pytest.raises(TopologyError):
        resolve_instance(regs)  # type: ignore[arg-type]


def test_f22_an_incomplete_instance_names_a_few_missing_ranks_and_counts_the_rest() -> None:
    """The largest dp_size a pod may declare, two ranks registered: the error is short and built without a set
    of every rank."""
    with pytest.raises(TopologyError) as raised:
        resolve_instance([registration("pod-a", (0, 1), dp_size=MAX_DP_SIZE)])
    message = str(raised.value)
    assert f"{MAX_DP_SIZE - 2} ranks missing (first {list(range(2, 18))})" in message
    assert len(message) < 200
    with pytest.raises(TopologyError, match=r"1 ranks missing \(first \[3\]\), unknown \[7\]"):
        resolve_instance([registration("pod-a", (0, 1)), registration("pod-b", (2, 7))])


def test_f22_every_pod_is_guarded_only_routable_survivors_get_apply() -> None:
    """F-22 / F-25: pod a lost both ranks → guard/finalize only; pod b's survivors get the single apply."""
    plan = plan_round(topology(), survivors=[2, 3], removed=[0, 1])
    assert [(r.pod.pod_id, r.routable) for r in plan.roles] == [("pod-a", False), ("pod-b", True)]
    assert plan.master_rank == 2
    assert plan.dp_master_ip == "10.0.0.3"
    body = apply_request(plan, plan.routable[0], request_id=RequestId("r1"), removed=[1, 0])
    assert body.instruction == "scale_down"
    assert body.params.removed_dp_ranks == [0, 1]
    assert body.params.dp_master_ip == "10.0.0.3"
    assert body.endpoint_ids == [2, 3]
    assert "dp_store_port" not in body.params.model_dump()  # the NodeManager fills it in
    with pytest.raises(TopologyError):
        apply_request(plan, plan.roles[0], request_id=RequestId("r1"), removed=[0, 1])


def test_f22_unknown_ranks_or_no_survivor_fail_closed() -> None:
    with pytest.raises(TopologyError):
        plan_round(topology(), survivors=[0, 9], removed=[1])
    with pytest.raises(TopologyError):
        plan_round(topology(), survivors=[], removed=[0, 1, 2, 3])


def test_f23_guard_lease_covers_two_windows_plus_margin_and_is_capped() -> None:
    assert guard_lease_sec(RoundTimings()) == pytest.approx(2 * 30 + 3 * 5 + 2 * 1)
    assert guard_lease_sec(RoundTimings(execution_deadline_sec=5000)) == 3600


def test_a5_a_partly_emptied_pod_is_not_stopped() -> None:
    assert recyclable_pods(topology(), dead_committed=[1], already_stopped=[], enable_dp_scale_up=True) == ()


def test_a6_a_fully_emptied_pod_is_kept_with_scale_up_off() -> None:
    assert recyclable_pods(topology(), dead_committed=[0, 1], already_stopped=[], enable_dp_scale_up=False) == ()


def test_a7_a_fully_emptied_pod_is_stopped_once_with_scale_up_on() -> None:
    first = recyclable_pods(topology(), dead_committed=[0, 1], already_stopped=[], enable_dp_scale_up=True)
    assert first == ("pod-a",)
    again = recyclable_pods(topology(), dead_committed=[0, 1, 2], already_stopped=first, enable_dp_scale_up=True)
    assert again == ()
