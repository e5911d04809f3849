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
TIMES = ("fault_at", "decided_at", "committed_at", "serving_resumed_at")
"""The moments a round keeps as absolute times: the first fault evidence, the decision, the commit (a scale-down's
commit, a fallback's relaunch succeeding, a fast recovery succeeding) and the serving view published again."""
SUCCEEDED = frozenset({"committed", "succeeded"})
"""The outcomes after which the instance serves again (its view is published once its pods are ready)."""


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
    trigger: dict[str, Any] | None = None
    """What started the round, as the decision saw it (:mod:`.trigger`): the reason code, each rank's engine
    status and evidence, the hardware faults; ``None`` when no decision preceded it (unknown, never empty)."""
    times: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(TIMES))
    """Absolute wall-clock times (ISO 8601) of :data:`TIMES`; ``None`` until that moment came."""
    clients: dict[str, Any] | None = None
    """What the Coordinator's clients saw during the round (``held``, ``rerouted``, ``resumed``, ``failed``,
    ``longest_wait_sec``, ``as_of``, ``error``); ``None`` until it was asked."""

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
            "trigger": self.trigger,
            "times": dict(self.times),
            "clients": self.clients,
        }


class RoundHistory:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._rounds: OrderedDict[str, RoundRecord] = OrderedDict()

    def begin(
        self, request_id: str, *, instance_id: str, kind: str, trigger: dict[str, Any] | None = None
    ) -> RoundRecord:
        """A new record; :class:`ValueError` for an id already kept (one id is one round's timeline).
        ``trigger``: what the decision saw (its ``fault_at`` and ``decided_at`` become the round's times)."""
        if request_id in self._rounds:
            raise ValueError(f"round {request_id!r} is already recorded")
        record = RoundRecord(
            request_id=request_id,
            instance_id=instance_id,
            kind=kind,
            started_at=self._clock.now(),
            started_monotonic=self._clock.monotonic(),
            trigger=trigger,
        )
        if trigger is not None:
            for name in ("fault_at", "decided_at"):
                value = trigger.get(name)
                record.times[name] = value if isinstance(value, str) else None
        if record.times["decided_at"] is None:
            record.times["decided_at"] = record.started_at.isoformat()
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

    def mark(self, request_id: str | None, moment: str) -> None:
        """Keep the first time ``moment`` (one of :data:`TIMES`) came for this round; later ones are ignored."""
        if moment not in TIMES:
            raise ValueError(f"unknown round moment {moment!r}")
        record = self._rounds.get(request_id) if request_id else None
        if record is not None and record.times.get(moment) is None:
            record.times[moment] = self._clock.now().isoformat()

    def serving_resumed(self, instance_id: str) -> None:
        """The instance's view was published again: the newest round of the instance, when it succeeded and no
        publication was kept for it yet, keeps this as its ``serving_resumed_at`` (a relaunched instance is
        published by the periodic SET once its pods are ready, after the round's own end)."""
        newest = next((r for r in reversed(self._rounds.values()) if r.instance_id == instance_id), None)
        if newest is not None and newest.outcome in SUCCEEDED and newest.times.get("serving_resumed_at") is None:
            newest.times["serving_resumed_at"] = self._clock.now().isoformat()

    def set_clients(self, request_id: str, clients: dict[str, Any]) -> None:
        record = self._rounds.get(request_id)
        if record is not None:
            record.clients = clients

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
