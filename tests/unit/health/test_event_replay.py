"""The rules replayed on an error-event log: a small synthetic log of the Calchas shape (device, time, CE/UER/UEO).

Device A's correctable errors accelerate (10, 20, 40 a day) before its first uncorrectable error: the trend rule
predicts it, a first failure. Device B fails, and fails again four days later: the strong rule predicts the
recurrence only. Device C logs one correctable error a day and never fails: the any-CE baseline predicts it.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from heteroflow.cli.main import app
from heteroflow.health.event_replay import ErrorEvent, parse_event_rows, replay
from heteroflow.health.rules import RuleParams

DAY0 = datetime(2023, 1, 1, tzinfo=UTC)


def _at(day: float) -> datetime:
    return DAY0 + timedelta(days=day)


def synthetic_log() -> str:
    rows: list[tuple[str, str, str, float, str]] = []
    for day, count in ((8, 10), (9, 20), (10, 40)):
        rows += [("Datacenter1", "0.0.0.1", "DSA1", day + (i + 1) / (count + 2), "CE") for i in range(count)]
    rows.append(("Datacenter1", "0.0.0.1", "DSA1", 12.5, "UER"))
    rows += [("Datacenter1", "0.0.0.2", "DSA2", 1.5, "UEO"), ("Datacenter1", "0.0.0.2", "DSA2", 5.5, "UER")]
    rows += [("Datacenter2", "0.0.0.3", "DSA3", day + 0.5, "CE") for day in range(40)]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["Datacenter", "Server", "Name", "Stack", "SID", "PcId", "BankGroup", "BankArray", "Col", "Row",
                     "Time", "EccType"])  # fmt: skip
    for dc, server, name, when, kind in rows:
        writer.writerow([dc, server, name, "0x0", "0x0", "0x1", "0x2", "0x1", "0x54", "0x3e2b",
                         int(_at(when).timestamp()), kind])  # fmt: skip
    writer.writerow(["Datacenter1", "0.0.0.9", "DSA9", "", "", "", "", "", "", "", "not-a-time", "CE"])
    writer.writerow(["Datacenter1", "0.0.0.9", "DSA9", "", "", "", "", "", "", "", "1672531200", "XE"])
    return out.getvalue()


def events() -> list[ErrorEvent]:
    parsed, skipped = parse_event_rows(csv.DictReader(io.StringIO(synthetic_log())))
    assert skipped == 2
    return parsed


def test_calchas_rows_and_plain_rows_are_read_and_odd_rows_skipped() -> None:
    parsed = events()
    assert {e.device for e in parsed} == {
        "Datacenter1/0.0.0.1/DSA1",
        "Datacenter1/0.0.0.2/DSA2",
        "Datacenter2/0.0.0.3/DSA3",
    }
    assert {e.kind for e in parsed if e.device.endswith("DSA2")} == {"UE"}  # UER and UEO are both uncorrectable
    plain, skipped = parse_event_rows(
        [{"device": "g0", "time": "2023-01-01T00:00:00", "type": "ue"}, {"device": "", "time": "1", "type": "CE"}]
    )
    assert (plain, skipped) == ([ErrorEvent("g0", DAY0, "UE")], 1)


def test_first_failures_are_told_apart_from_recurrences_and_the_baseline_is_reported() -> None:
    result = replay(
        events(), params=RuleParams(), window_days=7, step=timedelta(hours=1), min_matured=1, min_span_days=1
    )
    assert (result.devices, result.failing_devices, result.failing_without_earlier_ce) == (3, 2, 1)
    overall, first = result.overall, result.first_failure
    assert (overall.counts.failed_cards, overall.counts.predicted_cards) == (2, 2)
    assert overall.counts.hit == 2
    # A's prediction came before any uncorrectable error and its window held A's first failure; B's came after
    assert (first.counts.hit, first.counts.failed_cards, first.counts.predicted_cards) == (1, 2, 1)
    assert first.recall == 0.5
    assert first.recall_ci is not None
    assert 0.0 <= first.recall_ci[0] <= 0.5 <= first.recall_ci[1] <= 1.0
    # any correctable error: C is predicted (and missed) again and again, A too
    assert result.baseline_threshold == 1
    assert result.baseline_overall.counts.miss > 0
    assert result.baseline_overall.counts.predicted_cards == 1  # A's UE came inside a CE-triggered window


def test_below_the_evidence_gate_the_ratios_and_intervals_are_null() -> None:
    result = replay(
        events(), params=RuleParams(), window_days=7, step=timedelta(hours=1), min_matured=20, min_span_days=8
    )
    figures = result.overall.to_json()
    assert figures["precision"] is None
    assert figures["precision_ci95"] is None
    assert figures["recall"] is None
    assert figures["insufficient"]


def test_cli_events_json_prints_overall_first_failure_and_baseline(tmp_path: pytest.TempPathFactory) -> None:
    log = tmp_path / "events.csv"  # type: ignore[operator]
    log.write_text(synthetic_log())
    result = CliRunner().invoke(app, ["health", "backtest", "--events", str(log), "--json", "--param", "min_matured=1"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {"overall", "first_failure", "baseline"} <= set(document)
    assert {"overall", "first_failure", "threshold"} <= set(document["baseline"])
    assert document["first_failure"]["predicted_devices"] == 1
    assert document["skipped_rows"] == 2


def test_cli_needs_exactly_one_input(tmp_path: pytest.TempPathFactory) -> None:
    result = CliRunner().invoke(app, ["health", "backtest"])
    assert result.exit_code != 0
