"""GPU metrics of the 5 s heartbeat (temperature, utilisation, memory, power): parsing, per-minute aggregation
and the GPU_MEMORY_HIGH decision. Purely computational, no side effects, no database.

These metrics are the job's business, not the card's health: a card whose memory is full is healthy and busy.
They are kept apart from the five hardware error counters (``counters.py``), stored as per-minute aggregates
for a short retention, and a metric that is missing or malformed is unknown (``None``), never 0.
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple

from heteroflow.core.ids import NodeId
from heteroflow.health.heartbeat import parse_index, parse_time, parse_uuid
from heteroflow.health.sample_times import SampleTimeWindow, TimeFix
from heteroflow.health.samples import CardKey, Source

METRIC_KEYS: Final = ("temperature_c", "utilization_pct", "memory_used_mib", "memory_total_mib", "power_w")

#: plausibility bounds per metric; a value outside is unknown (a driver glitch must not draw a spike)
_BOUNDS: Final[Mapping[str, tuple[float, float]]] = {
    "temperature_c": (-50.0, 200.0),
    "utilization_pct": (0.0, 100.0),
    "memory_used_mib": (0.0, 16_777_216.0),  # 16 TiB
    "memory_total_mib": (0.0, 16_777_216.0),
    "power_w": (0.0, 100_000.0),
}

GPU_MEMORY_HIGH: Final = "GPU_MEMORY_HIGH"


def parse_metric(name: str, value: object) -> float | None:
    """A metric from any JSON value: a finite number within the metric's bounds, otherwise ``None``."""
    if type(value) is float:  # the common case first
        number = value
    elif isinstance(value, bool) or not isinstance(value, int | float):
        return None
    else:
        number = float(value)
    low, high = _BOUNDS[name]
    if not math.isfinite(number) or not low <= number <= high:
        return None
    return number


