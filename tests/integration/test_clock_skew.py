"""Agent clocks against the server's (H-21): skewed, stepping back, nonsense — on SQLite and on PostgreSQL.

Every agent-claimed time is checked against the server's injected clock: a skewed agent keeps the write
policy's bound of rows, still gets keepalive rows and the stall badge, and one node's year-9999 or year-1 time
breaks neither the GPU-metrics flush, nor the prediction tick, nor the minute buckets of anyone.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.storage.health_store import SqlHealthSampleStore
from heteroflow.storage.schema import gpu_health_samples, gpu_metrics_minutes, gpu_xid_events
from tests.support.harness import Harness, running_server

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEEPALIVE = timedelta(minutes=5)
HEALTHY = {
    "ecc_uncorrected_total": 0,
    "ecc_corrected_total": 10,
    "retired_pages": 0,
    "remapped_rows_pending": 0,
    "remapped_rows_failure": 0,
}


@pytest.fixture
def harness(engine: Engine) -> Iterator[Harness]:
    with running_server(engine, start=T0) as h:
        yield h


def sample_rows(engine: Engine) -> list[Any]:
    query = sa.select(gpu_health_samples).order_by(gpu_health_samples.c.sampled_at, gpu_health_samples.c.id)
    with engine.connect() as conn:
        return list(conn.execute(query))


def corrected(h: Harness, name: str, reason: str) -> float:
    value = h.ctx.metrics.registry.get_sample_value(
        "heteroflow_sample_times_corrected_total", {"kind": name, "reason": reason}
    )
    return value or 0.0


def stat(at: datetime, corrected_ecc: int, **extra: Any) -> dict[str, Any]:
    return {
        "index": 0,
        "uuid": "GPU-a",
        "sampled_at": at.isoformat(),
        "temperature_c": 40,
        **HEALTHY,
        "ecc_corrected_total": corrected_ecc,
        **extra,
    }


def run_agent(h: Harness, token: str, node: str, *, minutes: int, skew: timedelta, ecc: int) -> None:
    """5 s beats for ``minutes``; the health reading is re-collected every 60 s on the agent's (skewed) clock."""
    collected = h.clock.now() + skew
    for beat in range(minutes * 12):
        if beat % 12 == 0:
            collected = h.clock.now() + skew
        assert h.beat(token, node, [stat(collected, ecc)]).status_code == 200
        h.drain()
        h.clock.advance(5)


def capability(h: Harness) -> dict[str, Any]:
    reader = h.token("nodes:read")
    (card,) = h.get(reader, "/api/v1/gpu-health/capabilities").json()["cards"]
    return card  # type: ignore[no-any-return]


def assert_bounded(rows: list[Any], *, changes: int, span: timedelta) -> None:
    """At most one row per change plus one keepalive per keepalive period, and no gap longer than a keepalive."""
    assert len(rows) <= changes + span / KEEPALIVE + 1, [r.sampled_at for r in rows]
    times = [r.sampled_at for r in rows]
    assert all(b > a for a, b in itertools.pairwise(times)), "rows strictly ordered in time"
    assert all(b - a <= KEEPALIVE + timedelta(seconds=65) for a, b in itertools.pairwise(times)), times


def test_an_agent_three_days_ahead_then_correct_keeps_the_bound_the_keepalive_and_the_stall_badge(
    harness: Harness, engine: Engine
) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    run_agent(harness, token, node, minutes=10, skew=timedelta(0), ecc=10)
    run_agent(harness, token, node, minutes=30, skew=timedelta(days=3), ecc=11)  # the clock jumps ahead; a change
    run_agent(harness, token, node, minutes=30, skew=timedelta(0), ecc=12)  # corrected again; another change
    stopped_at = harness.clock.now()

    stored = sample_rows(engine)
    assert_bounded(stored, changes=3, span=timedelta(minutes=70))
    assert all(r.sampled_at <= stopped_at for r in stored)  # nothing stamped in the agent's future
    assert [r.ecc_corrected_total for r in stored if r.changed] == [10, 11, 12]
    assert corrected(harness, "health", "ahead") == 30 * 12
    assert capability(harness)["collection_stalled"] is False

    harness.clock.advance(61 * 60)  # the agent stops: past the 60-minute stall threshold
    assert capability(harness)["collection_stalled"] is True


def test_an_agent_clock_that_steps_back_within_the_tolerance_gets_no_duplicate_rows(
    harness: Harness, engine: Engine
) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    run_agent(harness, token, node, minutes=3, skew=timedelta(minutes=4), ecc=10)  # ahead, within the 5 min
    run_agent(harness, token, node, minutes=10, skew=timedelta(0), ecc=11)  # back in time, and a change

    stored = sample_rows(engine)
    assert_bounded(stored, changes=2, span=timedelta(minutes=13))
    assert [r.ecc_corrected_total for r in stored if r.changed] == [10, 11]
    assert harness.ctx.ingestor.status().moved_after_newest_total == 1


