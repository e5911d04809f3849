"""XID events waiting for the server (H-15): bounded, oldest dropped with a counter, resent until accepted.

The queue is the agent's only memory of an event between NVML reporting it and the server storing it, so
a server outage loses nothing within the bound. Events are idempotent on the server (unique on node,
index, xid, occurred_at), so re-sending after a lost response is safe. Thread-safe: the NVML watcher
thread appends, the heartbeat loop takes and acknowledges.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from heteroflow.agent.readings import XidEvent

DEFAULT_CAPACITY = 10_000


@dataclass(frozen=True, slots=True)
class Pending:
    seq: int
    event: XidEvent


@dataclass(frozen=True, slots=True)
class XidQueueStatus:
    pending: int
    dropped: int
    """Events discarded because the queue was full (oldest first)."""
    delivered: int


class XidQueue:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("an XID queue holds at least one event")
        self._capacity = capacity
        self._items: deque[Pending] = deque()
        self._lock = threading.Lock()
        self._next_seq = 0
        self._dropped = 0
        self._delivered = 0

    def put(self, event: XidEvent) -> None:
        with self._lock:
            if len(self._items) >= self._capacity:
                self._items.popleft()
                self._dropped += 1
            self._items.append(Pending(seq=self._next_seq, event=event))
            self._next_seq += 1

    def peek(self, limit: int) -> list[Pending]:
        """The oldest ``limit`` events, left in the queue until :meth:`ack`."""
        with self._lock:
            return [self._items[i] for i in range(min(limit, len(self._items)))]

    def ack(self, sent: list[Pending]) -> None:
        """The server stored (or definitively rejected) these: forget them."""
        done = {item.seq for item in sent}
        with self._lock:
            before = len(self._items)
            self._items = deque(item for item in self._items if item.seq not in done)
            self._delivered += before - len(self._items)

    def status(self) -> XidQueueStatus:
        with self._lock:
            return XidQueueStatus(pending=len(self._items), dropped=self._dropped, delivered=self._delivered)
