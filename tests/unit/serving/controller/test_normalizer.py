"""FaultNormalizer: software evidence (F-1, F-2, F-10) and the hardware mapping (F-3, A14)."""

from __future__ import annotations

import pytest

from heteroflow.contracts.engine_protocol import EngineStatusEntry
from heteroflow.contracts.serving import DeviceInfo, EndpointInfo, FaultEvidence, SoftwareFaultReport
from heteroflow.serving.controller.core.normalizer import (
    FtSnapshot,
    HardwareFault,
    MappingKind,
    SnapshotKind,
    classify,
    map_hardware_fault,
    observe,
    reset,
)
from heteroflow.serving.controller.core.ranks import DpRank, ranks
from heteroflow.serving.controller.core.topology import resolve_instance

from .helpers import AT, INSTANCE, registration, report, snapshot, topology

ALL = (0, 1, 2, 3)


def test_only_dead_makes_a_removal_candidate_unhealthy_never() -> None:
    snap = snapshot({0: "unhealthy", 1: "dead", 2: "unhealthy", 3: "unhealthy"})
    got = classify(snap, ALL)
    assert got.kind == SnapshotKind.COMPLETE
    assert got.dead == {1}
    assert got.unhealthy == {0, 2, 3}


@pytest.mark.parametrize("evidence", [FaultEvidence.FT_STATUS, FaultEvidence.ENGINE_DEAD, FaultEvidence.FT_UNREACHABLE])
def test_f10_every_dead_source_counts(evidence: FaultEvidence) -> None:
    status = "dead"
    snap = observe(FtSnapshot(), report(2, status, evidence), now=1.0, dead_committed=frozenset())
    assert snap.status(2) == "dead"
    assert snap.entries[DpRank(2)].first_seen == 1.0


def test_dead_is_sticky_until_reset() -> None:
    snap = snapshot({1: "dead"})
    again = observe(snap, report(1, "unhealthy"), now=5.0, dead_committed=frozenset())
    assert again is snap
    assert (
        observe(snap, report(1, "protocol_error", FaultEvidence.FT_PROTOCOL_ERROR), now=6.0, dead_committed=()) is snap
    )
    assert reset().status(1) == "healthy"


def test_protocol_error_is_never_healthy_never_dead() -> None:
    snap = snapshot({0: "unhealthy", 1: "dead", 2: "unhealthy"})
    snap = observe(snap, report(3, "protocol_error", FaultEvidence.FT_PROTOCOL_ERROR), now=0.0, dead_committed=())
    got = classify(snap, ALL)
    assert snap.status(3) == "unknown"
    assert got.kind == SnapshotKind.INCOMPLETE


def test_vllm_034_diagnosing_is_a_fault_that_keeps_the_snapshot_waiting_never_dead() -> None:
    snap = snapshot({0: "unhealthy", 1: "dead", 2: "unhealthy"})
    snap = observe(snap, report(3, "diagnosing"), now=1.0, dead_committed=())
    got = classify(snap, ALL)
    assert snap.status(3) == "diagnosing"
    assert got.kind == SnapshotKind.INCOMPLETE  # no round until the engine can take a command
    assert got.dead == {1}
    snap = observe(snap, report(3, "unhealthy"), now=2.0, dead_committed=())
    assert classify(snap, ALL).kind == SnapshotKind.COMPLETE


def test_committed_ranks_are_filtered_and_outside_the_active_set() -> None:
    snap = snapshot({1: "dead"}, dead_committed=ranks([1]))
    assert snap.entries == {}
    got = classify(snapshot({0: "unhealthy", 2: "dead", 3: "unhealthy"}), (0, 2, 3))
    assert got.kind == SnapshotKind.COMPLETE


def test_the_mask_is_never_used_to_infer_ranks() -> None:
    """F-10: an unhealthy survivor's mask naming rank 3 as failed does not make rank 3 DEAD."""
    masked = SoftwareFaultReport(
        instance_id=INSTANCE,
        pod_id="pod-a",
        endpoint_id=0,
        status="unhealthy",
        evidence=FaultEvidence.FT_STATUS,
        engine_status=EngineStatusEntry(id=0, status="unhealthy", mask=[1, 1, 1, 0]),
        observed_at=AT,
    )
    snap = observe(FtSnapshot(), masked, now=0.0, dead_committed=())
    assert snap.status(3) == "healthy"
    assert classify(snap, ALL).dead == frozenset()


@pytest.mark.parametrize(
    ("statuses", "kind"),
    [
        ({}, SnapshotKind.NONE),
        ({0: "unhealthy", 1: "unhealthy", 2: "unhealthy", 3: "unhealthy"}, SnapshotKind.ALL_UNHEALTHY),
        ({0: "dead", 1: "dead", 2: "dead", 3: "dead"}, SnapshotKind.ALL_DEAD),
        ({1: "dead"}, SnapshotKind.INCOMPLETE),
        ({1: "dead", 0: "unhealthy"}, SnapshotKind.INCOMPLETE),
        ({1: "dead", 0: "unhealthy", 2: "unhealthy", 3: "dead"}, SnapshotKind.COMPLETE),
    ],
)
def test_f10_classification(statuses: dict[int, str], kind: SnapshotKind) -> None:
    assert classify(snapshot(statuses), ALL).kind == kind


def test_collection_start_and_settle_times() -> None:
    snap = observe(FtSnapshot(), report(1, "dead"), now=10.0, dead_committed=())
    snap = observe(snap, report(0, "unhealthy"), now=12.0, dead_committed=())
    snap = observe(snap, report(0, "unhealthy"), now=15.0, dead_committed=())  # unchanged keeps first-seen
    got = classify(snap, ALL)
    assert (got.collection_started_at, got.settled_since) == (10.0, 12.0)


