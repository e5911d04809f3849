"""Metric parsing, per-minute aggregation, downsampling, the GPU_MEMORY_HIGH tracker and the weak signals."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.core.ids import NodeId
from heteroflow.health.gpu_metrics import (
    METRIC_KEYS,
    NO_METRIC_VALUES,
    Aggregate,
    GpuMetrics,
    MemoryHighParams,
    MemoryHighTracker,
    MetricReading,
    MinuteAggregator,
    MinuteRow,
    bucket_samples,
    downsample,
    flat_row,
    metric_readings_from_stats,
    metrics_from_values,
    parse_metric,
    read_metric_values,
)
from heteroflow.health.gpu_metrics import (
    minute_rows as rows_of_minutes,
)
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.samples import CardKey
from heteroflow.health.weak_signals import WeakSignalParams, weak_signals

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY = CardKey(node_id=NodeId("n1"), gpu_index=0, source="real")


def reading(at: datetime, **metrics: float | None) -> MetricReading:
    return MetricReading(key=KEY, uuid="GPU-a", sampled_at=at, metrics=GpuMetrics(**metrics))


@pytest.mark.parametrize("value", [None, True, "12", float("nan"), float("inf"), -1, 1e12, [1]])
def test_malformed_or_implausible_metrics_are_unknown(value: object) -> None:
    assert parse_metric("utilization_pct", value) is None


def test_readings_use_the_declared_index_and_skip_cards_without_metrics() -> None:
    stats: list[dict[str, object]] = [
        {"index": 3, "temperature_c": 50},
        {"index": 1, "temperature_c": "hot"},  # nothing known: no reading
        {"index": 3, "temperature_c": 99},  # the same index twice: ambiguous, ignored
        {"temperature_c": 40},
    ]
    readings = metric_readings_from_stats(stats, node_id=NodeId("n1"), source="real", received_at=T0)
    assert [(r.key.gpu_index, r.metrics.temperature_c) for r in readings] == [(3, 50.0)]


def test_metrics_are_filed_at_the_telemetry_time_never_the_health_counters_time() -> None:
    stats: list[dict[str, object]] = [
        # counters read at 10:00:50, telemetry at 10:01:15: the metrics belong to 10:01
        {"index": 0, "sampled_at": "2026-03-01T10:00:50Z", "telemetry_at": "2026-03-01T10:01:15Z", "power_w": 300},
        {"index": 1, "sampled_at": "2026-03-01T10:00:50Z", "power_w": 200},  # no telemetry time: received
    ]
    readings = metric_readings_from_stats(stats, node_id=NodeId("n1"), source="real", received_at=T0)
    assert [r.sampled_at for r in readings] == [datetime(2026, 3, 1, 10, 1, 15, tzinfo=UTC), T0]


def test_a_minute_closes_after_its_end_plus_grace_with_min_avg_max_of_known_values() -> None:
    agg = MinuteAggregator(grace=timedelta(seconds=5))
    agg.add(reading(T0, temperature_c=40, power_w=None))
    agg.add(reading(T0 + timedelta(seconds=30), temperature_c=50, power_w=200))
    agg.add(reading(T0 + timedelta(seconds=61), temperature_c=70))
    assert agg.close(now=T0 + timedelta(seconds=64)) == []
    (row,) = agg.close(now=T0 + timedelta(seconds=65))
    assert row.samples == 2
    assert row.values["temperature_c"] == Aggregate(min=40, avg=45, max=50, count=2)
    assert row.values["power_w"] == Aggregate(min=200, avg=200, max=200, count=1)
    assert row.values["memory_used_mib"] is None  # unknown all minute, never 0
    assert len(agg) == 1
    assert [r.minute for r in agg.close(now=None)] == [T0 + timedelta(minutes=1)]


@given(st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=30), st.integers(1, 10))
def test_downsampling_keeps_extremes_and_the_weighted_mean(values: list[float], step: int) -> None:
    rows = [
        MinuteRow(
            key=KEY,
            uuid="GPU-a",
            minute=T0 + timedelta(minutes=i),
            samples=2,
            values={"utilization_pct": Aggregate(min=v, avg=v, max=v, count=2)},
        )
        for i, v in enumerate(values)
    ]
    merged = downsample(rows, start=T0, step=timedelta(minutes=step))
    assert sum(r.samples for r in merged) == 2 * len(values)
    aggs = [a for r in merged if (a := r.values["utilization_pct"]) is not None]
    assert min(a.min for a in aggs) == min(values)
    assert max(a.max for a in aggs) == max(values)
    assert sum(a.avg * a.count for a in aggs) / sum(a.count for a in aggs) == pytest.approx(sum(values) / len(values))


def test_memory_high_needs_the_full_duration_and_resolves_on_the_first_low_or_unknown_reading() -> None:
    tracker = MemoryHighTracker(MemoryHighParams(share=0.9, duration=timedelta(minutes=5)))
    stale = timedelta(minutes=5)
    for s in range(0, 300, 5):
        tracker.observe(reading(T0 + timedelta(seconds=s), memory_used_mib=95, memory_total_mib=100))
    assert tracker.decide(now=T0 + timedelta(seconds=300), stale=stale, open_on=[]).raise_for == {}
    tracker.observe(reading(T0 + timedelta(seconds=300), memory_used_mib=95, memory_total_mib=100))
    decision = tracker.decide(now=T0 + timedelta(seconds=300), stale=stale, open_on=[])
    assert decision.raise_for == {NodeId("n1"): (0,)}
    assert tracker.decide(now=T0 + timedelta(seconds=300), stale=stale, open_on=[NodeId("n1")]).raise_for == {}
    tracker.observe(reading(T0 + timedelta(seconds=305), memory_used_mib=None, memory_total_mib=100))
    assert tracker.decide(now=T0, stale=stale, open_on=[NodeId("n1")]).resolve == (NodeId("n1"),)


def test_a_restarted_tracker_keeps_an_open_alert_while_the_card_is_still_full() -> None:
    tracker = MemoryHighTracker(MemoryHighParams(share=0.9, duration=timedelta(minutes=10)))
    tracker.observe(reading(T0, memory_used_mib=95, memory_total_mib=100))
    decision = tracker.decide(now=T0, stale=timedelta(minutes=5), open_on=[NodeId("n1")])
    assert decision.resolve == ()
    assert decision.raise_for == {}


def test_a_card_that_stops_reporting_no_longer_counts_as_full() -> None:
    tracker = MemoryHighTracker(MemoryHighParams(share=0.5, duration=timedelta(seconds=10)))
    for s in (0, 10):
        tracker.observe(reading(T0 + timedelta(seconds=s), memory_used_mib=80, memory_total_mib=100))
    late = T0 + timedelta(minutes=20)
    assert tracker.decide(now=late, stale=timedelta(minutes=5), open_on=[NodeId("n1")]).resolve == (NodeId("n1"),)


def minute_rows(start: datetime, minutes: int, *, uuid: str = "GPU-a", **values: float) -> list[MinuteRow]:
    aggs = {name: Aggregate(min=v, avg=v, max=v, count=12) for name, v in values.items()}
    return [
        MinuteRow(key=KEY, uuid=uuid, minute=start + timedelta(minutes=m), samples=12, values=aggs)
        for m in range(minutes)
    ]


def test_weak_signals_need_enough_known_minutes_of_the_same_card() -> None:
    params = WeakSignalParams()
    t0 = T0 + timedelta(days=3)
    hot = minute_rows(t0 - timedelta(hours=1), 30, temperature_c=91)
    assert [s.code for s in weak_signals(hot, uuid="GPU-a", t0=t0, params=params)] == ["temperature_high"]
    assert weak_signals(hot[:29], uuid="GPU-a", t0=t0, params=params) == []
    assert weak_signals(hot, uuid="GPU-b", t0=t0, params=params) == []  # another card's heat is not this card's
    before = minute_rows(t0 - timedelta(days=2), 60, power_w=300, utilization_pct=95.0)
    after = minute_rows(t0 - timedelta(hours=2), 60, power_w=200, utilization_pct=95.0)
    (signal,) = weak_signals(before + after, uuid="GPU-a", t0=t0, params=params)
    assert signal.layer == "weak"
    assert signal.code == "power_shift"
    assert weak_signals(before + after[:59], uuid="GPU-a", t0=t0, params=params) == []
    idle = minute_rows(t0 - timedelta(hours=2), 60, power_w=100, utilization_pct=10)
    assert weak_signals(before + idle, uuid="GPU-a", t0=t0, params=params) == []  # idle power says nothing


def test_settings_fall_back_and_build_the_rule_parameters() -> None:
    settings = GpuMetricsSettings.load(retention_days="0", memory_high_share="1.5", memory_high_minutes="3")
    assert settings.retention_days == 7
    assert settings.memory_high == MemoryHighParams(share=0.95, duration=timedelta(minutes=3))
    assert len(settings.config_warnings) == 2
    assert settings.weak.history == timedelta(days=7)


@pytest.mark.parametrize("name", METRIC_KEYS)
def test_one_known_metric_of_any_kind_is_not_all_unknown(name: str) -> None:
    assert GpuMetrics().all_unknown
    assert not GpuMetrics(**{name: 0.0}).all_unknown


def test_a_bucket_beyond_its_fold_gives_the_same_aggregate_as_one_value_at_a_time() -> None:
    values = [40.0, None, 55.5, 39.0, None, 70.25, 41.0] * 5  # more readings than a bucket keeps unfolded
    agg = MinuteAggregator()
    for n, value in enumerate(values):
        agg.add(reading(T0 + timedelta(milliseconds=n), temperature_c=value, power_w=None))
    [row] = agg.close(now=None)
    known = [value for value in values if value is not None]
    assert row.samples == len(values)
    assert row.values["temperature_c"] == Aggregate(
        min=min(known), avg=sum(known) / len(known), max=max(known), count=len(known)
    )
    assert row.values["power_w"] is None  # unknown in every reading: no aggregate, never 0


@given(st.lists(st.integers(min_value=-90, max_value=179), min_size=1, max_size=60))
def test_readings_in_any_order_of_times_land_in_their_own_minutes(seconds: list[int]) -> None:
    """The aggregator looks a minute's group up again only when a reading leaves the minute of the one before:
    readings that go back and forth between minutes (late beats, a clock stepping) still land in their own."""
    agg = MinuteAggregator()
    for offset in seconds:
        agg.add(reading(T0 + timedelta(seconds=offset), temperature_c=float(offset % 60)))
    rows = agg.close(now=None)
    expected: dict[datetime, list[float]] = {}
    for offset in seconds:
        at = T0 + timedelta(seconds=offset)
        expected.setdefault(at.replace(second=0), []).append(float(offset % 60))
    assert {row.minute: row.samples for row in rows} == {minute: len(values) for minute, values in expected.items()}
    for row in rows:
        values = expected[row.minute]
        assert row.values["temperature_c"] == Aggregate(
            min=min(values), avg=sum(values) / len(values), max=max(values), count=len(values)
        )


_METRIC_VALUE = st.one_of(st.none(), st.floats(min_value=0.0, max_value=100.0), st.sampled_from([0.0, -0.0, 100.0]))


@given(st.lists(st.tuples(*[_METRIC_VALUE] * len(METRIC_KEYS)), min_size=1, max_size=40))
def test_a_minute_row_aggregates_exactly_the_known_values_of_each_metric(beats: list[tuple[float | None, ...]]) -> None:
    """Whatever the mix of unknown values and however often the bucket folded, each metric's row is the min, mean
    and max of the readings that knew it, added left to right; a metric no reading knew is unknown."""
    agg = MinuteAggregator()
    for n, values in enumerate(beats):
        agg.add(reading(T0 + timedelta(milliseconds=n), **dict(zip(METRIC_KEYS, values, strict=True))))
    [taken] = agg.take_closed(now=None)
    [(slot, bucket)] = taken[1].items()
    [row] = rows_of_minutes([taken])
    assert row.samples == len(beats)
    flat: list[object] = [*KEY, "GPU-a", T0.replace(second=0, microsecond=0), len(beats)]
    for position, name in enumerate(METRIC_KEYS):
        known = [value for values in beats if (value := values[position]) is not None]
        expected = Aggregate(min(known), sum(known) / len(known), max(known), len(known)) if known else None
        assert row.values[name] == expected
        flat += (None,) * 4 if expected is None else (expected.min, expected.avg, expected.max, expected.count)
    assert flat_row((taken[0], (slot, bucket))) == tuple(flat)


_WIRE_VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-50.0, 200.0, 0.0, 100.0, 16_777_216.0, 100_000.0, -0.0]),  # the bounds themselves
    st.none(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.booleans(),
    st.text(max_size=3),
)


@given(st.tuples(*[_WIRE_VALUE] * len(METRIC_KEYS)))
def test_the_float_fast_path_reads_every_value_as_parse_metric_does(raw: tuple[object, ...]) -> None:
    metrics = metrics_from_values(raw)
    expected = tuple(parse_metric(name, value) for name, value in zip(METRIC_KEYS, raw, strict=True))
    assert type(metrics) is GpuMetrics
    assert [(type(v), v) for v in metrics] == [(type(v), v) for v in expected]


def test_a_beat_gives_back_each_readings_values_as_its_bucket_took_them() -> None:
    """The recorder keeps a card's newest values as the bytes its minute bucket took: read back, they are the
    reading's values, an unknown one unknown (never 0); before any reading, all unknown."""
    agg = MinuteAggregator()
    first = reading(T0, temperature_c=41.5, power_w=None)
    second = reading(T0 + timedelta(seconds=5), temperature_c=42.0, power_w=310.0)
    packed = agg.add_beat([first, second])
    assert [read_metric_values(values) for values in packed] == [tuple(first.metrics), tuple(second.metrics)]
    assert read_metric_values(packed[0])[METRIC_KEYS.index("power_w")] is None
    assert not any(gc.is_tracked(values) for values in packed)
    assert read_metric_values(NO_METRIC_VALUES) == (None,) * len(METRIC_KEYS)


def test_an_open_minute_holds_nothing_the_collector_walks_but_one_bucket_per_card() -> None:
    """A fleet's open minutes are hundreds of thousands of readings: kept as plain bytes, one buffer per card
    that the collector never tracks, keyed by a plain tuple of plain values, which it stops tracking once it
    has seen it."""
    agg = MinuteAggregator()
    for second in range(0, 60, 5):
        agg.add_beat([reading(T0 + timedelta(seconds=second), temperature_c=40.0 + second, power_w=300.0)])
    gc.collect()
    [group] = agg._minutes.values()
    [(slot, bucket)] = group.items()
    assert slot == (KEY.node_id, KEY.gpu_index, KEY.source, "GPU-a")
    assert not gc.is_tracked(slot)
    assert bucket_samples(bucket) == 12
    assert not gc.is_tracked(bucket)
    [row] = agg.close(now=None)
    assert row.key == KEY
    assert row.samples == 12
    assert row.values["temperature_c"] == Aggregate(40.0, 67.5, 95.0, 12)
