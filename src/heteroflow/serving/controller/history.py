"""Every round's evidence timeline (``serving-ft.md`` APIs and F-60), kept in memory for the status API.

One :class:`RoundRecord` per request id: the fault evidence that started it, each phase change, the gate,
guard, status polls, DEL, apply bodies with the HTTP codes, probes, finalize, ADD, pod stops and the
outcome, each with wall-clock and monotonic times. Bounded: the oldest rounds are dropped first. A restarted
controller starts with an empty history (the store keeps only F-32's subset on purpose).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from heteroflow.core.clock import Clock

ROUNDS_KEPT = 256
EVENTS_PER_ROUND = 500


@dataclass
class RoundRecord:
    request_id: str
    instance_id: str
    kind: str
    """``scale_down``, ``fast_recovery`` or ``fallback``."""
    started_at: datetime
    started_monotonic: float
    events: list[dict[str, Any]] = field(default_factory=list)
    outcome: str | None = None
    """``committed``, ``failed``, ``succeeded`` or ``None`` while running."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    dropped_events: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "instance_id": self.instance_id,
            "kind": self.kind,
            "started_at": self.started_at.isoformat(),
            "outcome": self.outcome,
            "stage_seconds": dict(self.stage_seconds),
            "events": list(self.events),
            "dropped_events": self.dropped_events,
        }


class RoundHistory:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._rounds: OrderedDict[str, RoundRecord] = OrderedDict()

    def begin(self, request_id: str, *, instance_id: str, kind: str) -> RoundRecord:
        """A new record; :class:`ValueError` for an id already kept (one id is one round's timeline)."""
        if request_id in self._rounds:
            raise ValueError(f"round {request_id!r} is already recorded")
        record = RoundRecord(
            request_id=request_id,
            instance_id=instance_id,
            kind=kind,
            started_at=self._clock.now(),
            started_monotonic=self._clock.monotonic(),
        )
        self._rounds[request_id] = record
        while len(self._rounds) > ROUNDS_KEPT:
            self._rounds.popitem(last=False)
        return record

    def add(self, request_id: str | None, kind: str, **detail: Any) -> None:
        record = self._rounds.get(request_id) if request_id else None
        if record is None:
            return
        if len(record.events) >= EVENTS_PER_ROUND:
            record.dropped_events += 1
            return
        now = self._clock.monotonic()
        record.events.append(
            {
                "at": self._clock.now().isoformat(),
                "t_sec": round(now - record.started_monotonic, 4),
                "kind": kind,
                **detail,
            }
        )

    def stage(self, request_id: str, stage: str, seconds: float) -> None:
        record = self._rounds.get(request_id)
        if record is not None:
            record.stage_seconds[stage] = round(seconds, 4)

    def finish(self, request_id: str, outcome: str) -> None:
        record = self._rounds.get(request_id)
        if record is not None:
            record.outcome = outcome
            self.add(request_id, "outcome", outcome=outcome)

    def get(self, request_id: str) -> RoundRecord | None:
        return self._rounds.get(request_id)

    def for_instance(self, instance_id: str, *, limit: int = 20) -> list[RoundRecord]:
        found = [r for r in self._rounds.values() if r.instance_id == instance_id]
        return found[-limit:]
