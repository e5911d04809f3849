"""What a round keeps of why it started: the decision's reason code, each rank's engine status and evidence at
that moment, and the hardware faults (the events the decision held and the standing ones).

Captured by the strategy center when a decision starts a strategy (before the round resets the evidence), kept
on the instance until the round's record is begun, and shown by the status API's round record (``trigger``).
Monotonic evidence times become absolute (wall-clock) times here: ``fault_at`` is the first evidence's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from heteroflow.core.clock import Clock
from heteroflow.serving.controller.core.ranks import DpRank
from heteroflow.serving.controller.instance import Instance


def _wall(now_wall: datetime, now_mono: float, mono: float) -> datetime:
    return now_wall - timedelta(seconds=max(0.0, now_mono - mono))


def capture(clock: Clock, inst: Instance, *, decision: str, reason: str) -> dict[str, Any]:
    """The trigger of a strategy the decision ``decision`` (``kind:REASON``) starts now."""
    now_wall, now_mono = clock.now(), clock.monotonic()
    snapshot = inst.evidence.snapshot
    statuses = inst.evidence.engine_statuses
    ranks = sorted({int(r) for r in inst.runtime.active_dp_ranks} | {int(r) for r in snapshot.entries})
    firsts: list[float] = []
    rank_rows: list[dict[str, Any]] = []
    for rank in ranks:
        entry = snapshot.entries.get(DpRank(rank))
        row: dict[str, Any] = {
            "rank": rank,
            "health": "healthy" if entry is None else entry.status,
            "engine": statuses.get(rank),
            "evidence": None if entry is None else entry.evidence.value,
            "first_seen_at": None,
        }
        if entry is not None:
            firsts.append(entry.first_seen)
            row["first_seen_at"] = _wall(now_wall, now_mono, entry.first_seen).isoformat()
        rank_rows.append(row)
    hardware: list[dict[str, Any]] = []
    seen: set[str] = set()
    for event in inst.evidence.hardware:
        firsts.append(event.received_at)
        seen.add(event.fault.key)
        hardware.append(
            {
                "key": event.fault.key,
                "fault_code": event.fault.fault_code,
                "node_name": event.fault.node_name,
                "card": event.fault.card,
                "level": event.fault.level,
                "mapping": event.mapping.kind.value,
                "ranks": sorted(int(r) for r in event.mapping.ranks),
                "standing": event.fault.key in inst.standing.faults,
                "received_at": _wall(now_wall, now_mono, event.received_at).isoformat(),
            }
        )
    for key, fault in inst.standing.faults.items():
        if key in seen:
            continue
        hardware.append(
            {
                "key": key,
                "fault_code": fault.fault_code,
                "node_name": fault.node_name,
                "card": fault.card,
                "level": fault.level,
                "mapping": None,
                "ranks": [],
                "standing": True,
                "received_at": None,
            }
        )
    fault_at = _wall(now_wall, now_mono, min(firsts)).isoformat() if firsts else None
    return {
        "decision": decision,
        "reason": reason,
        "last_error": inst.runtime.last_error,
        "ranks": rank_rows,
        "hardware": hardware,
        "fault_at": fault_at,
        "decided_at": now_wall.isoformat(),
    }
