"""The dedup cache: per card, the newest row the store confirmed (H-23).

A steady heartbeat (same counters, same uuid, stored row younger than the keepalive) is skipped with zero
database access. The cache only ever says "safe to skip": it is filled from what the store reported (a row
it inserted or a row a SELECT returned), never from what a heartbeat claimed. Losing an entry costs one
SELECT, never a wrong skip. Caches are per process; with several servers the worst case is one extra
keepalive row with identical counters.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from datetime import timedelta

from heteroflow.core.ids import NodeId
from heteroflow.health.samples import CardKey, HealthReading, StoredSample
from heteroflow.health.write_policy import decide_write

DEFAULT_MAX_ENTRIES = 4096  # 512 nodes x 8 cards
DEFAULT_IDLE_SEC = 30 * 60


class DedupCache:
    """LRU of :class:`StoredSample` by :class:`CardKey`, with idle eviction on a monotonic clock.

    A use moves the entry to the end and writes its time into a dict of floats: no object the garbage
    collector tracks is made per card and beat (a (sample, time) pair per use was: a fleet's worth, each
    living a beat's interval, walked by every collection that ran meanwhile)."""

    def __init__(
        self,
        *,
        keepalive: timedelta,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        idle_sec: float = DEFAULT_IDLE_SEC,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self._keepalive = keepalive
        self._max = max_entries
        self._idle = idle_sec
        self._entries: OrderedDict[CardKey, StoredSample] = OrderedDict()
        """In order of last use, oldest first."""
        self._used: dict[CardKey, float] = {}
        """When each entry was last used (monotonic seconds)."""
        self.capacity_evictions = 0
        """Entries pushed out by the size bound: steadily rising means the cache is smaller than the fleet
        (cards = nodes x GPUs) and steady beats are costing SELECTs."""

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CardKey, *, now: float) -> StoredSample | None:
        sample = self._entries.get(key)
        if sample is None:
            return None
        if now - self._used[key] > self._idle:
            del self._entries[key], self._used[key]
            return None
        self._used[key] = now
        self._entries.move_to_end(key)
        return sample

    def can_skip(self, reading: HealthReading, *, now: float) -> bool:
        """True only when the cached stored row proves this reading needs no write."""
        latest = self.get(reading.key, now=now)
        return latest is not None and decide_write(reading, latest, keepalive=self._keepalive) is None

    def confirm(self, sample: StoredSample, *, now: float) -> None:
        """Record a row the store reported as the newest of its card."""
        current = self._entries.get(sample.key)
        if current is not None and current.sampled_at > sample.sampled_at:
            return  # an older confirmation arriving late never replaces a newer one
        self._entries[sample.key] = sample
        self._used[sample.key] = now
        self._entries.move_to_end(sample.key)
        while len(self._entries) > self._max:
            del self._used[self._entries.popitem(last=False)[0]]
            self.capacity_evictions += 1

    def evict_idle(self, *, now: float) -> int:
        """Drop the entries unused for longer than the idle time; the number dropped.

        The entries are in order of last use (every use moves its entry to the end, on one monotonic clock), so
        the idle ones are at the front: the scan stops at the first entry in use and costs the evicted entries,
        not the fleet. The writer calls this whenever it runs out of work, which at 24,000 cards was a scan of
        every entry on the event loop several times a second.
        """
        evicted = 0
        while self._entries:
            key = next(iter(self._entries))
            if now - self._used[key] <= self._idle:
                break
            del self._entries[key], self._used[key]
            evicted += 1
        return evicted

    def forget(self, keys: Iterable[CardKey]) -> None:
        for key in keys:
            self._entries.pop(key, None)
            self._used.pop(key, None)

    def forget_node(self, node_id: NodeId) -> None:
        self.forget([key for key in self._entries if key.node_id == node_id])
