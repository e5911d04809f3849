from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.agent.backoff import backoff_delay, retry_delay
from heteroflow.agent.freshness import Cached, fresh, freshness_limit
from heteroflow.agent.readings import HealthCollection, XidEvent
from heteroflow.agent.xid_queue import XidQueue

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_freshness_is_three_collection_periods() -> None:
    assert freshness_limit(60) == 180
    cached = Cached(value=HealthCollection(collector="nvml", collected_at=T0), at_monotonic=100.0)
    assert fresh(cached, now_monotonic=280.0, interval_sec=60) is cached.value
    assert fresh(cached, now_monotonic=280.001, interval_sec=60) is None
    assert fresh(None, now_monotonic=0.0, interval_sec=60) is None


def event(n: int) -> XidEvent:
    return XidEvent(index=0, uuid=None, xid=n, occurred_at=T0)


def test_the_queue_drops_the_oldest_and_counts() -> None:
    queue = XidQueue(capacity=3)
    for n in range(5):
        queue.put(event(n))
    assert [p.event.xid for p in queue.peek(10)] == [2, 3, 4]
    assert queue.status().dropped == 2


def test_only_acknowledged_events_leave_the_queue() -> None:
    queue = XidQueue(capacity=10)
    for n in range(3):
        queue.put(event(n))
    sent = queue.peek(2)
    queue.put(event(3))
    queue.ack(sent)
    assert [p.event.xid for p in queue.peek(10)] == [2, 3]
    assert queue.status().delivered == 2


def test_a_queue_holds_at_least_one_event() -> None:
    with pytest.raises(ValueError, match="at least one"):
        XidQueue(capacity=0)


@given(st.lists(st.sampled_from(["put", "peek_ack", "peek"]), max_size=60), st.integers(1, 8))
def test_queue_invariants(ops: list[str], capacity: int) -> None:
    queue = XidQueue(capacity=capacity)
    put = 0
    for op in ops:
        if op == "put":
            queue.put(event(put))
            put += 1
        elif op == "peek_ack":
            queue.ack(queue.peek(2))
        else:
            queue.peek(3)
        status = queue.status()
        assert status.pending <= capacity
        assert status.pending + status.dropped + status.delivered == put
        xids = [p.event.xid for p in queue.peek(capacity)]
        assert xids == sorted(xids)  # oldest first, always


def test_backoff_doubles_and_caps() -> None:
    assert [backoff_delay(n, initial_sec=1, max_sec=30) for n in range(8)] == [0, 1, 2, 4, 8, 16, 30, 30]
    assert backoff_delay(10_000, initial_sec=1, max_sec=30) == 30


def test_retry_after_is_a_floor_under_the_backoff_capped_by_its_maximum() -> None:
    assert retry_delay(1, retry_after_sec=None, initial_sec=1, max_sec=30) == 1
    assert (
        retry_delay(1, retry_after_sec=5, initial_sec=1, max_sec=30) == 5
    )  # an overloaded server's "come back in 5 s"
    assert retry_delay(5, retry_after_sec=5, initial_sec=1, max_sec=30) == 16  # the backoff is already longer
    assert retry_delay(1, retry_after_sec=3600, initial_sec=1, max_sec=30) == 30
