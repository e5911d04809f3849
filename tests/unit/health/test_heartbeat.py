from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from heteroflow.core.ids import NodeId
from heteroflow.health.heartbeat import parse_time, readings_from_stats, xid_events_from_wire
from tests.unit.health.test_counters import json_values

NOW = datetime(2026, 1, 1, tzinfo=UTC)
stat_keys = st.sampled_from(["index", "uuid", "sampled_at", "ecc_corrected_total", "retired_pages", "x"])


@given(st.lists(st.dictionaries(stat_keys, json_values), max_size=10))
def test_any_stats_give_readings_without_raising(stats: list[dict[str, object]]) -> None:
    readings, invalid = readings_from_stats(stats, node_id=NodeId("n"), source="real", received_at=NOW)
    assert len(readings) + invalid == len(stats)
    indexes = [r.key.gpu_index for r in readings]
    assert len(indexes) == len(set(indexes))
    assert all(r.sampled_at.tzinfo is not None for r in readings)


@given(st.lists(st.dictionaries(st.sampled_from(["index", "uuid", "xid", "occurred_at"]), json_values), max_size=10))
def test_any_xid_events_are_parsed_or_rejected_with_a_reason(events: list[dict[str, object]]) -> None:
    parsed, rejected = xid_events_from_wire(events)
    assert len(parsed) + len(rejected) == len(events)


def test_declared_index_uuid_and_time() -> None:
    stats: list[dict[str, object]] = [
        {"index": 3, "uuid": " GPU-3 ", "sampled_at": "2025-12-31T23:59:00Z", "retired_pages": 1},
        {"index": 1, "uuid": 42, "sampled_at": "not a time", "retired_pages": 2},
        {"index": 3, "retired_pages": 9},  # the same index twice in one beat is ambiguous: ignored
        {"uuid": "no index"},
    ]
    readings, invalid = readings_from_stats(stats, node_id=NodeId("n"), source="simulated", received_at=NOW)
    assert invalid == 2
    assert [(r.key.gpu_index, r.uuid, r.counters.retired_pages) for r in readings] == [(3, "GPU-3", 1), (1, None, 2)]
    assert readings[0].sampled_at == datetime(2025, 12, 31, 23, 59, tzinfo=UTC)
    assert readings[1].sampled_at == NOW
    assert readings[0].key.source == "simulated"


def test_parse_time() -> None:
    assert parse_time("2026-01-01T00:00:00") == NOW  # naive is UTC
    assert parse_time("2026-01-01T08:00:00+08:00") == NOW
    assert parse_time(1234) is None
    assert parse_time("x" * 100) is None
    # an offset that moves the instant out of years 1..9999 once in UTC is unknown (it was an OverflowError,
    # and the whole heartbeat a 500)
    assert parse_time("0001-01-01T00:00:00+01:00") is None
    assert parse_time("9999-12-31T23:59:59-01:00") is None
    assert parse_time("9999-12-31T23:59:59Z") == datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


OFFSETS = st.sampled_from(["", "Z", "+00:00", "+01:00", "-01:00", "+14:00", "-23:59", "+23:59:59.999999"])


@given(st.datetimes(), OFFSETS)
def test_parse_time_never_raises_on_any_iso_time_and_offset(when: datetime, offset: str) -> None:
    parsed = parse_time(when.isoformat() + offset)
    if parsed is not None:
        assert parsed.tzinfo is UTC
        if offset in ("", "Z", "+00:00"):
            assert parsed == when.replace(tzinfo=UTC)


@given(st.datetimes(), OFFSETS)
def test_a_beat_with_any_sample_or_event_time_is_parsed_never_raises(when: datetime, offset: str) -> None:
    text = when.isoformat() + offset
    readings, invalid = readings_from_stats(
        [{"index": 0, "sampled_at": text, "retired_pages": 1}], node_id=NodeId("n"), source="real", received_at=NOW
    )
    assert (len(readings), invalid) == (1, 0)
    parsed, rejected = xid_events_from_wire([{"index": 0, "xid": 79, "occurred_at": text}])
    assert len(parsed) + len(rejected) == 1
