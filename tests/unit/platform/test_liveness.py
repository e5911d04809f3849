from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from heteroflow.core.ids import NodeId
from heteroflow.platform.liveness import LivenessTracker
from heteroflow.platform.nodes import is_online

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Store:
    def __init__(self, existing: set[NodeId]) -> None:
        self.existing = existing
        self.calls: list[dict[NodeId, datetime]] = []
        self.fail = False

    def record_heartbeats(self, beats: dict[NodeId, datetime]) -> set[NodeId]:
        if self.fail:
            raise ConnectionError("database down")
        self.calls.append(dict(beats))
        return set(beats) & self.existing


def test_one_flush_for_all_nodes_keeps_the_newest_and_survives_failures() -> None:
    a, b = NodeId("a"), NodeId("b")
    tracker = LivenessTracker()
    store = Store({a})
    tracker.beat(a, T0)
    tracker.beat(a, T0 + timedelta(seconds=5))
    tracker.beat(a, T0 + timedelta(seconds=1))  # out of order: never moves back
    tracker.beat(b, T0)
    store.fail = True
    failed = asyncio.run(tracker.flush(store))
    assert failed.failed
    assert tracker.status().unflushed_nodes == 2
    store.fail = False
    result = asyncio.run(tracker.flush(store))
    assert store.calls == [{a: T0 + timedelta(seconds=5), b: T0}]
    assert result.confirmed == {a}
    assert result.missing == {b}  # deleted elsewhere: forgotten here
    assert tracker.last_seen(b) is None
    assert tracker.status().flushes_total == 1
    assert asyncio.run(tracker.flush(store)).confirmed == set()  # nothing new: no statement
    assert len(store.calls) == 1


def test_is_online() -> None:
    window = timedelta(seconds=30)
    assert is_online(T0, now=T0 + window, offline_after=window)
    assert not is_online(T0, now=T0 + window + timedelta(microseconds=1), offline_after=window)
    assert not is_online(None, now=T0, offline_after=window)
