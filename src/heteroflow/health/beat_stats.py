"""One heartbeat's GPU stats, parsed once for both side paths: the health counters and the telemetry.

:func:`heteroflow.health.heartbeat.readings_from_stats` and
:func:`heteroflow.health.gpu_metrics.metric_readings_from_stats` each read a stat's index, uuid and times; a beat
needs both, so :func:`beat_readings` reads every stat once and gives the two lists those functions give (same
rules: the declared index, never the position; a repeated index is ignored; unknown is ``None``, never 0). The
readings of one card share their key, and the agent's times (one collection time for every card of a beat) are
parsed once per distinct text. The card keys and the readings are named tuples, built as plain tuples of their
class in C: the same objects, for a fraction of a dataclass's generated ``__init__``.

A clean agent body (``core/request_body.py``) is first decoded by :data:`WIRE_BEAT` (msgspec, native code) into
:class:`WireStat` records: every value of the common card (an index in range, counters that are plain non-negative
64-bit integers, metrics within their bounds) is typed and bounded while it is parsed, so their reading here skips
the checks. Any body that decoder refuses (an odd value anywhere, a string where a number belongs) takes the
general path, which reads each value leniently; where both accept a body they give the same readings (a test
compares them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from operator import itemgetter, le
from typing import Annotated, Any, Final, NamedTuple

import msgspec
from msgspec.structs import astuple

from heteroflow.contracts.heartbeat import MAX_GPU_STATS, MAX_XID_EVENTS
from heteroflow.core.ids import NodeId, Source
from heteroflow.health.counters import (
    COUNTER_MAX,
    HEALTH_KEYS,
    PLAIN_WIRE_TYPES,
    counters_from_values,
    interned_counters,
    parse_keys,
    shared_counters,
)
from heteroflow.health.gpu_metrics import (
    FLOAT_ONLY,
    METRIC_HIGHS,
    METRIC_KEYS,
    METRIC_LOWS,
    GpuMetrics,
    MetricReading,
    metrics_from_values,
)
from heteroflow.health.heartbeat import MAX_GPU_INDEX, MAX_UUID_LENGTH, parse_index, parse_time, parse_uuid
from heteroflow.health.sample_times import SampleTimeWindow, TimeFix
from heteroflow.health.samples import CardKey, HealthReading

_tuple_of = tuple.__new__
"""CardKey, HealthReading and MetricReading are named tuples: ``_tuple_of(CardKey, (node, index, source))``
builds one in C."""
_STAT_KEYS: Final = ("index", "uuid", "sampled_at", "telemetry_at", "semantics_unconfirmed", *HEALTH_KEYS, *METRIC_KEYS)
"""What a card's stat is read for, in one ``map`` (the counters and the metrics are the two slices below)."""
_FIX: Final = itemgetter(1)
"""A remembered time's fix (``None``, or a :class:`TimeFix`)."""
_COUNTERS: Final = slice(5, 5 + len(HEALTH_KEYS))
_METRICS: Final = slice(5 + len(HEALTH_KEYS), None)

_Counter = Annotated[int, msgspec.Meta(ge=0, le=COUNTER_MAX)] | None
WireStat: Final = msgspec.defstruct(
    "WireStat",
    [
        ("index", Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_INDEX)]),
        ("uuid", str | None, None),
        ("sampled_at", str | None, None),
        ("telemetry_at", str | None, None),
        ("semantics_unconfirmed", Any, None),  # read leniently below (parse_keys), as on the general path
        *((name, _Counter, None) for name in HEALTH_KEYS),
        *(
            (name, Annotated[float, msgspec.Meta(ge=low, le=high)] | None, None)
            for name, low, high in zip(METRIC_KEYS, METRIC_LOWS, METRIC_HIGHS, strict=True)
        ),
    ],
    module=__name__,
    gc=False,
)
"""A card's stat as the common agent sends it, typed and bounded as it is decoded; its fields in
:data:`_STAT_KEYS` order, so that ``astuple`` gives what the general path reads with ``map(stat.get, ...)``. Not
tracked by the garbage collector (``gc=False``: decoded JSON holds no cycle), like the readings made of it. An
integer for a metric is taken as its float (as :func:`~heteroflow.health.gpu_metrics.parse_metric` does); an
integral float for a counter or an index, a boolean, a string where a number belongs, or a value out of bounds
is refused, and the body takes the general path."""


class WireBeat(msgspec.Struct, gc=False):
    """A clean heartbeat body as :data:`WIRE_BEAT` decodes it: what the route reads of a
    :class:`~heteroflow.contracts.heartbeat.Heartbeat`, with the stats typed."""

    gpu_stats: Annotated[list[WireStat], msgspec.Meta(max_length=MAX_GPU_STATS)] = []  # type: ignore[valid-type]
    xid_events: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=MAX_XID_EVENTS)] = []
    xid_collection: Any = None
    tool_stalls: Any = None


WIRE_BEAT: Final = msgspec.json.Decoder(WireBeat)
"""``WIRE_BEAT.decode(body)``: a :class:`WireBeat`, or ``msgspec.DecodeError`` (its ``ValidationError`` included)
for any body it does not take as the common agent's."""


