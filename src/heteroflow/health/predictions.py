"""Predictions: identity, frozen rule and window, and the judgement of their window (H-33, H-40).

Purely computational, no side effects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from heteroflow.health.samples import Card, StoredSample

PredictionStatus = Literal["pending", "hit", "miss", "voided"]
STATUSES: tuple[PredictionStatus, ...] = ("pending", "hit", "miss", "voided")

#: memory-related XIDs counted as failure events (H-15); 79 (fell off the bus) is recorded, not counted
COUNTED_XIDS = frozenset({48, 64, 94, 95, 171})


#: counters whose strict growth between consecutive known samples of a card is a failure event: uncorrectable ECC
#: (the seed's F1) and rows remapped after uncorrectable errors (its extension: the remap is the durable record)
FAILURE_COUNTERS = (
    ("ecc_uncorrected_total", "uncorrectable ECC"),
    ("remapped_rows_uncorrectable", "rows remapped after uncorrectable errors"),
)


def _first_growth(
    *, card: Card, t0: datetime, end: datetime, samples: Sequence[StoredSample], key: str
) -> tuple[int, int, datetime] | None:
    """The first step inside (t0, end] where ``key`` strictly grew between consecutive known samples of the card."""
    previous: int | None = None
    for sample in samples:
        value = getattr(sample.counters, key)
        if sample.uuid != card.uuid or value is None or sample.sampled_at > end:
            continue
        if previous is not None and sample.sampled_at > t0 and value > previous:
            return previous, value, sample.sampled_at
        previous = value
    return None


def prediction_id(card: Card, *, rule_version: str, window_days: int, t0: datetime) -> str:
    """Derived from what the prediction is about, never from the clock: two overlapping workers that see the
    same samples compute the same id, and the primary key keeps one row."""
    material = "|".join(
        [
            card.node_id,
            str(card.gpu_index),
            card.uuid if card.uuid is not None else "\x00",
            card.source,
            rule_version,
            str(window_days),
            t0.isoformat(timespec="microseconds"),
        ]
    )
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:40]


def window_end(t0: datetime, window_days: int) -> datetime:
    return t0 + timedelta(days=window_days)


def window_over_at(t0: datetime, window_days: int, *, now: datetime) -> bool:
    """True when a prediction made ``now`` from a sample at ``t0`` would already be judgeable.

    A card last sampled longer ago than the window is stale, not at risk: a prediction about it would be
    judged at once from samples that were never going to come (voided) and its "within N days" alert would sit
    open in the backlog. Such a card shows as stalled in the capability matrix instead.
    """
    return window_end(t0, window_days) <= now


@dataclass(frozen=True, slots=True)
class XidObservation:
    gpu_index: int
    uuid: str | None
    xid: int
    occurred_at: datetime


@dataclass(frozen=True, slots=True)
class Judgement:
    status: Literal["hit", "miss", "voided"]
    conclusion: str
    failure_at: datetime | None = None
    """For a hit: when the failure was observed (the lead time is failure_at - t0)."""


def judge(
    *,
    card: Card,
    t0: datetime,
    end: datetime,
    now: datetime,
    samples: Sequence[StoredSample],
    xids: Sequence[XidObservation] = (),
) -> Judgement | None:
    """The judgement of the window (t0, end], or ``None`` while it has not expired (no early hit either).

    ``samples`` are the slot's samples with t0 <= sampled_at <= end in time order (the t0 sample included:
    the first step inside the window starts from it). Growth is judged step by step between consecutive known
    values of the predicted card, so a counter reset is neither growth nor a void (H-3). A step that shows
    growth of the predicted card before a swap is a hit: it is the failure the prediction was about.
    """
    if end > now:
        return None
    inside = [s for s in samples if t0 < s.sampled_at <= end]
    if not inside:
        return Judgement("voided", "voided: no sample inside the window (collection stalled or node offline)")
    for key, label in FAILURE_COUNTERS:
        step = _first_growth(card=card, t0=t0, end=end, samples=samples, key=key)
        if step is not None:
            before, after, at = step
            return Judgement("hit", f"hit: {label} grew from {before} to {after} at {at.isoformat()}", failure_at=at)
    for event in sorted(xids, key=lambda e: e.occurred_at):
        same_card = event.uuid is None or event.uuid == card.uuid
        if event.xid in COUNTED_XIDS and same_card and t0 < event.occurred_at <= end:
            return Judgement("hit", f"hit: XID {event.xid} at {event.occurred_at.isoformat()}", event.occurred_at)
    if any(s.uuid != card.uuid for s in inside):
        return Judgement("voided", "voided: the card was replaced inside the window (uuid changed)")
    if all(s.counters.ecc_uncorrected_total is None for s in inside):
        # nothing was watched: a miss in the precision denominator must mean "we watched and nothing happened"
        return Judgement(
            "voided", "voided: the uncorrectable-ECC count was unknown in every sample of the window (unobservable)"
        )
    return Judgement(
        "miss", f"miss: window expired with {len(inside)} samples inside it and no uncorrectable-ECC growth"
    )