def test_a_row_stored_far_in_the_future_neither_blocks_keepalive_nor_hides_the_stall(
    harness: Harness, engine: Engine
) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    key = CardKey(node_id=NodeId(node), gpu_index=0, source="real")
    future = HealthReading(key=key, uuid="GPU-a", sampled_at=T0 + timedelta(days=3), counters=Counters(**HEALTHY))
    SqlHealthSampleStore(engine).insert([future])  # e.g. written before agent times were checked

    run_agent(harness, token, node, minutes=12, skew=timedelta(0), ecc=10)
    run_agent(harness, token, node, minutes=12, skew=timedelta(0), ecc=11)
    present = [r for r in sample_rows(engine) if r.sampled_at < T0 + timedelta(days=1)]
    assert_bounded(present, changes=2, span=timedelta(minutes=24))
    assert len(present) >= 4  # keepalive rows are written although a newer-looking row exists
    harness.clock.advance(61 * 60)
    assert capability(harness)["collection_stalled"] is True


def test_year_9999_telemetry_never_breaks_the_flush_nor_opens_minutes_that_never_close(
    harness: Harness, engine: Engine
) -> None:
    token = harness.token("agent")
    skewed, fine = harness.register(token, "skewed"), harness.register(token, "fine")
    for beat in range(200):
        far = datetime(9999, 12, 31, 23, 59, tzinfo=UTC) - timedelta(minutes=beat)
        telemetry = {"index": 0, "uuid": "GPU-s", "temperature_c": 50, "telemetry_at": far.isoformat()}
        assert harness.beat(token, skewed, [telemetry]).status_code == 200
        assert harness.beat(token, fine, [{"index": 0, "uuid": "GPU-f", "temperature_c": 40}]).status_code == 200
        harness.clock.advance(5)
    assert harness.ctx.metrics_recorder.status().open_minutes <= 2 * (200 * 5 // 60 + 2)
    harness.clock.advance(65)
    harness.flush_metrics()

    status = harness.ctx.metrics_recorder.status()
    assert status.last_error is None
    assert status.write_failures_total == 0
    assert status.open_minutes == 0
    with engine.connect() as conn:
        minutes = list(conn.execute(sa.select(gpu_metrics_minutes.c.node_id, gpu_metrics_minutes.c.minute)))
    assert {row.node_id for row in minutes} == {skewed, fine}  # both written, under the server's minutes
    assert max(row.minute for row in minutes) <= harness.clock.now()
    assert corrected(harness, "telemetry", "ahead") == 200


def test_a_year_1_sample_time_never_stops_the_prediction_tick(harness: Harness, engine: Engine) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    year_1 = datetime(1, 1, 1, tzinfo=UTC)
    assert harness.beat(token, node, [stat(year_1, 10)]).status_code == 200
    harness.drain()
    (row,) = sample_rows(engine)
    assert row.sampled_at == T0  # kept under the receive time
    assert corrected(harness, "health", "behind") == 1
    harness.clock.advance(3600)
    report = harness.ctx.worker.tick()
    assert report.cards_failed == 0
    assert report.cards_evaluated.get("real", 0) == 1


def test_a_card_the_core_cannot_take_is_skipped_and_the_tick_goes_on(harness: Harness, engine: Engine) -> None:
    token = harness.token("agent")
    bad, good = harness.register(token, "bad"), harness.register(token, "good")
    store = SqlHealthSampleStore(engine)
    for node, at in ((bad, datetime(1, 1, 1, 0, 5, tzinfo=UTC)), (good, T0 - timedelta(hours=1))):
        key = CardKey(node_id=NodeId(node), gpu_index=0, source="real")
        store.insert([HealthReading(key=key, uuid="GPU-a", sampled_at=at, counters=Counters(**HEALTHY))])
    report = harness.ctx.worker.tick()  # a year-1 row stored before agent times were checked
    assert report.cards_failed == 1  # logged and skipped
    assert report.cards_evaluated.get("real", 0) == 1  # the other card was evaluated


def test_xid_times_ahead_are_clamped_and_older_than_the_retention_rejected(harness: Harness, engine: Engine) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    events = [
        {"index": 0, "uuid": "GPU-a", "xid": 79, "occurred_at": "9999-12-31T23:59:59Z"},
        {"index": 0, "uuid": "GPU-a", "xid": 48, "occurred_at": "0001-01-01T00:00:00Z"},
        {"index": 0, "uuid": "GPU-a", "xid": 31, "occurred_at": (T0 - timedelta(hours=2)).isoformat()},
    ]
    response = harness.beat(token, node, [], xid_events=events)
    assert response.status_code == 200, response.text
    result = response.json()["xid_events"]
    assert result["stored"] == 2
    assert result["retry"] is False
    assert result["rejected"] == ["xid_events[1]: occurred_at is older than the retention period"]
    with engine.connect() as conn:
        stored = {row.xid: row.occurred_at for row in conn.execute(sa.select(gpu_xid_events))}
    assert {xid: _utc(at) for xid, at in stored.items()} == {79: T0, 31: T0 - timedelta(hours=2)}
    assert corrected(harness, "xid", "ahead") == 1
    assert corrected(harness, "xid", "too_old") == 1


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
