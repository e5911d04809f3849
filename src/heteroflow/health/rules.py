"""Rules v1-ecc-growth (H-30, H-31): purely computational, no side effects, no database.

EXPERIMENTAL. The thresholds are initial values from a public mechanism, not calibrated on real failures.

Three layers:

* strong — uncorrectable ECC *grew* (new errors since the card was last predicted and within the observation
           period; the lifetime total is context only, see below); rows remapped after uncorrectable errors grew
           (the same way; an extension of the seed's F1); row-remap failure > 0. Each fires alone.
* trend  — corrected-ECC growth (two conditions, below); pending remaps grew in the observation period and are
           > 0 now; retired pages grew in the observation period and are > 0 now. Each fires alone.
* weak   — temperature, power (``weak_signals.py``) and a correctable-error flood: corrected ECC growing faster
           than a configurable rate over the last growth window. A weak signal can never fire alone: it is evidence
           beside a strong or trend signal, nothing more. A test pins this gate. The flood is weak on purpose: in the
           field a card has logged 54.7 x 10^9 correctable errors at ~17,700 a second without one uncorrectable
           error, and public HBM data shows correctable errors barely precede uncorrectable ones — a flood is worth
           showing (it can wedge the tools that watch the card), not a failure forecast.

The rules see a card through :class:`CardView`: its newest sample (t0) and the samples at a few boundary
instants, fetched by the shell with indexed point queries. A boundary value is *unknown* — and the signal that
needs it is abandoned, never filled with 0 — when there is no sample at or before the instant, the sample is
older than the staleness bound, it belongs to another uuid (another card, H-4), the counter is unknown, or the
counter decreased after it (H-3: a driver reload resets counters; an increase across it is meaningless).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Literal

from heteroflow.health.samples import Card, StoredSample

RULE_VERSION = "v1-ecc-growth"

Layer = Literal["strong", "trend", "weak"]

#: the counter each signal reads (its evidence says so when the vendor has not confirmed what that counter counts)
SIGNAL_KEYS = {
    "uncorrectable_ecc": "ecc_uncorrected_total",
    "uncorrectable_remap": "remapped_rows_uncorrectable",
    "remap_failure": "remapped_rows_failure",
    "corrected_ecc_growth": "ecc_corrected_total",
    "pending_remap_growth": "remapped_rows_pending",
    "retired_pages_growth": "retired_pages",
    "corrected_ecc_flood": "ecc_corrected_total",
}
UNCONFIRMED_NOTE = (
    " [semantics unconfirmed: the vendor has not confirmed what {key} counts on this card (cnmon's Ecc-Error may "
    "count correctable errors, uncorrectable errors or both)]"
)

#: counters whose growth is judged across boundaries (the shell reports their last decrease)
GROWTH_KEYS = (
    "ecc_corrected_total",
    "remapped_rows_pending",
    "retired_pages",
    "ecc_uncorrected_total",
    "remapped_rows_uncorrectable",
)


@dataclass(frozen=True, slots=True)
class RuleParams:
    growth_window: timedelta = timedelta(hours=24)
    consecutive_windows: int = 3
    baseline: timedelta = timedelta(days=7)
    ratio: float = 1.2
    min_increase: int = 32
    observation: timedelta = timedelta(days=7)
    staleness: timedelta = timedelta(minutes=60)
    ce_flood_per_sec: float = 10.0
    """Mean corrected-ECC rate over the last growth window, per second, from which a flood is flagged (weak)."""


@dataclass(frozen=True, slots=True)
class Signal:
    layer: Layer
    code: str
    evidence: str


@dataclass(frozen=True, slots=True)
class CardView:
    """What the rules may know of one card at t0 = the newest sample's time (never the clock)."""

    card: Card
    latest: StoredSample
    boundaries: Mapping[datetime, StoredSample | None]
    """The newest sample of the slot at or before each instant of :func:`boundary_instants`."""
    last_decrease: Mapping[str, datetime | None] = field(default_factory=dict)
    """Per growth counter, the time of the newest sample that was lower than the one before it."""
    last_predicted_t0: datetime | None = None
    """The t0 of the card's newest earlier prediction (its value there is in ``boundaries``), if any."""

    @property
    def t0(self) -> datetime:
        return self.latest.sampled_at


