"""An agent's clock against the server's: which claimed times are believed (H-21). Purely computational.

An agent stamps every reading with its own wall clock (``sampled_at`` for the health counters,
``telemetry_at`` for the metrics, ``occurred_at`` for an XID). That clock can be wrong by days — an unsynced
host, a dead RTC battery, a VM restored from a snapshot — or be nonsense (year 9999, year 1). A time taken as
it is would then decide the write policy's keepalive, the stall badge, prediction windows (the seed's lesson:
a future t0 silently voids predictions) and minute buckets, and one node could break those for everyone.

So every claimed time is checked against the server's receive time, per value, and a time outside the window
is replaced by the receive time, with a counted reason; the reading itself is kept (its values are fresh: the
agent never reports a health reading older than three collection periods, ``agent/freshness.py``). An XID
may be genuinely old (kept by the agent while the server was down), so only one older than the retention is
rejected; one in the future is clamped as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class TimeFix(StrEnum):
    """Why a claimed time was not taken as it is."""

    AHEAD = "ahead"
    """Ahead of the server's clock by more than the tolerance: clamped to the receive time."""
    BEHIND = "behind"
    """Older than the receive time by more than the largest age a reading can have: clamped to it."""
    NOT_AFTER_NEWEST = "not_after_newest"
    """Not after the card's newest stored row (the agent's clock stepped back): moved just after that row."""
    TOO_OLD = "too_old"
    """An XID older than the retention: rejected (it would be deleted at once anyway)."""


#: the step a reading that does not come after its card's newest row is placed after it (every backend keeps µs)
AFTER_NEWEST_STEP = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class SampleTimeWindow:
    """The claimed times the server believes, relative to its own receive time."""

    max_ahead: timedelta
    """A claimed time later than ``received_at + max_ahead`` is a wrong clock (default 5 min)."""
    max_behind: timedelta
    """A reading's time earlier than ``received_at - max_behind`` is a wrong clock (default 15 min)."""
    max_event_age: timedelta
    """An XID earlier than ``received_at - max_event_age`` is rejected (default: the retention)."""

    def reading_time(self, claimed: datetime | None, *, received_at: datetime) -> tuple[datetime, TimeFix | None]:
        """The time a reading is stored under, and why it is not the claimed one (``None``: it is, or none was
        claimed and the receive time stands in as it always did)."""
        if claimed is None:
            return received_at, None
        if claimed > received_at + self.max_ahead:
            return received_at, TimeFix.AHEAD
        if claimed < received_at - self.max_behind:
            return received_at, TimeFix.BEHIND
        return claimed, None

    def event_time(self, claimed: datetime, *, received_at: datetime) -> tuple[datetime | None, TimeFix | None]:
        """The time an XID is stored under (``None``: reject it), and why it is not the claimed one."""
        if claimed > received_at + self.max_ahead:
            return received_at, TimeFix.AHEAD
        if claimed < received_at - self.max_event_age:
            return None, TimeFix.TOO_OLD
        return claimed, None


def after_newest(sampled_at: datetime, *, newest: datetime | None) -> tuple[datetime, TimeFix | None]:
    """A row's time so that it comes after its slot's newest stored row (``newest``).

    The newest row decides the next write (changed? keepalive due?). A reading written *before* it never becomes
    the newest, so a changing card would be written again on every beat; placed just after it, the reading is the
    newest, the next beat compares with it, and the write policy's bound of rows holds.
    """
    if newest is None or sampled_at > newest:
        return sampled_at, None
    return newest + AFTER_NEWEST_STEP, TimeFix.NOT_AFTER_NEWEST
