"""What a heartbeat may still report (H-13). Purely computational, no side effects.

Health readings are collected every 60 s but reported on every 5 s beat, from a cache. A reading older
than three collection periods (180 s at the default) is reported as unknown instead: when the collection
thread hangs or the vendor tool is uninstalled, repeating the last value would claim "just measured, all
fine" — a lie the prediction engine would believe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from heteroflow.agent.readings import HealthCollection, TelemetryCollection

FRESHNESS_PERIODS: Final = 3

C = TypeVar("C", HealthCollection, TelemetryCollection)


@dataclass(frozen=True, slots=True)
class Cached(Generic[C]):
    """A collection and the monotonic time it completed at."""

    value: C
    at_monotonic: float


def freshness_limit(interval_sec: float) -> float:
    """Seconds a collection taken every ``interval_sec`` stays reportable (3 periods)."""
    return FRESHNESS_PERIODS * interval_sec


def fresh(cached: Cached[C] | None, *, now_monotonic: float, interval_sec: float) -> C | None:
    """The cached collection if it is within the freshness limit, else ``None`` (report unknown)."""
    if cached is None:
        return None
    age = now_monotonic - cached.at_monotonic
    if age < 0 or age > freshness_limit(interval_sec):
        return None
    return cached.value
