"""The heartbeat's own count and handling-time histogram (:class:`BeatTally`) render what prometheus_client's
Counter and Histogram render for the same observations: the same series, the same bucket edges (a value equal to a
bound is in that bucket), the same sum."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from heteroflow.platform_server.metrics import BeatTally, ServerMetrics

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def series(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but the creation times, which differ by when each object was made."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if not s.name.endswith("_created")
    }


@given(st.lists(st.one_of(st.sampled_from(BUCKETS), st.floats(min_value=0.0, max_value=3.0)), max_size=40))
def test_the_tally_renders_what_a_counter_and_a_histogram_render(seconds: list[float]) -> None:
    reference = CollectorRegistry()
    beats = Counter("heteroflow_heartbeats", "Heartbeats accepted.", registry=reference)
    handled = Histogram(
        "heteroflow_heartbeat_handler_seconds",
        "Time spent handling one heartbeat, seconds.",
        buckets=BUCKETS,
        registry=reference,
    )
    ours = CollectorRegistry()
    tally = BeatTally(buckets=BUCKETS)
    ours.register(tally)
    for value in seconds:
        beats.inc()
        handled.observe(value)
        tally.observe(value)

    expected, got = series(generate_latest(reference)), series(generate_latest(ours))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_the_server_exposes_the_tally_with_its_creation_time() -> None:
    metrics = ServerMetrics()
    metrics.beats.observe(0.003)
    families = {family.name: family for family in text_string_to_metric_families(metrics.render().decode())}
    rendered = {s.name: s.value for family in families.values() for s in family.samples}
    assert rendered["heteroflow_heartbeats_total"] == 1
    assert rendered["heteroflow_heartbeat_handler_seconds_count"] == 1
    assert rendered["heteroflow_heartbeat_handler_seconds_created"] == rendered["heteroflow_heartbeats_created"] > 0
