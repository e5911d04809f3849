"""What clients saw while the engines were faulted: one entry per *disturbed* request, and the counts of a time
window (``GET /coordinator/client_outcomes``, behind the cluster token; the controller asks it for each round).

A request is disturbed when it was *held* (no endpoint it could use was published: it waited for a publication
or a fault pause), *re-routed* (an engine answered with a fault and it was sent to another), *resumed* (its
stream was cut and continued on another engine) or *failed* (the client got an error: 503 past the client
deadline, or a stream that ended with an error event). A request may be several of these (held, then re-routed).
Its *wait* is the time from its arrival until an engine started answering it, or until it failed;
``longest_wait_sec`` is ``None`` when no request in the window was disturbed.

Undisturbed requests are never logged. The log is bounded (the oldest entries go first); the summary says how
many entries the log dropped, so that a count over a window the log no longer covers is not read as complete.
No I/O.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

LOG_SIZE = 10_000


@dataclass(slots=True)
class Disturbance:
    """One request's trouble, filled in by the forwarder as it happens (wall-clock seconds)."""

    model: str
    arrived_at: float
    instances: set[str] = field(default_factory=set)
    held: bool = False
    rerouted: bool = False
    resumed: bool = False
    failed: bool = False
    wait_sec: float = 0.0
    ended_at: float | None = None

    @property
    def disturbed(self) -> bool:
        return self.held or self.rerouted or self.resumed or self.failed


class ClientOutcomes:
    """The bounded log of disturbed requests and its window counts."""

    def __init__(self, size: int = LOG_SIZE) -> None:
        self._log: deque[Disturbance] = deque(maxlen=size)
        self._lock = threading.Lock()
        self._dropped = 0
        self._oldest_dropped_end: float | None = None

    def record(self, entry: Disturbance) -> None:
        """Keep ``entry`` if it was disturbed (it has ended: ``ended_at`` is set)."""
        if not entry.disturbed:
            return
        with self._lock:
            if len(self._log) == self._log.maxlen:
                gone = self._log[0]
                self._dropped += 1
                end = gone.ended_at if gone.ended_at is not None else gone.arrived_at
                self._oldest_dropped_end = (
                    end if self._oldest_dropped_end is None else max(self._oldest_dropped_end, end)
                )
            self._log.append(entry)

    def summary(
        self, *, since: float, until: float, model: str | None = None, instance_id: str | None = None
    ) -> dict[str, Any]:
        """Counts of the disturbed requests that overlapped ``[since, until]`` (wall-clock seconds), of ``model``
        and/or touching ``instance_id`` when given; ``complete`` is False when the log dropped entries that may
        have been in the window."""
        held = rerouted = resumed = failed = 0
        longest: float | None = None
        with self._lock:
            entries = list(self._log)
            complete = self._oldest_dropped_end is None or self._oldest_dropped_end < since
        for entry in entries:
            end = entry.ended_at if entry.ended_at is not None else entry.arrived_at
            if end < since or entry.arrived_at > until:
                continue
            if (model is not None or instance_id is not None) and not (
                entry.model == model or (instance_id is not None and instance_id in entry.instances)
            ):
                continue
            held += entry.held
            rerouted += entry.rerouted
            resumed += entry.resumed
            failed += entry.failed
            longest = entry.wait_sec if longest is None else max(longest, entry.wait_sec)
        return {
            "held": held,
            "rerouted": rerouted,
            "resumed": resumed,
            "failed": failed,
            "longest_wait_sec": round(longest, 3) if longest is not None else None,
            "complete": complete,
        }
