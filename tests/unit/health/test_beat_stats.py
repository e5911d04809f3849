"""One beat's stats read once for both side paths: the same readings the two separate parsers give, and the
shared (interned) values never confuse a boolean, a negative or a non-finite number with a plain one. A body the
typed decoder (``WIRE_BEAT``) takes gives the same readings as the general path; one with a value it does not type
is refused by it, never read differently."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heteroflow.core.ids import NodeId
from heteroflow.health.beat_stats import WIRE_BEAT, beat_readings
from heteroflow.health.counters import COUNTER_MAX, HEALTH_KEYS, Counters, parse_counter
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


def general_and_wire(beat: list[dict[str, object]]) -> tuple[object, object]:
    """The readings of ``beat`` sent as JSON, read the general way and (``None`` where it refuses the body) after
    the typed decode."""
    body = json.dumps({"gpu_stats": beat}).encode()
    general = beat_readings(
        json.loads(body)["gpu_stats"], node_id=NODE, source="real", received_at=RECEIVED, window=WINDOW
    )
    try:
        wired = WIRE_BEAT.decode(body)
    except msgspec.DecodeError:
        return general, None
    return general, beat_readings(wired.gpu_stats, node_id=NODE, source="real", received_at=RECEIVED, window=WINDOW)


@settings(max_examples=300)
@given(stats)
def test_a_body_the_typed_decoder_takes_reads_as_the_general_path_reads_it(beat: list[dict[str, object]]) -> None:
    general, wired = general_and_wire(beat)
    assert wired is None or wired == general


in_schema = st.lists(
    st.fixed_dictionaries(
        {"index": st.sampled_from([0, 1, 2, 4095])},
        optional={
            "uuid": st.one_of(st.none(), st.sampled_from(["GPU-a", " GPU-b ", "", " ", "u" * 129])),
            "sampled_at": st.one_of(st.none(), times.filter(lambda value: isinstance(value, str))),
            "telemetry_at": st.one_of(st.none(), times.filter(lambda value: isinstance(value, str))),
            "semantics_unconfirmed": st.one_of(st.none(), st.just(["ecc_corrected_total", "x"]), st.just(7)),
            **dict.fromkeys(HEALTH_KEYS, st.one_of(st.none(), st.sampled_from([0, 1, COUNTER_MAX]))),
            "temperature_c": st.one_of(st.none(), st.sampled_from([-50.0, -0.0, 0, 61, 61.5, 200.0])),
            "utilization_pct": st.one_of(st.none(), st.floats(min_value=0.0, max_value=100.0), st.integers(0, 100)),
            "memory_used_mib": st.one_of(st.none(), st.floats(min_value=0.0, max_value=16_777_216.0)),
            "memory_total_mib": st.one_of(st.none(), st.sampled_from([0.0, 81559.0, 16_777_216])),
            "power_w": st.one_of(st.none(), st.floats(min_value=0.0, max_value=100_000.0)),
        },
    ),
    max_size=6,
)
"""Stats whose every value the typed decoder takes: its bounds' edges, integers for metrics, repeated indexes,
unusable uuids and times, cards without a metric."""


@settings(max_examples=300)
@given(in_schema)
def test_every_value_within_the_types_is_taken_and_read_alike(beat: list[dict[str, object]]) -> None:
    general, wired = general_and_wire(beat)
    assert wired == general


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("index", 4096),
        ("index", 1.0),
        ("index", True),
        ("ecc_corrected_total", COUNTER_MAX + 1),
        ("ecc_corrected_total", -1),
        ("ecc_corrected_total", 12.0),
        ("ecc_corrected_total", "7"),
        ("temperature_c", 200.5),
        ("temperature_c", True),
        ("power_w", -1.0),
        ("uuid", 3),
        ("sampled_at", 1),
    ],
)
def test_a_value_out_of_the_types_sends_the_body_the_general_way(key: str, value: object) -> None:
    beat: list[dict[str, object]] = [{"index": 0, "uuid": "GPU-a", "temperature_c": 61.0, "ecc_corrected_total": 0}]
    beat[0][key] = value
    assert general_and_wire(beat)[1] is None
