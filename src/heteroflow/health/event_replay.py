"""The rules replayed on an error-event log (one row per error: device, time, CE or UE). Purely computational.

Public field data on memory failures comes as event logs, not as counters: the Calchas dataset (USENIX ATC '24,
HBM errors from 19 data centres) has one row per error with its device, time and type (``CE``, ``UER``,
``UEO``). This module turns such a log into what the agent would have reported — cumulative counters sampled at
a fixed step (``ecc_corrected_total`` = CEs so far, ``ecc_uncorrected_total`` = UEs so far, every other counter
unknown) — and runs the production rules (:func:`heteroflow.health.rules.evaluate`, the same parameters) over
it, with the worker's cadence: at most one open prediction per device, a prediction judged a hit when its
device's uncorrectable count grows inside its window.

Three results, each with confidence intervals over devices (a bootstrap that resamples devices, since a device's
predictions are not independent of each other):

- ``overall``: every prediction and every failing device;
- ``first_failure``: predictions made while the device had no uncorrectable error yet, and each failing device's
  first failure — what predicting a failure *before* it happens means; a rule can score well overall on devices
  that had already failed;
- ``baseline``: "any correctable error" — a device with at least ``k`` new CEs in the rules' growth window is
  predicted, with ``k`` chosen so that it alerts about as often as the rules do — the same two breakdowns.

Limits of such a log: it holds devices with errors only (the healthy fleet, which the precision of a real
deployment is diluted by, is absent), no counts per event beyond one error, and nothing of the other counters
(retired pages, remapped rows, temperature), so the trend rules on those can never fire here.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.rules import CardView, RuleParams, boundary_instants, evaluate
from heteroflow.health.samples import Card, CardKey, StoredSample
from heteroflow.health.statistics import BandCounts, Exposure, band_statistics

ErrorKind = Literal["CE", "UE"]
UE_TYPES: Final = frozenset({"UE", "UER", "UEO", "DUE", "UNCORRECTABLE"})
CE_TYPES: Final = frozenset({"CE", "CORRECTABLE"})
BOOTSTRAP_ROUNDS: Final = 2000
BOOTSTRAP_SEED: Final = 47
MAX_BASELINE_THRESHOLD: Final = 1 << 24


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    device: str
    at: datetime
    kind: ErrorKind


def parse_event_rows(rows: Iterable[Mapping[str, str | None]]) -> tuple[list[ErrorEvent], int]:
    """Events from CSV rows, and how many rows were unusable (skipped, counted). Never raises.

    Columns: the Calchas shape (``Datacenter``, ``Server``, ``Name``, ``Time`` in Unix seconds, ``EccType`` of
    CE/UER/UEO; the device is Datacenter/Server/Name), or a plain ``device``, ``time`` (Unix seconds or ISO 8601)
    and ``type`` (CE or UE).
    """
    events: list[ErrorEvent] = []
    skipped = 0
    for row in rows:
        device = _device(row)
        at = _time(row.get("Time") if "Time" in row else row.get("time"))
        kind = _kind(row.get("EccType") if "EccType" in row else row.get("type"))
        if device is None or at is None or kind is None:
            skipped += 1
            continue
        events.append(ErrorEvent(device=device, at=at, kind=kind))
    return events, skipped


def _device(row: Mapping[str, str | None]) -> str | None:
    if "device" in row:
        value = (row.get("device") or "").strip()
        return value[:200] or None
    parts = [(row.get(key) or "").strip() for key in ("Datacenter", "Server", "Name")]
    return "/".join(parts)[:200] if all(parts) else None


def _time(value: str | None) -> datetime | None:
    text = (value or "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            return None
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    if not math.isfinite(seconds) or not 0 <= seconds < 2**33:
        return None
    return datetime.fromtimestamp(seconds, UTC)


def _kind(value: str | None) -> ErrorKind | None:
    text = (value or "").strip().upper()
    if text in CE_TYPES:
        return "CE"
    if text in UE_TYPES:
        return "UE"
    return None


@dataclass(frozen=True, slots=True)
class DeviceOutcome:
    """One device's share of the figures: what the bootstrap resamples."""

    hits: int = 0
    misses: int = 0
    pending: int = 0
    first_hits: int = 0
    first_misses: int = 0
    first_pending: int = 0
    failed: bool = False
    predicted: bool = False
    """A prediction's window held one of its failures."""
    first_predicted: bool = False
    """A prediction's window held its first failure."""


