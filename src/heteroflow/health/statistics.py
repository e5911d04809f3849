"""Prediction statistics: the evidence gate (H-50, H-51). Purely computational, no side effects.

Precision and recall have different denominators and are never mixed. Below the evidence thresholds both
ratios are ``None`` (JSON null), never 0: 0% would read as "the predictions were all wrong" when the truth is
"there is not enough data yet".

Beside the overall figures, each band is broken down to **first failures**: the predictions of cards that had no
uncorrectable error at their t0, and the failed cards whose first failure in the period was their first
uncorrectable error ever seen. A rule that scores mostly on cards that had already failed (the public HBM field
data shows CE growth barely precedes a first uncorrectable error) looks good overall and poor here; the same
evidence gate applies to the breakdown.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

DISCLAIMER = (
    "Fault prediction is experimental: the rule thresholds are initial values from a public mechanism, not "
    "calibrated on this platform's failure history. Ratios are shown only with at least {min_matured} matured "
    "predictions and {min_span:g} days of observation; below that only the raw counts are given."
)


@dataclass(frozen=True, slots=True)
class BandCounts:
    window_days: int
    pending: int
    hit: int
    miss: int
    voided: int
    failed_cards: int
    predicted_cards: int
    unconfirmed_failed_cards: int = 0
    """Failed cards whose failure was read from a counter of unconfirmed meaning (cnmon's Ecc-Error)."""
    first_failure: BandCounts | None = None
    """The same counts for first failures only (no uncorrectable error seen before); ``None`` where not read."""


@dataclass(frozen=True, slots=True)
class Exposure:
    monitorable_cards: int
    card_days: float
    span_days: float | None


@dataclass(frozen=True, slots=True)
class BandStatistics:
    counts: BandCounts
    precision: float | None
    recall: float | None
    insufficient: tuple[str, ...]

    @property
    def matured(self) -> int:
        return self.counts.hit + self.counts.miss

    @property
    def missed_cards(self) -> int:
        return self.counts.failed_cards - self.counts.predicted_cards


def band_statistics(
    counts: BandCounts, exposure: Exposure, *, min_matured: int, min_span_days: float
) -> BandStatistics:
    matured = counts.hit + counts.miss
    reasons: list[str] = []
    if matured < min_matured:
        reasons.append(f"{matured} of ≥ {min_matured} matured predictions (hit + miss; voided excluded)")
    if exposure.span_days is None:
        reasons.append(f"observation span unknown (no samples); ≥ {min_span_days:g} days needed")
    elif exposure.span_days < min_span_days:
        reasons.append(f"observed {exposure.span_days:.1f} of ≥ {min_span_days:g} days")
    if reasons:
        return BandStatistics(counts, None, None, tuple(reasons))
    precision = counts.hit / matured
    recall = counts.predicted_cards / counts.failed_cards if counts.failed_cards else None
    extra = () if counts.failed_cards else ("no failed card in the period: recall undefined",)
    return BandStatistics(counts, precision, recall, extra)


def disclaimer(*, min_matured: int, min_span_days: float) -> str:
    return DISCLAIMER.format(min_matured=min_matured, min_span=min_span_days)


@dataclass(frozen=True, slots=True)
class FailureEvent:
    """A failure of a monitorable card: an uncorrectable-ECC step or a counted XID, at ``at``."""

    node_id: str
    gpu_index: int
    uuid: str | None
    at: datetime
    semantics_unconfirmed: bool = False
    """The failure is an uncorrectable-ECC step of a counter whose meaning the vendor has not confirmed."""

    @property
    def card(self) -> tuple[str, int, str | None]:
        return (self.node_id, self.gpu_index, self.uuid)


@dataclass(frozen=True, slots=True)
class PredictionWindow:
    node_id: str
    gpu_index: int
    uuid: str | None
    window_days: int
    t0: datetime
    window_end: datetime


def first_failures(
    events: Iterable[FailureEvent], first_uncorrectable: dict[tuple[str, int, str | None], datetime]
) -> list[FailureEvent]:
    """Each failed card's earliest event, where it is the card's first uncorrectable error: no uncorrectable count
    above 0 was seen before it (``first_uncorrectable``: when each card's count was first seen above 0; a count
    step to above 0 is seen at the step itself). Pure."""
    earliest: dict[tuple[str, int, str | None], FailureEvent] = {}
    for event in events:
        known = earliest.get(event.card)
        if known is None or event.at < known.at:
            earliest[event.card] = event
    return [
        event
        for card, event in earliest.items()
        if (first := first_uncorrectable.get(card)) is None or first >= event.at
    ]


def predicted_cards(
    events: Iterable[FailureEvent], windows: Iterable[PredictionWindow], *, window_days: int
) -> set[tuple[str, int, str | None]]:
    """Failed cards with a same-card prediction of this band whose window (t0, end] holds one of its failures."""
    by_card: dict[tuple[str, int, str | None], list[PredictionWindow]] = {}
    for window in windows:
        if window.window_days == window_days:
            by_card.setdefault((window.node_id, window.gpu_index, window.uuid), []).append(window)
    return {event.card for event in events if any(w.t0 < event.at <= w.window_end for w in by_card.get(event.card, ()))}
