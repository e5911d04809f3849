"""One beat's stats read once for both side paths: the same readings the two separate parsers give, and the
shared (interned) values never confuse a boolean, a negative or a non-finite number with a plain one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from heteroflow.core.ids import NodeId
from heteroflow.health.beat_stats import beat_readings
from heteroflow.health.counters import HEALTH_KEYS, Counters, parse_counter
from heteroflow.health.gpu_metrics import METRIC_KEYS, GpuMetrics, metric_readings_from_stats, parse_metric
from heteroflow.health.heartbeat import readings_from_stats
from heteroflow.health.sample_times import SampleTimeWindow

RECEIVED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
WINDOW = SampleTimeWindow(
    max_ahead=timedelta(seconds=30), max_behind=timedelta(hours=1), max_event_age=timedelta(days=180)
)
NODE = NodeId("n1")

wire_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([2**63 - 1, 2**63, 12.0, 12.5, -0.5, 41.0, 250.0, float("nan"), float("inf")]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["7", "", [], {}]),
)
times = st.one_of(
    st.none(),
    st.sampled_from(
        ["2026-03-01T11:59:58+00:00", "2026-03-01T11:59:58Z", "2026-03-01T13:00:00+00:00", "2020-01-01T00:00:00", "x"]
    ),
    st.integers(),
    st.lists(st.integers(), max_size=1),
)
stats = st.lists(
    st.fixed_dictionaries(
        {"index": st.one_of(st.integers(min_value=-1, max_value=3), st.booleans(), st.none(), st.just(1.0))},
        optional={
            "uuid": st.one_of(st.none(), st.sampled_from(["GPU-a", " GPU-b ", "", 3])),
            "sampled_at": times,
            "telemetry_at": times,
            "semantics_unconfirmed": st.one_of(st.none(), st.just(["ecc_corrected_total", "x"])),
            **dict.fromkeys((*HEALTH_KEYS, *METRIC_KEYS), wire_values),
        },
    ),
    max_size=6,
)


@settings(max_examples=300)
@given(stats)
def test_the_same_readings_as_the_two_separate_parsers(beat: list[dict[str, object]]) -> None:
    for _ in range(2):  # the second time, every value is found among the shared ones
        parsed = beat_readings(beat, node_id=NODE, source="real", received_at=RECEIVED, window=WINDOW)
        health, invalid = readings_from_stats(beat, node_id=NODE, source="real", received_at=RECEIVED, window=WINDOW)
        metrics = metric_readings_from_stats(beat, node_id=NODE, source="real", received_at=RECEIVED, window=WINDOW)
        assert parsed.health == health
        assert parsed.invalid == invalid
        assert parsed.metrics == metrics
        fixes = [r.time_fix for r in parsed.health] + [r.time_fix for r in parsed.metrics]
        assert parsed.corrected == any(fix is not None for fix in fixes)


@settings(max_examples=300)
@given(st.fixed_dictionaries(dict.fromkeys((*HEALTH_KEYS, *METRIC_KEYS), wire_values)))
def test_shared_values_are_the_values_parsed_one_by_one(stat: dict[str, object]) -> None:
    expected_counters = Counters(**{name: parse_counter(stat.get(name)) for name in HEALTH_KEYS})
    expected_metrics = GpuMetrics(**{name: parse_metric(name, stat.get(name)) for name in METRIC_KEYS})
    plain = dict.fromkeys(HEALTH_KEYS, 1) | dict.fromkeys(METRIC_KEYS, 1.0)
    Counters.from_wire(plain)  # a plain reading is now shared: a boolean `true` must not be taken for it
    GpuMetrics.from_wire(plain)
    for _ in range(2):
        assert Counters.from_wire(stat) == expected_counters
        assert GpuMetrics.from_wire(stat) == expected_metrics


def test_a_boolean_is_not_the_shared_one() -> None:
    plain = dict.fromkeys(HEALTH_KEYS, 1)
    assert Counters.from_wire(plain).ecc_corrected_total == 1
    assert Counters.from_wire(dict.fromkeys(HEALTH_KEYS, True)).all_unknown
    assert Counters.from_wire(plain | {"retired_pages": -1}).retired_pages is None
    assert GpuMetrics.from_wire({"temperature_c": 1.0}).temperature_c == 1.0
    assert GpuMetrics.from_wire({"temperature_c": True}).all_unknown
    assert GpuMetrics.from_wire({"temperature_c": float("inf")}).all_unknown