@dataclass(frozen=True, slots=True)
class Figures:
    """Point estimates through the production evidence gate, and bootstrap intervals over devices."""

    counts: BandCounts
    precision: float | None
    recall: float | None
    precision_ci: tuple[float, float] | None
    recall_ci: tuple[float, float] | None
    insufficient: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        c = self.counts
        return {
            "predictions": c.pending + c.hit + c.miss,
            "hit": c.hit,
            "miss": c.miss,
            "pending": c.pending,
            "matured": c.hit + c.miss,
            "failed_devices": c.failed_cards,
            "predicted_devices": c.predicted_cards,
            "missed_devices": c.failed_cards - c.predicted_cards,
            "precision": self.precision,
            "precision_ci95": list(self.precision_ci) if self.precision_ci else None,
            "recall": self.recall,
            "recall_ci95": list(self.recall_ci) if self.recall_ci else None,
            "insufficient": list(self.insufficient),
        }


@dataclass(frozen=True, slots=True)
class ReplayResult:
    devices: int
    failing_devices: int
    failing_without_earlier_ce: int
    """Failing devices with no correctable error sampled before their first uncorrectable one."""
    span_days: float
    samples_per_device: int
    overall: Figures
    first_failure: Figures
    baseline_threshold: int
    baseline_overall: Figures
    baseline_first_failure: Figures


@dataclass(slots=True)
class _Series:
    """One device's cumulative counts on the sampling grid."""

    ce_times: list[datetime] = field(default_factory=list)
    ue_times: list[datetime] = field(default_factory=list)

    def ce(self, at: datetime) -> int:
        return bisect.bisect_right(self.ce_times, at)

    def ue(self, at: datetime) -> int:
        return bisect.bisect_right(self.ue_times, at)


def replay(
    events: Sequence[ErrorEvent],
    *,
    params: RuleParams,
    window_days: int,
    step: timedelta,
    min_matured: int,
    min_span_days: float,
    bootstrap_rounds: int = BOOTSTRAP_ROUNDS,
) -> ReplayResult:
    """The rules and the any-CE baseline over ``events``, sampled every ``step`` from the log's first event to
    its last (every device from the start: a device's counters are 0 before its first logged error)."""
    if not events:
        raise ValueError("no events to replay")
    series: dict[str, _Series] = {}
    for event in sorted(events, key=lambda e: e.at):
        entry = series.setdefault(event.device, _Series())
        (entry.ce_times if event.kind == "CE" else entry.ue_times).append(event.at)
    start = _floor(min(e.at for e in events), step)
    last = max(e.at for e in events)
    grid_end = _floor(last, step) + (step if _floor(last, step) < last else timedelta(0))
    grid = _grid(start, grid_end, step)
    window = timedelta(days=window_days)
    span_days = (grid_end - start) / timedelta(days=1)

    def at_grid(instant: datetime) -> datetime | None:
        return _floor(instant, step) if instant >= start else None

    lookback = max(params.observation, params.baseline, params.growth_window * params.consecutive_windows)
    ours: dict[str, list[datetime]] = {}
    for device, s in series.items():
        changes = sorted({at_grid(t) or start for t in (*s.ce_times, *s.ue_times)})
        ours[device] = _predictions(
            grid,
            lambda t0, last, s=s, device=device: _rules_predict(device, s, t0, last, params, at_grid),
            may_fire=lambda t0, changes=changes: _changed_within(changes, t0, lookback),
            window=window,
        )
    our_count = sum(len(p) for p in ours.values())
    threshold, baseline = _baseline(series, grid, params.growth_window, window, target=our_count, at_grid=at_grid)

    def figures(predictions: Mapping[str, list[datetime]], *, first_only: bool) -> Figures:
        outcomes = [
            _outcome(s, predictions.get(device, []), window=window, end=grid_end, step=step)
            for device, s in series.items()
        ]
        return _figures(
            outcomes,
            first_only=first_only,
            window_days=window_days,
            span_days=span_days,
            devices=len(series),
            min_matured=min_matured,
            min_span_days=min_span_days,
            rounds=bootstrap_rounds,
        )

    failing = [s for s in series.values() if s.ue_times]
    # CEs counted in the sample before the one that first counts a UE (a CE in the same step cannot be told apart)
    without_ce = sum(1 for s in failing if s.ce(_ceil(s.ue_times[0], step) - step) == 0)
    return ReplayResult(
        devices=len(series),
        failing_devices=len(failing),
        failing_without_earlier_ce=without_ce,
        span_days=span_days,
        samples_per_device=len(grid),
        overall=figures(ours, first_only=False),
        first_failure=figures(ours, first_only=True),
        baseline_threshold=threshold,
        baseline_overall=figures(baseline, first_only=False),
        baseline_first_failure=figures(baseline, first_only=True),
    )


