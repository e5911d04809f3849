"""The round history keeps one timeline per request id and never merges two rounds into one."""

from __future__ import annotations

from datetime import datetime

import pytest

from heteroflow.core.testing import FakeClock
from heteroflow.serving.controller import trigger
from heteroflow.serving.controller.core.normalizer import HardwareEvent, HardwareFault, HardwareMapping, MappingKind
from heteroflow.serving.controller.core.ranks import DpRank
from heteroflow.serving.controller.history import RoundHistory
from heteroflow.serving.controller.instance import Instance
from tests.unit.serving.controller.helpers import INSTANCE, runtime, snapshot, topology


def test_an_id_already_recorded_is_refused_and_the_first_timeline_is_kept() -> None:
    history = RoundHistory(FakeClock())
    history.begin("fb-1", instance_id="inst-1", kind="fallback")
    history.add("fb-1", "fallback", strategy="InstanceReconfiguration")
    with pytest.raises(ValueError, match="already recorded"):
        history.begin("fb-1", instance_id="inst-2", kind="fallback")
    record = history.get("fb-1")
    assert record is not None
    assert record.instance_id == "inst-1"
    assert [event["kind"] for event in record.as_json()["events"]] == ["fallback"]


def test_a_round_keeps_its_trigger_its_absolute_times_and_what_clients_saw() -> None:
    clock = FakeClock()
    history = RoundHistory(clock)
    trigger = {
        "reason": "COMPLETE_SNAPSHOT",
        "fault_at": "2026-01-01T00:00:00+00:00",
        "decided_at": "2026-01-01T00:00:01+00:00",
    }
    history.begin("sd-1", instance_id="inst-1", kind="scale_down", trigger=trigger)
    clock.advance(2.0)
    history.mark("sd-1", "committed_at")
    committed = clock.now().isoformat()
    clock.advance(1.0)
    history.mark("sd-1", "committed_at")  # the first time is kept
    history.mark("sd-1", "serving_resumed_at")
    history.set_clients("sd-1", {"held": 2, "rerouted": 1, "resumed": 0, "failed": 0, "longest_wait_sec": 7.5})
    found = history.get("sd-1")
    assert found is not None
    shown = found.as_json()
    assert shown["trigger"] == trigger
    assert shown["times"] == {
        "fault_at": "2026-01-01T00:00:00+00:00",
        "decided_at": "2026-01-01T00:00:01+00:00",
        "committed_at": committed,
        "serving_resumed_at": clock.now().isoformat(),
    }
    assert shown["clients"]["longest_wait_sec"] == 7.5
    with pytest.raises(ValueError, match="unknown round moment"):
        history.mark("sd-1", "lunch_at")


def test_a_round_without_a_decision_has_no_trigger_and_its_start_as_decision_time() -> None:
    clock = FakeClock()
    history = RoundHistory(clock)
    record = history.begin("fb-2", instance_id="inst-1", kind="fallback")
    shown = record.as_json()
    assert shown["trigger"] is None  # unknown, never an empty trigger
    assert shown["clients"] is None  # not asked yet
    assert shown["times"]["decided_at"] == record.started_at.isoformat()
    assert shown["times"]["fault_at"] is None
    assert shown["times"]["serving_resumed_at"] is None


def test_the_trigger_names_each_ranks_evidence_engine_status_and_the_standing_fault() -> None:
    clock = FakeClock()
    inst = Instance(instance_id=INSTANCE, topology=topology(), runtime=runtime())
    inst.evidence.snapshot = snapshot({1: "dead"}, at=clock.monotonic())
    inst.evidence.engine_statuses[1] = "dead"
    inst.evidence.engine_statuses[0] = "running"
    fault = HardwareFault(node_name="n1", card="1", fault_code="XID_79", level=6)
    inst.evidence.hardware.append(
        HardwareEvent(
            fault=fault,
            mapping=HardwareMapping(MappingKind.MAPPED, frozenset({DpRank(1)})),
            received_at=clock.monotonic(),
        )
    )
    inst.standing.faults[fault.key] = fault
    clock.advance(0.5)
    found = trigger.capture(clock, inst, decision="StartScaleDown:COMPLETE_SNAPSHOT", reason="COMPLETE_SNAPSHOT")
    rows = {row["rank"]: row for row in found["ranks"]}
    assert rows[1]["health"] == "dead"
    assert rows[1]["engine"] == "dead"
    assert rows[1]["evidence"] == "FT_STATUS"
    assert rows[0] == {"rank": 0, "health": "healthy", "engine": "running", "evidence": None, "first_seen_at": None}
    assert rows[2]["engine"] is None  # never reported: unknown, not healthy-looking
    [hw] = found["hardware"]
    assert (hw["key"], hw["mapping"], hw["ranks"], hw["standing"]) == (fault.key, "MAPPED", [1], True)
    # monotonic evidence times become absolute: the fault came half a second before the decision
    fault_at = datetime.fromisoformat(found["fault_at"])
    decided_at = datetime.fromisoformat(found["decided_at"])
    assert (decided_at - fault_at).total_seconds() == pytest.approx(0.5)
    assert found["reason"] == "COMPLETE_SNAPSHOT"


def test_a_later_publication_is_the_serving_resumed_time_of_the_newest_succeeded_round_only() -> None:
    clock = FakeClock()
    history = RoundHistory(clock)
    history.begin("sd-1", instance_id="inst-1", kind="scale_down")
    history.finish("sd-1", "failed")
    history.serving_resumed("inst-1")  # a failed round never resumed serving
    record = history.get("sd-1")
    assert record is not None
    assert record.times["serving_resumed_at"] is None
    history.begin("fb-1", instance_id="inst-1", kind="fallback")
    history.serving_resumed("inst-1")  # still running: not yet
    history.finish("fb-1", "succeeded")
    clock.advance(4.0)
    history.serving_resumed("inst-1")  # the periodic SET once the relaunched pods are ready
    first = clock.now().isoformat()
    clock.advance(2.0)
    history.serving_resumed("inst-1")  # later SETs keep the first time
    fallback = history.get("fb-1")
    assert fallback is not None
    assert fallback.times["serving_resumed_at"] == first
    assert record.times["serving_resumed_at"] is None
