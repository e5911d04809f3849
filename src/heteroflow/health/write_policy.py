"""When a heartbeat's reading becomes a stored row (H-21). Purely computational, no side effects."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from heteroflow.health.samples import HealthReading, StoredSample


class WriteReason(StrEnum):
    FIRST = "first"
    CHANGED = "changed"
    UUID_CHANGED = "uuid_changed"
    KEEPALIVE = "keepalive"


def decide_write(reading: HealthReading, latest: StoredSample | None, *, keepalive: timedelta) -> WriteReason | None:
    """Why ``reading`` must be written given the newest stored row of its card, or ``None`` to skip.

    The keepalive is measured from the *stored row's* time, not the last heartbeat: measured from the
    beat, the reference would move forward every 5 s and the keepalive row would never be written. That
    row is what tells "three months stable" from "collection stopped three months ago".
    Callers reject all-unknown readings before calling (they never reach the database).
    """
    if latest is None:
        return WriteReason.FIRST
    if reading.uuid != latest.uuid:
        return WriteReason.UUID_CHANGED
    if reading.counters is not latest.counters and reading.counters != latest.counters:  # shared when steady
        # unknown→known and known→unknown are both changes: None differs from every value.
        return WriteReason.CHANGED
    if reading.sampled_at - latest.sampled_at >= keepalive:
        return WriteReason.KEEPALIVE
    return None