class GpuMetrics(NamedTuple):
    """One beat's metrics of one card; ``None`` = unknown.

    A named tuple built in C (``tuple.__new__(GpuMetrics, values)``): every beat builds one per card, and a
    card's telemetry moves from beat to beat, so a shared copy is seldom found (an interning table of them kept
    tens of thousands alive for seconds, and every one of them was walked by the garbage collector)."""

    temperature_c: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None

    @property
    def all_unknown(self) -> bool:
        return self.count(None) == len(METRIC_KEYS)

    @property
    def memory_share(self) -> float | None:
        """Used / total memory in [0, 1], or ``None`` when either is unknown or the total is 0."""
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return min(self.memory_used_mib / self.memory_total_mib, 1.0)

    def value(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value

    @classmethod
    def from_wire(cls, stat: Mapping[str, object]) -> GpuMetrics:
        return metrics_from_values(tuple(map(stat.get, METRIC_KEYS)))  # C-speed: no comprehension frame per card


_tuple_of = tuple.__new__
METRIC_LOWS: Final = tuple(_BOUNDS[name][0] for name in METRIC_KEYS)
"""Each metric's lowest plausible value, in :data:`METRIC_KEYS` order."""
METRIC_HIGHS: Final = tuple(_BOUNDS[name][1] for name in METRIC_KEYS)
"""Each metric's highest plausible value, in :data:`METRIC_KEYS` order."""
FLOAT_ONLY: Final = frozenset({float})
"""``FLOAT_ONLY.issuperset(map(type, values))``: every value a float, checked in C."""


def metrics_from_values(raw: tuple[object, ...]) -> GpuMetrics:
    """The metrics of a stat's wire values in :data:`METRIC_KEYS` order (what :meth:`GpuMetrics.from_wire`
    reads); a missing or malformed value is unknown."""
    # the common card: five floats within their bounds, checked in C (a NaN or an infinity fails a comparison
    # and takes the slow path, which makes it unknown)
    if FLOAT_ONLY.issuperset(map(type, raw)) and _within(raw):
        return _tuple_of(GpuMetrics, raw)
    parsed = [parse_metric(name, value) for name, value in zip(METRIC_KEYS, raw, strict=True)]
    return _tuple_of(GpuMetrics, parsed)


def _within(values: tuple[object, ...]) -> bool:
    """Whether floats in :data:`METRIC_KEYS` order are each within their metric's bounds (two C loops)."""
    lows: Iterable[bool] = map(operator.le, METRIC_LOWS, values)  # type: ignore[arg-type]
    highs: Iterable[bool] = map(operator.le, values, METRIC_HIGHS)  # type: ignore[arg-type]
    return all(lows) and all(highs)


class MetricReading(NamedTuple):
    """One card's metrics of one beat. A named tuple: a beat builds one per card, in C
    (``tuple.__new__(MetricReading, (...))``), and the side path unpacks it without an attribute lookup."""

    key: CardKey
    uuid: str | None
    sampled_at: datetime
    metrics: GpuMetrics
    time_fix: TimeFix | None = None
    """Why ``sampled_at`` is not the agent's ``telemetry_at`` (``sample_times.py``)."""


def metric_readings_from_stats(
    stats: Sequence[Mapping[str, object]],
    *,
    node_id: NodeId,
    source: Source,
    received_at: datetime,
    window: SampleTimeWindow | None = None,
) -> list[MetricReading]:
    """The metric readings of one beat, by each stat's declared index (never its position; duplicates ignored).

    With ``window``, a ``telemetry_at`` outside it is replaced by the receive time (a year-9999 minute would
    break every flush, and future minutes would never close).
    """
    readings: list[MetricReading] = []
    seen: set[int] = set()
    for stat in stats:
        index = parse_index(stat.get("index"))
        if index is None or index in seen:
            continue
        seen.add(index)
        metrics = GpuMetrics.from_wire(stat)
        if metrics.all_unknown:
            continue
        # the telemetry's own time: `sampled_at` is the health counters' (every 60 s, not every beat)
        claimed = parse_time(stat.get("telemetry_at"))
        if window is None:
            sampled_at, fix = claimed or received_at, None
        else:
            sampled_at, fix = window.reading_time(claimed, received_at=received_at)
        readings.append(
            MetricReading(
                key=CardKey(node_id=node_id, gpu_index=index, source=source),
                uuid=parse_uuid(stat.get("uuid")),
                sampled_at=sampled_at,
                metrics=metrics,
                time_fix=fix,
            )
        )
    return readings


# -- per-minute aggregation ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Aggregate:
    """min / avg / max of one metric over some readings (avg weighted by the readings that knew it)."""

    min: float
    avg: float
    max: float
    count: int

    @staticmethod
    def combine(parts: Iterable[Aggregate]) -> Aggregate | None:
        items = list(parts)
        if not items:
            return None
        count = sum(p.count for p in items)
        return Aggregate(
            min=min(p.min for p in items),
            avg=sum(p.avg * p.count for p in items) / count,
            max=max(p.max for p in items),
            count=count,
        )


@dataclass(frozen=True, slots=True)
class MinuteRow:
    """One card's aggregates of one minute (``minute`` = the minute's start, UTC)."""

    key: CardKey
    uuid: str | None
    minute: datetime
    samples: int
    values: Mapping[str, Aggregate | None]


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


_WIDTH: Final = len(METRIC_KEYS)
_FOLD_AT: Final = 16
"""Readings a bucket keeps as they came before folding them into its running values: a card's minute at 5 s
beats (12 readings) is folded once, when the minute's row is built; a card beating faster keeps at most this
many."""

_HEAD: Final = struct.Struct(f"<{1 + 4 * _WIDTH}d")
"""A bucket's running values: the readings folded so far, then per metric in :data:`METRIC_KEYS` order the sum,
count, min and max of the folded readings that knew it."""
_READING: Final = struct.Struct(f"<{_WIDTH}d")
"""One reading as a bucket holds it until folded: its five values, NaN for unknown (a metric is never NaN)."""
_pack_reading: Final = _READING.pack
_EMPTY: Final = _HEAD.pack(0.0, *[0.0, 0.0, math.inf, -math.inf] * _WIDTH)
_FOLD_BYTES: Final = _HEAD.size + _FOLD_AT * _READING.size
_NAN: Final = math.nan
_MINUTE: Final = timedelta(minutes=1)

Bucket = bytearray
"""One card's readings of one minute in plain bytes (:data:`_HEAD`, then the readings not folded yet, each
:data:`_READING`): a ``bytearray`` holds no object, so the collector neither tracks nor walks it. A fleet's open
minutes are tens of thousands of buckets that live a minute and more; as objects (a list of floats per card) every
young collection walked the new ones and promoted them, and each middle collection walked them again (pauses of
40-150 ms at 10,000 nodes, docs/benchmarks.md). The readings are folded into the running values a column at a time
(``sum``, ``min``, ``max``: C loops) when the row is built or the bucket is full."""


def _packed(metrics: GpuMetrics) -> bytes:
    """One reading's values as :data:`_READING`: doubles, NaN for unknown (a metric is never NaN)."""
    if None in metrics:
        return _READING.pack(*[_NAN if value is None else value for value in metrics])
    return _READING.pack(*metrics)


NO_METRIC_VALUES: Final = _READING.pack(*[_NAN] * _WIDTH)
"""A card's newest metrics before its first reading, as :meth:`MinuteAggregator.add_beat` packs them: all
unknown."""


def read_metric_values(values: bytes | bytearray) -> tuple[float | None, ...]:
    """A reading's values as :meth:`MinuteAggregator.add_beat` packed them, in :data:`METRIC_KEYS` order, unknown as
    ``None`` (a scrape adds the values to its flat list one by one and drops the tuple)."""
    read = _READING.unpack(values)
    total = sum(read)
    if total == total:  # no NaN: every value known
        return read
    return tuple(None if value != value else value for value in read)


def _fold(bucket: Bucket) -> list[float]:
    """Fold the readings kept as they came into the running values; returns the running values (:data:`_HEAD`)."""
    head = list(_HEAD.unpack_from(bucket))
    pending = (len(bucket) - _HEAD.size) // _READING.size
    if not pending:
        return head
    values = struct.unpack_from(f"<{pending * _WIDTH}d", bucket, _HEAD.size)
    for position in range(_WIDTH):
        base = 1 + 4 * position
        column = values[position::_WIDTH]
        total = sum(column, head[base])  # left to right from the running sum
        if total != total:  # an unknown value (NaN) stays out of the aggregate, never counted as 0
            column = tuple(value for value in column if value == value)
            if not column:
                continue
            total = sum(column, head[base])
        head[base] = total
        head[base + 1] += len(column)
        head[base + 2] = min(head[base + 2], *column)
        head[base + 3] = max(head[base + 3], *column)
    head[0] += pending
    _HEAD.pack_into(bucket, 0, *head)
    del bucket[_HEAD.size :]
    return head


def bucket_samples(bucket: Bucket) -> int:
    """The readings a bucket holds, folded or not."""
    return int(_HEAD.unpack_from(bucket)[0]) + (len(bucket) - _HEAD.size) // _READING.size


def bucket_columns(bucket: Bucket) -> tuple[float | int | None, ...]:
    """Per metric, in :data:`METRIC_KEYS` order: min, avg, max, count (four ``None`` for an unknown one)."""
    head = _fold(bucket)
    flat: list[float | int | None] = []
    for base in range(1, len(head), 4):
        total, count, low, high = head[base : base + 4]
        flat += _UNKNOWN_COLUMNS if not count else (low, total / count, high, int(count))
    return tuple(flat)


def bucket_aggregates(bucket: Bucket) -> dict[str, Aggregate | None]:
    """Per metric name: its :class:`Aggregate`, ``None`` for an unknown one."""
    columns = bucket_columns(bucket)
    aggregates: dict[str, Aggregate | None] = {}
    for position, name in enumerate(METRIC_KEYS):
        low, avg, high, count = columns[4 * position : 4 * position + 4]
        aggregates[name] = None if count is None else Aggregate(min=low, avg=avg, max=high, count=count)  # type: ignore[arg-type]
    return aggregates


_UNKNOWN_COLUMNS: Final = (None, None, None, None)

SlotKey = tuple[NodeId, int, Source, str | None]
"""A bucket's card and uuid as one plain tuple of plain values, (node id, gpu index, source, uuid): built by
``(*key, uuid)`` in C, and, holding nothing the collector tracks, untracked by it like the readings."""

ClosedMinute = tuple[datetime, dict[SlotKey, Bucket]]
"""A minute taken out of :class:`MinuteAggregator`: its start and its buckets by (card, uuid)."""

ClosedSlot = tuple[datetime, tuple[SlotKey, Bucket]]
"""One card's bucket of a closed minute, not yet made a row: (minute, ((node, gpu, source, uuid), bucket))."""

FlatRow = tuple[Any, ...]
"""One card's minute as plain values, no object per row: node id, gpu index, source, uuid, minute, samples, then
per metric in :data:`METRIC_KEYS` order min, avg, max and count (``None`` for an unknown metric)."""


def flat_row(slot: ClosedSlot) -> FlatRow:
    """The :data:`FlatRow` of one closed bucket (a few microseconds: rows are built a slice at a time)."""
    minute, (card, bucket) = slot
    return (*card, minute, bucket_samples(bucket), *bucket_columns(bucket))


def flat_of(row: MinuteRow) -> FlatRow:
    """The :data:`FlatRow` of a :class:`MinuteRow`."""
    flat: list[Any] = [row.key.node_id, row.key.gpu_index, row.key.source, row.uuid, row.minute, row.samples]
    for name in METRIC_KEYS:
        agg = row.values.get(name)
        flat += _UNKNOWN_COLUMNS if agg is None else (agg.min, agg.avg, agg.max, agg.count)
    return tuple(flat)


def minute_rows(taken: Sequence[ClosedMinute]) -> list[MinuteRow]:
    """The rows of closed minutes, by minute, node and card. Pure: the buckets are no one else's once taken."""
    rows: list[MinuteRow] = []
    for minute, group in taken:
        rows.extend(
            MinuteRow(
                key=CardKey(node_id=node_id, gpu_index=gpu_index, source=source),
                uuid=uuid,
                minute=minute,
                samples=bucket_samples(bucket),
                values=bucket_aggregates(bucket),
            )
            for (node_id, gpu_index, source, uuid), bucket in sorted(group.items(), key=lambda item: item[0][:2])
        )
    return rows


class MinuteAggregator:
    """Readings in, closed per-minute rows out. Memory holds one open bucket per card and minute.

    A minute closes once the clock has passed its end (plus ``grace`` for late beats); a reading of a minute
    that already closed opens a new bucket for it, which becomes a second row of that minute (reads merge them).
    """

    def __init__(self, *, grace: timedelta = timedelta(seconds=5)) -> None:
        self._grace = grace
        # by minute, then by card: closing a minute takes its whole group, and a flush looks at the open
        # minutes (two or three), not at every card's bucket (24,000 for a fleet) on the event loop
        self._minutes: dict[datetime, dict[SlotKey, Bucket]] = {}
        self._last_at: datetime | None = None
        self._last_minute = self._next_minute = datetime.min
        self._last_group: dict[SlotKey, Bucket] | None = None

    def __len__(self) -> int:
        return sum(len(group) for group in self._minutes.values())

    def add(self, reading: MetricReading) -> None:
        self.add_beat((reading,))

    def add_beat(self, readings: Iterable[MetricReading]) -> list[bytes]:
        """Take one beat's readings (or any readings): each appended to its card's bucket of its minute. Returns
        each reading's values as appended (:func:`read_metric_values` reads them), in the readings' order: a
        card's newest values, packed once for both."""
        appended: list[bytes] = []
        for key, uuid, at, metrics, _ in readings:
            group = self._last_group
            if at is not self._last_at or group is None:
                # a beat's cards share one parsed time, and most beats fall in the minute of the one before: its
                # group is looked up again only when the minute changes
                if group is None or not self._last_minute <= at < self._next_minute:
                    minute = minute_of(at)
                    self._last_minute, self._next_minute = minute, minute + _MINUTE
                    group = self._last_group = self._minutes.setdefault(minute, {})
                self._last_at = at
            slot = (*key, uuid)
            bucket = group.get(slot)
            if bucket is None:
                bucket = group[slot] = bytearray(_EMPTY)
            # five doubles, unknown as NaN: nothing made that the collector tracks (a known reading packed in line)
            values = _pack_reading(*metrics) if None not in metrics else _packed(metrics)
            bucket += values
            if len(bucket) >= _FOLD_BYTES:
                _fold(bucket)
            appended.append(values)
        return appended

    def close(self, *, now: datetime | None) -> list[MinuteRow]:
        """Remove and return the rows of every minute that ended before ``now - grace`` (all when ``None``)."""
        return minute_rows(self.take_closed(now=now))

    def take_closed(self, *, now: datetime | None) -> list[ClosedMinute]:
        """Remove and return the minutes that ended before ``now - grace`` (all when ``None``), oldest first, as
        they are: cheap enough for the event loop; :func:`minute_rows` (24,000 rows a minute for a fleet) can
        then run elsewhere, as nothing else holds the taken buckets."""
        taken: list[ClosedMinute] = []
        for minute in sorted(self._minutes):
            if now is not None and minute + timedelta(minutes=1) + self._grace > now:
                continue
            taken.append((minute, self._minutes.pop(minute)))
            if taken[-1][1] is self._last_group:
                self._last_group, self._last_at = None, None  # a late reading of it opens a new group
        return taken

    def forget_node(self, node_id: NodeId) -> None:
        for group in self._minutes.values():
            for slot in [slot for slot in group if slot[0] == node_id]:
                del group[slot]


def downsample(rows: Sequence[MinuteRow], *, start: datetime, step: timedelta) -> list[MinuteRow]:
    """Merge one card's minute rows into ``step``-wide buckets aligned on ``start`` (ascending by time)."""
    groups: dict[datetime, list[MinuteRow]] = {}
    for row in rows:
        bucket = start + step * ((row.minute - start) // step)
        groups.setdefault(bucket, []).append(row)
    merged: list[MinuteRow] = []
    for at in sorted(groups):
        group = groups[at]
        merged.append(
            MinuteRow(
                key=group[0].key,
                uuid=group[-1].uuid,
                minute=at,
                samples=sum(r.samples for r in group),
                values={
                    name: Aggregate.combine(a for r in group if (a := r.values.get(name)) is not None)
                    for name in METRIC_KEYS
                },
            )
        )
    return merged


# -- GPU_MEMORY_HIGH ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryHighParams:
    share: float = 0.95
    """Memory used / total above which a card counts as full (0 < share <= 1)."""
    duration: timedelta = timedelta(minutes=10)
    """How long a card must stay above ``share`` before the node's alert is raised."""


@dataclass(frozen=True, slots=True)
class MemoryHighDecision:
    raise_for: Mapping[NodeId, tuple[int, ...]]
    """Nodes whose alert must be opened, with their full cards (ascending index)."""
    resolve: tuple[NodeId, ...]
    """Nodes whose open alert must be resolved: no card of theirs is full any more."""


class MemoryHighTracker:
    """Since when each card's memory has stayed above the share; only readings move it, never the clock.

    A reading at or below the share, or one whose memory is unknown, ends the card's streak: the alert claims
    the memory *is* full, so it is not kept open on what was not observed.
    """

    def __init__(self, params: MemoryHighParams) -> None:
        self._params = params
        self._above_since: dict[CardKey, datetime] = {}
        self._last_seen: dict[CardKey, datetime] = {}

    def observe(self, reading: MetricReading) -> None:
        share = reading.metrics.memory_share
        self._last_seen[reading.key] = reading.sampled_at
        if share is not None and share > self._params.share:
            self._above_since.setdefault(reading.key, reading.sampled_at)
        else:
            self._above_since.pop(reading.key, None)

    def forget_node(self, node_id: NodeId) -> None:
        for key in [key for key in self._last_seen if key.node_id == node_id]:
            self._last_seen.pop(key, None)
            self._above_since.pop(key, None)

    def full_cards(self, *, now: datetime, stale: timedelta, for_at_least: timedelta) -> dict[NodeId, tuple[int, ...]]:
        """Cards above the share for at least ``for_at_least``, and still reporting (seen within ``stale``)."""
        full: dict[NodeId, list[int]] = {}
        for key, since in self._above_since.items():
            last = self._last_seen[key]
            if now - last > stale or last - since < for_at_least:
                continue
            full.setdefault(key.node_id, []).append(key.gpu_index)
        return {node: tuple(sorted(cards)) for node, cards in full.items()}

    def decide(self, *, now: datetime, stale: timedelta, open_on: Iterable[NodeId]) -> MemoryHighDecision:
        """Which node alerts to open and which to resolve, given the nodes whose alert is open now."""
        full = self.full_cards(now=now, stale=stale, for_at_least=self._params.duration)
        # resolving needs every card below the share, not merely "not full for the whole duration yet": a server
        # that restarts while a card is still full must not resolve the alert and raise it again minutes later
        above = self.full_cards(now=now, stale=stale, for_at_least=timedelta(0))
        opened = set(open_on)
        return MemoryHighDecision(
            raise_for={node: cards for node, cards in full.items() if node not in opened},
            resolve=tuple(sorted(node for node in opened if node not in above)),
        )


def memory_high_message(*, node_name: str, gpu_indexes: Sequence[int], share: float, duration: timedelta) -> str:
    """Says the card is healthy and busy. Distinct from GPU_FAULT_PREDICTED: no hardware trouble is suggested."""
    cards = ", ".join(f"GPU {index}" for index in gpu_indexes)
    minutes = int(duration.total_seconds() // 60)
    return (
        f"GPU memory nearly full on {node_name} ({cards}): above {share:.0%} of memory for at least {minutes} "
        "minutes. The card itself is healthy and busy; this is the workload's memory use, not a hardware problem. "
        "Check the job's batch size or memory settings, or schedule it on a card with more memory."
    )


MEMORY_HIGH_RESOLUTION: Final = "memory use dropped below the threshold (or is no longer reported)"