# == hardware (F-3, A14) ========================================================================================
def fault(card: str, *, node: str = "n1", level: int = 6) -> HardwareFault:
    return HardwareFault(node_name=node, card=card, fault_code="80E18402", level=level)


def test_f3_card_name_maps_through_device_infos() -> None:
    got = map_hardware_fault(fault("Ascend910-1"), topology())
    assert got.kind == MappingKind.MAPPED
    assert got.ranks == {1}
    on_b = map_hardware_fault(fault("Ascend910-0", node="n2"), topology())
    assert on_b.ranks == {2}


def test_a14_empty_card_name_maps_every_dp_of_the_instance_on_that_node() -> None:
    got = map_hardware_fault(fault(""), topology())
    assert got.kind == MappingKind.MAPPED
    assert got.ranks == {0, 1}


def test_f3_union_across_pods_on_one_node() -> None:
    topo = resolve_instance([registration("pod-a", (0, 1), node="n1"), registration("pod-b", (2, 3), node="n1")])
    assert map_hardware_fault(fault(""), topo).ranks == {0, 1, 2, 3}
    assert map_hardware_fault(fault("Ascend910-1"), topo).ranks == {1, 3}


@pytest.mark.parametrize("card", ["npu#4", "Ascend 910 4", "card-four", "GPU-xyz"])
def test_a14_unknown_card_name_format_is_never_guessed(card: str) -> None:
    got = map_hardware_fault(fault(card), topology())
    assert got.kind == MappingKind.UNMAPPABLE
    assert got.ranks == frozenset()


def test_a14_missing_topology_is_unmappable() -> None:
    bare = registration("pod-a", (0, 1)).model_copy(
        update={"endpoints": [EndpointInfo(id=i, ip="10.0.0.1", port=8000 + i) for i in (0, 1)]}
    )
    topo = resolve_instance([bare, registration("pod-b", (2, 3), node="n2")])
    assert map_hardware_fault(fault("Ascend910-1"), topo).kind == MappingKind.UNMAPPABLE
    nodeless = resolve_instance([registration("pod-a", (0, 1), node=""), registration("pod-b", (2, 3), node="n2")])
    assert map_hardware_fault(fault("Ascend910-1"), nodeless).kind == MappingKind.UNMAPPABLE


def test_other_nodes_and_cards_do_not_affect_the_instance() -> None:
    assert map_hardware_fault(fault("Ascend910-1", node="n9"), topology()).kind == MappingKind.NOT_AFFECTED
    assert map_hardware_fault(fault("Ascend910-7"), topology()).kind == MappingKind.NOT_AFFECTED


def test_every_mapping_reason_has_its_code_and_subject_for_the_dashboard() -> None:
    bare = registration("pod-a", (0, 1)).model_copy(
        update={"endpoints": [EndpointInfo(id=i, ip="10.0.0.1", port=8000 + i) for i in (0, 1)]}
    )
    no_devices = resolve_instance([bare, registration("pod-b", (2, 3), node="n2")])
    nodeless = resolve_instance([registration("pod-a", (0, 1), node=""), registration("pod-b", (2, 3), node="n2")])
    cases = [
        (map_hardware_fault(fault("Ascend910-1"), nodeless), "no_node_name", ""),
        (map_hardware_fault(fault("Ascend910-1", node="n9"), topology()), "node_not_in_instance", "n9"),
        (map_hardware_fault(fault(""), topology()), "node_level", ""),
        (map_hardware_fault(fault("npu#4"), topology()), "unknown_card_format", "npu#4"),
        (map_hardware_fault(fault("Ascend910-1"), no_devices), "endpoint_without_devices", "0"),
        (map_hardware_fault(fault("Ascend910-7"), topology()), "card_not_in_instance", "Ascend910-7"),
    ]
    assert [(m.reason_code, m.reason_subject) for m, _, _ in cases] == [(code, subject) for _, code, subject in cases]
    assert all(m.reason for m, _, _ in cases)  # the English sentence stays for the API and the logs
    mapped = map_hardware_fault(fault("Ascend910-1"), topology())
    assert (mapped.reason, mapped.reason_code) == ("", "")  # a mapped card needs no reason


def test_gpu_uuid_and_index() -> None:
    uuid = "GPU-5f3c0a4e-1b2c-4d5e-8f90-123456789abc"
    reg = registration("pod-a", (0, 1)).model_copy(
        update={
            "endpoints": [
                EndpointInfo(id=0, ip="10.0.0.1", port=8000, device_infos=[DeviceInfo(device_id=uuid, index=0)]),
                EndpointInfo(id=1, ip="10.0.0.1", port=8001, device_infos=[DeviceInfo(device_id="GPU-other", index=1)]),
            ]
        }
    )
    topo = resolve_instance([reg, registration("pod-b", (2, 3), node="n2")])
    assert map_hardware_fault(fault(uuid.upper()), topo).ranks == {0}
    assert map_hardware_fault(fault("1"), topo).ranks == {1}


def test_fault_keys_and_levels() -> None:
    """Multi-card same fault code keyed by (fault_code, card, node); only L4-L6 correlate (F-12)."""
    assert fault("Ascend910-0").key != fault("Ascend910-1").key
    assert fault("Ascend910-0").key != fault("Ascend910-0", node="n2").key
    assert [fault("x", level=level).correlatable for level in range(1, 7)] == [False] * 3 + [True] * 3
