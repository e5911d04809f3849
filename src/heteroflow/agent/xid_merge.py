"""One XID, reported once, when two sources see it: NVML events and the kernel log. Thread-safe, no I/O.

The driver reports each XID both ways. Two reports are the same XID when they name the same card and the same
code and *arrived* within a small window of each other (arrival, not the record's time: the kernel log's
clock — boot time plus microseconds since boot — can drift from the wall clock over a long uptime). Matching
is one-to-one, so a burst of the same XID (XID 13 often comes in threes) stays a burst.

The kernel log's record wins: its time is stable across agent restarts (a record re-read from the ring buffer
after a restart gets the same time, and the server stores each (node, card, xid, time) once), while an NVML
event's time is the moment the agent heard it. So while the kernel log is read, an NVML event is held up to the
window waiting for its kernel record; one that none matches is passed on with its own time.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from heteroflow.agent.readings import XidEvent

XidSource = Literal["nvml", "kernel_log"]
DEFAULT_WINDOW_SEC: Final = 5.0
MAX_REMEMBERED: Final = 4096


@dataclass(slots=True)
class _Seen:
    event: XidEvent
    arrived: float


class XidMerger:
    def __init__(
        self,
        *,
        sink: Callable[[XidEvent], None],
        monotonic: Callable[[], float],
        window_sec: float = DEFAULT_WINDOW_SEC,
    ) -> None:
        self._sink = sink
        self._monotonic = monotonic
        self._window = window_sec
        self._lock = threading.Lock()
        self._held: deque[_Seen] = deque()
        self._recent: dict[XidSource, deque[_Seen]] = {
            "nvml": deque(maxlen=MAX_REMEMBERED),
            "kernel_log": deque(maxlen=MAX_REMEMBERED),
        }
        self._hold_nvml = False
        self.duplicates = 0
        """Reports dropped because the other source had already reported the same XID."""

    def hold_nvml_events(self, hold: bool) -> None:
        """Hold NVML events for the window (only while the kernel log is being read)."""
        with self._lock:
            self._hold_nvml = hold
        if not hold:
            self.flush(force=True)

    @staticmethod
    def _take(pool: deque[_Seen], event: XidEvent) -> bool:
        for seen in pool:
            if seen.event.index == event.index and seen.event.xid == event.xid:
                pool.remove(seen)
                return True
        return False

    def _prune(self, now: float) -> None:
        for pool in self._recent.values():
            while pool and now - pool[0].arrived > self._window:
                pool.popleft()

    def offer(self, source: XidSource, event: XidEvent) -> None:
        now = self._monotonic()
        out: list[XidEvent] = []
        with self._lock:
            self._prune(now)
            other: XidSource = "kernel_log" if source == "nvml" else "nvml"
            if source == "kernel_log" and self._take(self._held, event):
                self.duplicates += 1  # the held NVML report is this one: the kernel record replaces it
                out.append(event)
            elif self._take(self._recent[other], event):
                self.duplicates += 1
            elif source == "nvml" and self._hold_nvml:
                self._held.append(_Seen(event, now))
            else:
                self._recent[source].append(_Seen(event, now))
                out.append(event)
            out.extend(self._due(now, force=False))
        for item in out:
            self._sink(item)

    def _due(self, now: float, *, force: bool) -> list[XidEvent]:
        due: list[XidEvent] = []
        while self._held and (force or now - self._held[0].arrived >= self._window):
            seen = self._held.popleft()
            self._recent["nvml"].append(_Seen(seen.event, now))
            due.append(seen.event)
        return due

    def flush(self, *, force: bool = False) -> None:
        """Pass on the NVML events no kernel record matched within the window (``force``: all held ones)."""
        now = self._monotonic()
        with self._lock:
            self._prune(now)
            due = self._due(now, force=force)
        for item in due:
            self._sink(item)

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)
