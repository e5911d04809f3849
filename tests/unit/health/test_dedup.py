from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.dedup import DedupCache
from heteroflow.health.samples import CardKey, HealthReading, StoredSample

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def key(node: str = "n", index: int = 0) -> CardKey:
    return CardKey(node_id=NodeId(node), gpu_index=index, source="real")


def row(k: CardKey, at: float = 0, value: int = 1) -> StoredSample:
    return StoredSample(key=k, uuid="G", sampled_at=T0 + timedelta(seconds=at), counters=Counters(retired_pages=value))


def reading(k: CardKey, at: float, value: int = 1) -> HealthReading:
    return HealthReading(key=k, uuid="G", sampled_at=T0 + timedelta(seconds=at), counters=Counters(retired_pages=value))


def cache(**kw: float) -> DedupCache:
    return DedupCache(
        keepalive=timedelta(minutes=5), max_entries=int(kw.get("max_entries", 4096)), idle_sec=kw.get("idle", 1800)
    )


def test_skip_only_what_a_confirmed_row_proves_unchanged() -> None:
    c = cache()
    assert not c.can_skip(reading(key(), 5), now=0)  # nothing confirmed: never guess
    c.confirm(row(key()), now=0)
    assert c.can_skip(reading(key(), 5), now=1)
    assert not c.can_skip(reading(key(), 5, value=2), now=1)
    assert not c.can_skip(reading(key(), 300), now=1)  # keepalive from the stored row


def test_lru_bound_and_idle_eviction() -> None:
    c = cache(max_entries=2, idle=60)
    for i in range(3):
        c.confirm(row(key(index=i)), now=0)
    assert len(c) == 2
    assert c.capacity_evictions == 1
    assert c.get(key(index=0), now=0) is None  # least recently used went first
    assert c.get(key(index=2), now=61) is None  # idle too long
    c.confirm(row(key(index=5)), now=100)
    assert c.evict_idle(now=200) >= 1
    assert len(c) == 0


def test_idle_eviction_drops_exactly_the_entries_unused_for_the_idle_time() -> None:
    c = cache(idle=60)
    for i in range(5):
        c.confirm(row(key(index=i)), now=i * 10)  # used at 0, 10, 20, 30, 40
    assert c.get(key(index=0), now=45) is not None  # used again: no longer among the oldest
    c.confirm(row(key(index=1), at=5, value=2), now=46)  # a newer row confirmed: used again too
    assert c.evict_idle(now=95) == 2  # indexes 2 (20) and 3 (30) are idle for more than 60 s at 95; 4 (40) is not
    assert c.evict_idle(now=95) == 0
    assert [i for i in range(5) if c.get(key(index=i), now=95) is not None] == [0, 1, 4]


def test_a_late_older_confirmation_never_replaces_a_newer_row() -> None:
    c = cache()
    c.confirm(row(key(), at=10, value=2), now=0)
    c.confirm(row(key(), at=0, value=1), now=1)
    cached = c.get(key(), now=2)
    assert cached is not None
    assert cached.counters.retired_pages == 2


def test_forget_node() -> None:
    c = cache()
    c.confirm(row(key("a")), now=0)
    c.confirm(row(key("b")), now=0)
    c.forget_node(NodeId("a"))
    assert c.get(key("a"), now=0) is None
    assert c.get(key("b"), now=0) is not None


def test_a_use_makes_nothing_the_collector_tracks() -> None:
    """Every steady beat uses each of its cards' entries: a fleet's worth of new tracked objects per beat
    interval would be walked by every collection meanwhile."""
    c = cache()
    keys = [key(f"n{i}", g) for i in range(50) for g in range(8)]
    for k in keys:
        c.confirm(row(k), now=0)
    c.get(keys[0], now=0.5)  # whatever a first use makes once (a float, a dict resize) is made now
    gc.collect()
    gc.disable()
    try:
        young = len(gc.get_objects(generation=0))  # tracked, and made since the collection
        for k in keys:
            assert c.get(k, now=1.0) is not None
        assert len(gc.get_objects(generation=0)) == young
    finally:
        gc.enable()
    assert c.evict_idle(now=1.0 + 1800.5) == len(keys)
    assert len(c) == 0
