"""The heartbeat's answer, put together from parts for a beat without XID events, is what its model renders."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from heteroflow.contracts.heartbeat import HeartbeatAccepted, XidEventsResult
from heteroflow.platform_server.routes.nodes import NO_XID_EVENTS, accepted_json


@pytest.mark.parametrize(
    "at",
    [
        datetime(2026, 3, 1, 12, 0, 5, 123456, tzinfo=UTC),
        datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC),  # no fraction
        datetime(2026, 3, 1, 12, 0, 5, 1, tzinfo=timezone(timedelta(hours=8))),
    ],
)
def test_the_answer_without_xid_events_is_the_models(at: datetime) -> None:
    expected = HeartbeatAccepted(server_time=at, xid_events=NO_XID_EVENTS).model_dump_json().encode()
    assert accepted_json(at, NO_XID_EVENTS) == expected
    # an answer about events is the model's own
    result = XidEventsResult(received=2, stored=1, rejected=["xid_events[1]: bad"], retry=False)
    assert accepted_json(at, result) == HeartbeatAccepted(server_time=at, xid_events=result).model_dump_json().encode()
    assert b'"received":2' in accepted_json(at, result)
