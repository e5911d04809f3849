"""Simulated health series (H-70): profiles that show what the rules do. Purely computational.

Samples are generated every 5 minutes (the keepalive cadence) with ``source='simulated'`` by the caller.
Simulated data is for demonstrations and self-tests of the algorithm: it never enters real statistics or
alerts, and it can be purged alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from heteroflow.health.counters import Counters

Profile = Literal["healthy", "degrading", "sudden-ue", "remap-pending", "remap-failure", "stalled", "card-swap"]
PROFILES: tuple[Profile, ...] = (
    "healthy",
    "degrading",
    "sudden-ue",
    "remap-pending",
    "remap-failure",
    "stalled",
    "card-swap",
)
STEP = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class SimulatedSample:
    sampled_at: datetime
    uuid: str
    counters: Counters


def series(profile: Profile, *, card: int, start: datetime, end: datetime) -> Iterator[SimulatedSample]:
    """One card's samples from ``start`` to ``end`` (inclusive) for ``profile``; deterministic per card."""
    total_days = (end - start) / timedelta(days=1)
    base_ce = 3 + card % 5
    uuid = f"SIM-{profile}-{card:04d}"
    at = start
    while at <= end:
        day = (at - start) / timedelta(days=1)
        ue, ce, retired, pending, failure = 0, base_ce, 0, 0, 0
        current_uuid = uuid
        if profile == "degrading":
            # corrected errors accelerating ~30%/day: every daily increase beats the one before it
            growth = 1.3
            ce = base_ce + round(40 * (growth**day - 1) / math.log(growth))
        elif profile == "sudden-ue" and day >= total_days * 0.6:
            ue = 2
        elif profile == "remap-pending" and day >= total_days - 2:
            pending = 1
        elif profile == "remap-failure" and day >= total_days * 0.6:
            failure = 1
        elif profile == "stalled" and day >= total_days - 2:
            return  # collection stopped two days before the end
        elif profile == "card-swap" and day >= total_days * 0.5:
            current_uuid = uuid + "-replacement"
            ce = 1  # the new card's own counters
        yield SimulatedSample(
            sampled_at=at,
            uuid=current_uuid,
            counters=Counters(
                ecc_uncorrected_total=ue,
                ecc_corrected_total=ce,
                retired_pages=retired,
                remapped_rows_pending=pending,
                remapped_rows_failure=failure,
            ),
        )
        at += STEP