@dataclass(frozen=True, slots=True)
class Evaluation:
    signals: tuple[Signal, ...]
    abandoned: tuple[str, ...]
    """Why a signal could not be evaluated (unknown boundary values), for diagnostics."""

    @property
    def predicts(self) -> bool:
        """The gate: only a strong or trend signal makes a prediction; weak signals never do alone."""
        return any(signal.layer in ("strong", "trend") for signal in self.signals)

    @property
    def evidence(self) -> str:
        return "\n".join(f"{s.layer} signal [{s.code}]: {s.evidence}" for s in self.signals)


def boundary_instants(t0: datetime, params: RuleParams) -> list[datetime]:
    """The instants whose values the rules need, relative to t0."""
    instants = {t0 - params.growth_window * k for k in range(1, params.consecutive_windows + 1)}
    instants.add(t0 - params.baseline)
    instants.add(t0 - params.observation)
    return sorted(instants)


def evaluate(view: CardView, params: RuleParams, *, weak_signals: Sequence[Signal] = ()) -> Evaluation:
    signals: list[Signal] = []
    abandoned: list[str] = []
    now = view.latest.counters

    for key, code, label in (
        ("ecc_uncorrected_total", "uncorrectable_ecc", "uncorrectable ECC"),
        # an extension of the seed's F1: a row remapped after an uncorrectable error is the durable record of one
        ("remapped_rows_uncorrectable", "uncorrectable_remap", "rows remapped after uncorrectable errors"),
    ):
        grown = _strong_growth(view, params, key=key, code=code, label=label)
        if grown is not None:
            signals.append(grown)
    failure = _remap_failure(view, params)
    if failure is not None:
        signals.append(failure)

    growth, reason = _corrected_growth(view, params)
    if growth is not None:
        signals.append(growth)
    elif reason:
        abandoned.append(reason)

    for key, code, label in (
        ("remapped_rows_pending", "pending_remap_growth", "pending row remaps"),
        ("retired_pages", "retired_pages_growth", "retired pages"),
    ):
        current = getattr(now, key)
        start = _value_at(view, key, view.t0 - params.observation, params)
        if current is None or start is None:
            abandoned.append(f"{key}: unknown at t0 or at the start of the observation period")
        elif current > start and current > 0:
            days = params.observation / timedelta(days=1)
            signals.append(Signal("trend", code, f"{label} grew from {start} to {current} in {days:g} days"))

    flood = _corrected_flood(view, params)
    if flood is not None:
        signals.append(flood)

    unconfirmed = set(view.latest.semantics_unconfirmed)
    if unconfirmed:  # carried into the prediction's evidence, and so into its alert
        signals = [_with_caveat(s, unconfirmed) for s in signals]
    for weak in weak_signals:
        if weak.layer != "weak":
            raise ValueError("weak_signals takes weak signals only")
        signals.append(weak)
    return Evaluation(signals=tuple(signals), abandoned=tuple(abandoned))


def _with_caveat(signal: Signal, unconfirmed: set[str]) -> Signal:
    key = SIGNAL_KEYS.get(signal.code)
    if key is None or key not in unconfirmed:
        return signal
    return replace(signal, evidence=signal.evidence + UNCONFIRMED_NOTE.format(key=key))


def _strong_growth(view: CardView, params: RuleParams, *, key: str, code: str, label: str) -> Signal | None:
    """New uncorrectable errors (or remaps), not the lifetime total (the aggregate counter never goes down).

    Read on the lifetime total, one old error would predict the card in every window for life: its alert could
    never close and the precision denominator would fill with the same card. So the signal fires when the total
    is above its value at the start of the observation period and at the card's last prediction; when neither
    is known (a card first seen, or counted from 0 again after a driver reload) a total above 0 is new to us.
    """
    current = getattr(view.latest.counters, key)
    if current is None or current <= 0:
        return None
    references = [
        (instant, value)
        for instant in (view.t0 - params.observation, view.last_predicted_t0)
        if instant is not None and (value := _value_at(view, key, instant, params)) is not None
    ]
    if not references:
        return Signal("strong", code, f"{label} total {current} > 0 (no earlier value known)")
    since, reference = max(references, key=lambda item: item[1])
    if current <= reference:
        return None
    return Signal(
        "strong",
        code,
        f"{label} grew from {reference} to {current} since {since.isoformat(timespec='seconds')} "
        f"(lifetime total {current})",
    )


