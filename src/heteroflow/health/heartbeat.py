"""Turning a heartbeat's GPU stats and XID events into readings. Pure; never raises on odd input.

Each stat carries its own declared physical ``index``; the array position is never used (H-14), so a
beat that lists cards out of order or skips one cannot graft card A's history onto card B's timeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from heteroflow.core.ids import NodeId, Source
from heteroflow.health.counters import Counters, parse_counter, parse_keys
from heteroflow.health.sample_times import SampleTimeWindow, TimeFix
from heteroflow.health.samples import CardKey, HealthReading

MAX_GPU_INDEX = 4095
MAX_UUID_LENGTH = 128
XID_TOO_OLD = "occurred_at is older than the retention period"
"""The end of the rejection reason of an XID older than the retention (counted by the route)."""


@dataclass(frozen=True, slots=True)
class ParsedXid:
    gpu_index: int
    uuid: str | None
    xid: int
    occurred_at: datetime
    time_fix: TimeFix | None = None


def parse_index(value: object) -> int | None:
    index = parse_counter(value)
    return index if index is not None and index <= MAX_GPU_INDEX else None


def parse_uuid(value: object) -> str | None:
    if isinstance(value, str) and 0 < len(value.strip()) <= MAX_UUID_LENGTH:
        return value.strip()
    return None


def parse_time(value: object) -> datetime | None:
    """An ISO-8601 time; naive values are taken as UTC. Anything else is ``None``."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: an offset that moves the instant outside years 1..9999
        return None


def readings_from_stats(
    stats: Sequence[Mapping[str, object]],
    *,
    node_id: NodeId,
    source: Source,
    received_at: datetime,
    window: SampleTimeWindow | None = None,
) -> tuple[list[HealthReading], int]:
    """The health readings of one beat, and how many stats had no usable declared index.

    ``sampled_at`` is the agent's collection time of the reading; the server's receive time when the
    stat has none (or an unparseable one), or when ``window`` finds the agent's clock wrong (the reading
    says so in ``time_fix``). A second stat declaring an index already seen in the same beat is ignored as
    ambiguous.
    """
    readings: list[HealthReading] = []
    seen: set[int] = set()
    invalid = 0
    for stat in stats:
        index = parse_index(stat.get("index"))
        if index is None or index in seen:
            invalid += 1
            continue
        seen.add(index)
        claimed = parse_time(stat.get("sampled_at"))
        if window is None:
            sampled_at, fix = claimed or received_at, None
        else:
            sampled_at, fix = window.reading_time(claimed, received_at=received_at)
        readings.append(
            HealthReading(
                key=CardKey(node_id=node_id, gpu_index=index, source=source),
                uuid=parse_uuid(stat.get("uuid")),
                sampled_at=sampled_at,
                counters=Counters.from_wire(stat),
                time_fix=fix,
                semantics_unconfirmed=parse_keys(stat.get("semantics_unconfirmed")),
            )
        )
    return readings, invalid


def xid_events_from_wire(
    events: Sequence[Mapping[str, object]],
    *,
    received_at: datetime | None = None,
    window: SampleTimeWindow | None = None,
) -> tuple[list[ParsedXid], list[str]]:
    """Usable XID events, and one reason per unusable one (the agent drops those, it never re-sends).

    With ``window`` (and ``received_at``), an event time ahead of the server is clamped to the receive time and
    one older than the retention is unusable.
    """
    parsed: list[ParsedXid] = []
    rejected: list[str] = []
    for position, event in enumerate(events):
        index = parse_index(event.get("index"))
        xid = parse_counter(event.get("xid"))
        occurred_at = parse_time(event.get("occurred_at"))
        if index is None:
            rejected.append(f"xid_events[{position}]: index must be an integer 0..{MAX_GPU_INDEX}")
        elif xid is None or xid > 2**31 - 1:
            rejected.append(f"xid_events[{position}]: xid must be a non-negative 32-bit integer")
        elif occurred_at is None:
            rejected.append(f"xid_events[{position}]: occurred_at must be an ISO-8601 time")
        else:
            fix = None
            if window is not None and received_at is not None:
                checked, fix = window.event_time(occurred_at, received_at=received_at)
                if checked is None:
                    rejected.append(f"xid_events[{position}]: {XID_TOO_OLD}")
                    continue
                occurred_at = checked
            parsed.append(
                ParsedXid(
                    gpu_index=index,
                    uuid=parse_uuid(event.get("uuid")),
                    xid=xid,
                    occurred_at=occurred_at,
                    time_fix=fix,
                )
            )
    return parsed, rejected