class BeatReadings(NamedTuple):
    """One beat's readings for the two side paths. A named tuple: one per beat, built in C."""

    health: list[HealthReading]
    """What :func:`~heteroflow.health.heartbeat.readings_from_stats` gives."""
    metrics: list[MetricReading]
    """What :func:`~heteroflow.health.gpu_metrics.metric_readings_from_stats` gives."""
    invalid: int
    """Stats without a usable declared index (or repeating one)."""
    corrected: bool = False
    """Whether any reading's time was replaced (a :class:`TimeFix`): nearly never, and then the route counts them."""


def beat_readings(
    stats: Sequence[Mapping[str, object]] | Sequence[Any],
    *,
    node_id: NodeId,
    source: Source,
    received_at: datetime,
    window: SampleTimeWindow | None = None,
) -> BeatReadings:
    """The health and the metric readings of one beat's stats (wire objects, or :class:`WireStat` records that
    :data:`WIRE_BEAT` decoded, all of one kind), each stat read once."""
    typed = bool(stats) and type(stats[0]) is WireStat
    health: list[HealthReading] = []
    metrics: list[MetricReading] = []
    seen: set[int] = set()
    invalid = 0
    # the agent sends one collection time for every card of a beat: each distinct text is parsed and checked
    # against the window once, not once per card and side path
    times: dict[str, tuple[datetime, TimeFix | None]] = {}
    for stat in stats:
        # every value a card needs, read in C
        raw: tuple[object, ...] = astuple(stat) if typed else tuple(map(stat.get, _STAT_KEYS))  # type: ignore[arg-type]
        index = raw[0]
        if type(index) is not int or not 0 <= index <= MAX_GPU_INDEX:  # the common case first (a bool is no int)
            index = parse_index(index)
        if index is None or index in seen:
            invalid += 1
            continue
        seen.add(index)
        key = _tuple_of(CardKey, (node_id, index, source))
        uuid = raw[1]
        if type(uuid) is str:  # parse_uuid, written out for the common case
            uuid = uuid.strip()
            if not 0 < len(uuid) <= MAX_UUID_LENGTH:
                uuid = None
        else:
            uuid = parse_uuid(uuid)
        time_text = raw[2]
        timed = times.get(time_text) if type(time_text) is str else None
        if timed is None:
            timed = _stored_time(times, time_text, received_at=received_at, window=window)
        unconfirmed = raw[4]  # absent for nearly every card: no call to parse nothing
        semantics = () if unconfirmed is None else parse_keys(unconfirmed)
        # a steady card's counters are found among the shared ones in C, without a call (counters_from_values)
        counter_values: tuple[int | None, ...] = raw[_COUNTERS]  # type: ignore[assignment]  # types checked first
        if typed:  # plain non-negative 64-bit integers and nulls: what counters_from_values would keep as they are
            counters = shared_counters(counter_values) or interned_counters(counter_values)
        else:
            plain = PLAIN_WIRE_TYPES.issuperset(map(type, counter_values))
            counters = (plain and shared_counters(counter_values)) or counters_from_values(counter_values)
        health.append(_tuple_of(HealthReading, (key, uuid, timed[0], counters, timed[1], semantics)))
        values = raw[_METRICS]
        # the common card, written out: five floats within their bounds, checked in C (a NaN or an infinity
        # fails a comparison); anything else is parsed value by value (gpu_metrics.metrics_from_values)
        floats: tuple[float, ...] = values  # type: ignore[assignment]  # checked first below, in C
        if typed:  # floats within their bounds, or nulls: what metrics_from_values would keep as they are
            card_metrics: GpuMetrics = _tuple_of(GpuMetrics, values)
            if None in values and card_metrics.all_unknown:
                continue
        elif (
            FLOAT_ONLY.issuperset(map(type, values))
            and all(map(le, METRIC_LOWS, floats))
            and all(map(le, floats, METRIC_HIGHS))
        ):
            card_metrics = _tuple_of(GpuMetrics, values)
        else:
            card_metrics = metrics_from_values(values)
            if card_metrics.all_unknown:
                continue
        # the telemetry's own time: `sampled_at` is the health counters' (every 60 s, not every beat)
        time_text = raw[3]
        timed = times.get(time_text) if type(time_text) is str else None
        if timed is None:
            timed = _stored_time(times, time_text, received_at=received_at, window=window)
        metrics.append(_tuple_of(MetricReading, (key, uuid, timed[0], card_metrics, timed[1])))
    # every time a reading carries came from `times` (a claim that was no text claims nothing: no fix; a fix is
    # a non-empty string, so true)
    corrected = any(map(_FIX, times.values()))
    return _tuple_of(BeatReadings, (health, metrics, invalid, corrected))


def _stored_time(
    known: dict[str, tuple[datetime, TimeFix | None]],
    raw: object,
    *,
    received_at: datetime,
    window: SampleTimeWindow | None,
) -> tuple[datetime, TimeFix | None]:
    """The time a reading claiming ``raw`` is stored under and its fix (anything but text claims no time);
    remembered in ``known`` for the beat's other cards."""
    claimed = parse_time(raw) if isinstance(raw, str) else None
    if window is None:
        timed: tuple[datetime, TimeFix | None] = (claimed or received_at, None)
    else:
        timed = window.reading_time(claimed, received_at=received_at)
    if isinstance(raw, str):
        known[raw] = timed
    return timed