def _remap_failure(view: CardView, params: RuleParams) -> Signal | None:
    """The row-remapping failure flag once it is *newly* set: not set at the start of the observation period or at
    the card's last prediction (a flag that stays set would predict the card in every window for life, as a
    lifetime total would). With neither value known, a set flag is new to us and fires."""
    grown = _strong_growth(view, params, key="remapped_rows_failure", code="remap_failure", label="row remapping")
    if grown is None:
        return None
    current = view.latest.counters.remapped_rows_failure
    known = [
        (instant, value)
        for instant in (view.t0 - params.observation, view.last_predicted_t0)
        if instant is not None and (value := _value_at(view, "remapped_rows_failure", instant, params)) is not None
    ]
    if not known:
        return Signal("strong", "remap_failure", f"row remapping failure {current} > 0 (spare rows exhausted)")
    since = max(known, key=lambda item: item[1])[0]
    return Signal(
        "strong",
        "remap_failure",
        f"row remapping failure set since {since.isoformat(timespec='seconds')} (spare rows exhausted)",
    )


def _corrected_growth(view: CardView, params: RuleParams) -> tuple[Signal | None, str | None]:
    """Both conditions: magnitude (Δ ≥ min and ≥ ratio x daily mean) and shape (strictly increasing windows)."""
    key = "ecc_corrected_total"
    now = view.latest.counters.ecc_corrected_total
    if now is None:
        return None, f"{key}: unknown at t0"
    edges = [view.t0 - params.growth_window * k for k in range(params.consecutive_windows + 1)]
    values: list[int] = [now]
    for edge in edges[1:]:
        value = _value_at(view, key, edge, params)
        if value is None:
            return None, f"{key}: unknown at t0-{_hours(view.t0 - edge)}"
        values.append(value)
    base = _value_at(view, key, view.t0 - params.baseline, params)
    if base is None:
        return None, f"{key}: unknown at the baseline start"
    # increases, oldest window first
    increases = [values[k] - values[k + 1] for k in range(params.consecutive_windows)][::-1]
    last = increases[-1]
    baseline_days = params.baseline / timedelta(days=1)
    window_days = params.growth_window / timedelta(days=1)
    # daily mean over a baseline that includes the last window: a constant rate gives exactly 1.0
    daily_mean = (now - base) / baseline_days
    per_window_mean = daily_mean * window_days
    magnitude = last >= params.min_increase and last >= params.ratio * per_window_mean
    shape = all(a < b for a, b in pairwise(increases))
    if not (magnitude and shape):
        return None, None
    ratio = last / per_window_mean if per_window_mean > 0 else float("inf")
    return (
        Signal(
            "trend",
            "corrected_ecc_growth",
            f"corrected ECC +{last} in the last {_hours(params.growth_window)} (≥ {params.min_increase}), "
            f"{ratio:.2f}x the {baseline_days:g}-day mean (≥ {params.ratio:g}x); "
            f"increases of the last {params.consecutive_windows} windows {increases} strictly increase",
        ),
        None,
    )


def _corrected_flood(view: CardView, params: RuleParams) -> Signal | None:
    """Corrected ECC growing at ``ce_flood_per_sec`` or faster, on average over the last growth window: weak."""
    now = view.latest.counters.ecc_corrected_total
    start = _value_at(view, "ecc_corrected_total", view.t0 - params.growth_window, params)
    if now is None or start is None or now <= start:
        return None
    rate = (now - start) / params.growth_window.total_seconds()
    if rate < params.ce_flood_per_sec:
        return None
    return Signal(
        "weak",
        "corrected_ecc_flood",
        f"corrected ECC +{now - start} in the last {_hours(params.growth_window)}, {rate:.1f} a second "
        f"(flood rate {params.ce_flood_per_sec:g} a second)",
    )


def _value_at(view: CardView, key: str, instant: datetime, params: RuleParams) -> int | None:
    sample = view.boundaries.get(instant)
    if sample is None or sample.sampled_at > instant:
        return None
    if sample.uuid != view.card.uuid or instant - sample.sampled_at > params.staleness:
        return None
    decreased = view.last_decrease.get(key)
    if decreased is not None and decreased > sample.sampled_at:
        return None  # never an increase across a decrease (H-3)
    value = getattr(sample.counters, key)
    return value if isinstance(value, int) else None


def _hours(delta: timedelta) -> str:
    return f"{delta / timedelta(hours=1):g}h"
