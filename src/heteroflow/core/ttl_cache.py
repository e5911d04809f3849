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
    def __init__(self, *, ttl_sec: float, max_entries: int) -> None:
        self._ttl = ttl_sec
        self._max = max_entries
        self._entries: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K, *, now: float) -> V | None:
        """The value if it was confirmed within the time to live, else ``None``."""
        entry = self._entries.get(key)
        if entry is None or now - entry[1] > self._ttl:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def get_stale(self, key: K) -> V | None:
        """The value whatever its age (for when it cannot be re-confirmed)."""
        entry = self._entries.get(key)
        return entry[0] if entry is not None else None

    def put(self, key: K, value: V, *, now: float) -> None:
        self._entries[key] = (value, now)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def touch(self, keys: Iterable[K], *, now: float) -> None:
        """Mark entries as confirmed now (keys not cached are ignored)."""
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries[key] = (entry[0], now)

    def keys(self) -> list[K]:
        return list(self._entries)

    def discard(self, key: K) -> None:
        self._entries.pop(key, None)
