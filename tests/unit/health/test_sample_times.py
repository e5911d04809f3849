"""Agent-claimed times against the server's receive time (``health/sample_times.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from heteroflow.core.ids import NodeId
from heteroflow.health.gpu_metrics import metric_readings_from_stats
from heteroflow.health.heartbeat import XID_TOO_OLD, readings_from_stats, xid_events_from_wire
from heteroflow.health.sample_times import AFTER_NEWEST_STEP, SampleTimeWindow, TimeFix, after_newest
from heteroflow.health.settings import HealthStorageSettings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
WINDOW = HealthStorageSettings.load().sample_time_window()


def test_the_default_window_is_five_minutes_ahead_fifteen_behind_and_the_retention_for_events() -> None:
    assert (
        SampleTimeWindow(
            max_ahead=timedelta(minutes=5), max_behind=timedelta(minutes=15), max_event_age=timedelta(days=180)
        )
        == WINDOW
    )


def test_reading_times_outside_the_window_become_the_receive_time_with_a_reason() -> None:

    def at(delta: timedelta) -> tuple[datetime, TimeFix | None]:
        return WINDOW.reading_time(NOW + delta, received_at=NOW)

    assert at(timedelta(minutes=5)) == (NOW + timedelta(minutes=5), None)
    assert at(timedelta(minutes=5, seconds=1)) == (NOW, TimeFix.AHEAD)
    assert at(-timedelta(minutes=15)) == (NOW - timedelta(minutes=15), None)
    assert at(-timedelta(minutes=15, seconds=1)) == (NOW, TimeFix.BEHIND)
    assert WINDOW.reading_time(None, received_at=NOW) == (NOW, None)


def test_heartbeat_parsers_apply_the_window_per_value() -> None:
    stats = [
        {"index": 0, "sampled_at": "9999-12-31T23:59:59Z", "telemetry_at": "9999-12-31T23:59:59Z",
         "ecc_corrected_total": 1, "temperature_c": 40},
        {"index": 1, "sampled_at": "0001-01-01T00:00:00Z", "telemetry_at": NOW.isoformat(),
         "ecc_corrected_total": 1, "temperature_c": 40},
        {"index": 2, "sampled_at": (NOW - timedelta(seconds=70)).isoformat(), "ecc_corrected_total": 1,
         "temperature_c": 40},
    ]  # fmt: skip
    readings, _ = readings_from_stats(stats, node_id=NodeId("n"), source="real", received_at=NOW, window=WINDOW)
    assert [(r.sampled_at, r.time_fix) for r in readings] == [
        (NOW, TimeFix.AHEAD),
        (NOW, TimeFix.BEHIND),
        (NOW - timedelta(seconds=70), None),
    ]
    metrics = metric_readings_from_stats(stats, node_id=NodeId("n"), source="real", received_at=NOW, window=WINDOW)
    assert [(m.sampled_at, m.time_fix) for m in metrics] == [(NOW, TimeFix.AHEAD), (NOW, None), (NOW, None)]


def test_xid_events_ahead_are_clamped_and_older_than_the_retention_rejected() -> None:
    events = [
        {"index": 0, "xid": 79, "occurred_at": "9999-12-31T23:59:59Z"},
        {"index": 0, "xid": 79, "occurred_at": (NOW - timedelta(days=181)).isoformat()},
        {"index": 0, "xid": 79, "occurred_at": (NOW - timedelta(days=3)).isoformat()},  # kept by the agent
    ]
    parsed, rejected = xid_events_from_wire(events, received_at=NOW, window=WINDOW)
    assert [(p.occurred_at, p.time_fix) for p in parsed] == [(NOW, TimeFix.AHEAD), (NOW - timedelta(days=3), None)]
    assert rejected == [f"xid_events[1]: {XID_TOO_OLD}"]


def test_a_row_is_placed_after_its_slots_newest_row() -> None:
    assert after_newest(NOW, newest=None) == (NOW, None)
    assert after_newest(NOW, newest=NOW - timedelta(seconds=1)) == (NOW, None)
    assert after_newest(NOW, newest=NOW) == (NOW + AFTER_NEWEST_STEP, TimeFix.NOT_AFTER_NEWEST)
    later = NOW + timedelta(minutes=4)
    assert after_newest(NOW, newest=later) == (later + AFTER_NEWEST_STEP, TimeFix.NOT_AFTER_NEWEST)
