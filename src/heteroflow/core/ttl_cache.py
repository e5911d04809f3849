"""A small LRU whose entries are fresh for a time to live (on a monotonic clock).

Expired entries are kept (until pushed out by the size bound) because a stale answer is sometimes the
right one: when the database is down, a heartbeat from a node verified a minute ago is still accepted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """The values, in LRU order, and apart from them the time each was last confirmed: confirming a fleet's
    entries (every liveness flush) writes a float per entry and makes no object that the collector tracks; a
    (value, time) pair per entry and flush was thousands of new objects every few seconds, each living until the
    next flush, which the young collections walked and promoted."""

    def __init__(self, *, ttl_sec: float, max_entries: int) -> None:
        self._ttl = ttl_sec
        self._max = max_entries
        self._values: OrderedDict[K, V] = OrderedDict()
        self._confirmed: dict[K, float] = {}

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: K, *, now: float) -> V | None:
        """The value if it was confirmed within the time to live, else ``None``."""
        value = self._values.get(key)
        if value is None or now - self._confirmed[key] > self._ttl:
            return None
        self._values.move_to_end(key)
        return value

    def get_stale(self, key: K) -> V | None:
        """The value whatever its age (for when it cannot be re-confirmed)."""
        return self._values.get(key)

    def put(self, key: K, value: V, *, now: float) -> None:
        self._values[key] = value
        self._values.move_to_end(key)
        self._confirmed[key] = now
        while len(self._values) > self._max:
            dropped, _ = self._values.popitem(last=False)
            del self._confirmed[dropped]

    def touch(self, keys: Iterable[K], *, now: float) -> None:
        """Mark entries as confirmed now (keys not cached are ignored)."""
        confirmed = self._confirmed
        for key in keys:
            if key in confirmed:
                confirmed[key] = now

    def keys(self) -> list[K]:
        return list(self._values)

    def discard(self, key: K) -> None:
        self._values.pop(key, None)
        self._confirmed.pop(key, None)
