"""The NodeManager ⇄ controller contract: models validate, F-4's completeness rule."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from heteroflow.contracts import serving as wire


@pytest.mark.parametrize(
    ("reported", "retired", "enabled", "complete"),
    [
        ({0, 1}, set(), False, True),
        ({0}, set(), False, False),  # baseline: the complete set is required
        ({0}, {1}, False, False),  # scale-down off knows no retired ranks
        ({0}, {1}, True, True),
        ({0, 1}, {1}, True, False),  # a retired rank must not be reported
        (set(), {0, 1}, True, True),  # empty only when every local rank is committed
        (set(), {1}, True, False),
        ({0, 1}, set(), True, True),
    ],
)
def test_heartbeat_completeness(reported: set[int], retired: set[int], enabled: bool, complete: bool) -> None:
    assert (
        wire.heartbeat_complete(reported=reported, expected={0, 1}, retired=retired, scale_down_enabled=enabled)
        is complete
    )


@pytest.mark.parametrize("lease", [0, -1, 3601, "nan"])
def test_guard_lease_bounds(lease: object) -> None:
    with pytest.raises(ValidationError):
        wire.GuardRequest.model_validate({"request_id": "r", "lease_sec": lease})
    assert wire.GuardRequest(request_id="r", lease_sec=3600).lease_sec == 3600


def test_rank_lists_are_distinct_non_negative_and_sorted() -> None:
    assert wire.FinalizeRequest(request_id="r", commit=True, retired_endpoint_ids=[3, 1]).retired_endpoint_ids == [1, 3]
    for bad in ([1, 1], [-1]):
        with pytest.raises(ValidationError):
            wire.FinalizeRequest(request_id="r", commit=True, retired_endpoint_ids=bad)
    with pytest.raises(ValidationError):
        wire.FtStatusRequest(endpoint_ids=[])


def test_strict_bodies_refuse_unknown_fields_and_loose_types() -> None:
    with pytest.raises(ValidationError):
        wire.FinalizeRequest.model_validate({"request_id": "r", "commit": "yes"})
    with pytest.raises(ValidationError):
        wire.NmApplyRequest.model_validate({"instruction": "scale_down", "request_id": "r", "params": {"x": 1}})
    with pytest.raises(ValidationError):
        wire.NmApplyRequest.model_validate(
            {"instruction": "scale_down", "request_id": "r", "params": {"dp_store_port": 1}}
        )  # the NodeManager fills dp_store_port; the controller never sends it


def test_report_round_trips_as_json() -> None:
    report = wire.SoftwareFaultReport(
        instance_id="i",
        pod_id="p",
        endpoint_id=2,
        status="dead",
        evidence=wire.FaultEvidence.ENGINE_DEAD,
        identity=wire.EngineIdentity(pid=10, start_time=1.5),
        observed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert wire.SoftwareFaultReport.model_validate_json(report.model_dump_json()) == report