def _floor(at: datetime, step: timedelta) -> datetime:
    seconds = step.total_seconds()
    return datetime.fromtimestamp(math.floor(at.timestamp() / seconds) * seconds, UTC)


def _ceil(at: datetime, step: timedelta) -> datetime:
    """The first grid instant at or after ``at``: where a sample first shows the event."""
    floor = _floor(at, step)
    return floor if floor == at else floor + step


def _grid(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    count = int((end - start) / step) + 1
    return [start + step * k for k in range(count)]


def _changed_within(changes: Sequence[datetime], t0: datetime, lookback: timedelta) -> bool:
    """Whether any count changed in (t0 - lookback, t0]: with none, no rule can fire (no growth anywhere)."""
    index = bisect.bisect_right(changes, t0)
    return index > 0 and changes[index - 1] > t0 - lookback


def _predictions(grid: Sequence[datetime], predicts: Any, *, may_fire: Any, window: timedelta) -> list[datetime]:
    """The t0 of each prediction, at most one open window at a time (as the worker: no prediction while one is
    open for the card)."""
    made: list[datetime] = []
    open_until: datetime | None = None
    for t0 in grid:
        if open_until is not None and t0 < open_until:
            continue
        if may_fire(t0) and predicts(t0, made[-1] if made else None):
            made.append(t0)
            open_until = t0 + window
    return made


def _sample(device: str, s: _Series, at: datetime) -> StoredSample:
    return StoredSample(
        key=CardKey(node_id=NodeId(device), gpu_index=0, source="real"),
        uuid=None,
        sampled_at=at,
        counters=Counters(ecc_uncorrected_total=s.ue(at), ecc_corrected_total=s.ce(at)),
    )


def _rules_predict(
    device: str, s: _Series, t0: datetime, last: datetime | None, params: RuleParams, at_grid: Any
) -> bool:
    boundaries: dict[datetime, StoredSample | None] = {}
    for instant in [*boundary_instants(t0, params), *([last] if last is not None else [])]:
        grid_at = at_grid(instant)
        boundaries[instant] = _sample(device, s, grid_at) if grid_at is not None else None
    view = CardView(
        card=Card(node_id=NodeId(device), gpu_index=0, uuid=None, source="real"),
        latest=_sample(device, s, t0),
        boundaries=boundaries,
        # the worker tells the rules the card's last prediction: an old error does not predict again
        last_predicted_t0=last,
    )
    return evaluate(view, params).predicts


def _baseline(
    series: Mapping[str, _Series],
    grid: Sequence[datetime],
    growth_window: timedelta,
    window: timedelta,
    *,
    target: int,
    at_grid: Any,
) -> tuple[int, dict[str, list[datetime]]]:
    """ "At least k new CEs in the growth window" with the k whose number of predictions is closest to
    ``target`` (ties to the smaller k; k = 1 is "any correctable error")."""
    best: tuple[int, int, dict[str, list[datetime]]] | None = None
    k = 1
    while k <= MAX_BASELINE_THRESHOLD:
        made = {
            device: _predictions(
                grid,
                lambda t0, _last, s=s, k=k: s.ce(t0) - s.ce(t0 - growth_window) >= k,
                may_fire=lambda t0: True,
                window=window,
            )
            for device, s in series.items()
        }
        count = sum(len(p) for p in made.values())
        if best is None or abs(count - target) < best[0]:
            best = (abs(count - target), k, made)
        if count <= target:
            break
        k *= 2
    assert best is not None
    return best[1], best[2]


def _outcome(
    s: _Series, predictions: Sequence[datetime], *, window: timedelta, end: datetime, step: timedelta
) -> DeviceOutcome:
    # a failure is seen at the first sample that counts it: the grid instant at or after the error
    steps = sorted({_ceil(t, step) for t in s.ue_times})
    first = steps[0] if steps else None
    hits = misses = pending = first_hits = first_misses = first_pending = 0
    predicted = first_predicted = False
    for t0 in predictions:
        window_end = t0 + window
        grew = s.ue(window_end) > s.ue(t0)
        before_any = s.ue(t0) == 0
        if grew:
            hits += 1
            first_hits += before_any
        elif window_end > end:
            pending += 1
            first_pending += before_any
        else:
            misses += 1
            first_misses += before_any
        if any(t0 < at <= window_end for at in steps):
            predicted = True
        if first is not None and t0 < first <= window_end:
            first_predicted = True
    return DeviceOutcome(
        hits=hits,
        misses=misses,
        pending=pending,
        first_hits=first_hits,
        first_misses=first_misses,
        first_pending=first_pending,
        failed=bool(steps),
        predicted=predicted,
        first_predicted=first_predicted,
    )


def _figures(
    outcomes: Sequence[DeviceOutcome],
    *,
    first_only: bool,
    window_days: int,
    span_days: float,
    devices: int,
    min_matured: int,
    min_span_days: float,
    rounds: int,
) -> Figures:
    def tally(items: Iterable[DeviceOutcome]) -> tuple[int, int, int, int, int]:
        hit = miss = pending = failed = predicted = 0
        for o in items:
            if first_only:
                hit, miss, pending = hit + o.first_hits, miss + o.first_misses, pending + o.first_pending
                predicted += o.first_predicted
            else:
                hit, miss, pending = hit + o.hits, miss + o.misses, pending + o.pending
                predicted += o.predicted
            failed += o.failed
        return hit, miss, pending, failed, predicted

    hit, miss, pending, failed, predicted = tally(outcomes)
    counts = BandCounts(
        window_days=window_days,
        pending=pending,
        hit=hit,
        miss=miss,
        voided=0,
        failed_cards=failed,
        predicted_cards=predicted,
    )
    stats = band_statistics(
        counts,
        Exposure(monitorable_cards=devices, card_days=devices * span_days, span_days=span_days),
        min_matured=min_matured,
        min_span_days=min_span_days,
    )
    precision_ci = recall_ci = None
    if stats.precision is not None or stats.recall is not None:
        rng = random.Random(BOOTSTRAP_SEED)
        precisions: list[float] = []
        recalls: list[float] = []
        for _ in range(rounds):
            sample = [outcomes[rng.randrange(len(outcomes))] for _ in outcomes]
            h, m, _p, f, pr = tally(sample)
            if h + m:
                precisions.append(h / (h + m))
            if f:
                recalls.append(pr / f)
        precision_ci = _interval(precisions) if stats.precision is not None else None
        recall_ci = _interval(recalls) if stats.recall is not None else None
    return Figures(
        counts=counts,
        precision=stats.precision,
        recall=stats.recall,
        precision_ci=precision_ci,
        recall_ci=recall_ci,
        insufficient=stats.insufficient,
    )


def _interval(values: list[float]) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles, or ``None`` without enough resamples to say."""
    if len(values) < 100:
        return None
    values.sort()
    low = values[int(0.025 * (len(values) - 1))]
    high = values[math.ceil(0.975 * (len(values) - 1))]
    return (round(low, 4), round(high, 4))
