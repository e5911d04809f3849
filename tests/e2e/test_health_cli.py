"""``heteroflow sim`` and ``heteroflow health`` as a user runs them."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from heteroflow.storage.db import create_db_engine

pytestmark = pytest.mark.e2e


def heteroflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "heteroflow", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_generate_tick_and_purge_keep_simulated_data_apart(database_url: str) -> None:
    for profile in ("degrading", "healthy"):
        result = heteroflow(
            "sim", "generate", "--profile", profile, "--cards", "2", "--days", "9", "--database-url", database_url
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["samples_written"] == 2 * (9 * 288 + 1)
    tick = heteroflow("health", "tick", "--database-url", database_url)
    assert tick.returncode == 0, tick.stderr
    report = json.loads(tick.stdout)
    assert report["predictions_created"] == {"simulated": 2}  # degrading predicts, healthy never
    assert report["alerts_raised"] == 0
    bad = heteroflow("sim", "generate", "--profile", "exploding", "--database-url", database_url)
    assert bad.returncode == 2
    assert "unknown profile" in bad.stderr
    engine = create_db_engine(database_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO nodes (id, name, vendor, model, gpu_count, source, registered_at) "
                "VALUES ('real-1', 'real-1', 'nvidia', 'H100', 8, 'real', '2026-01-01 00:00:00')"
            )
        )
    purge = heteroflow("sim", "purge", "--database-url", database_url)
    assert purge.returncode == 0, purge.stderr
    assert json.loads(purge.stdout) == {"predictions": 2, "samples": 4 * (9 * 288 + 1), "xid_events": 0, "nodes": 2}
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT name FROM nodes")).scalars().all() == ["real-1"]
    engine.dispose()


def test_backtest_replays_a_trace_and_reports_per_rule(tmp_path: Path) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    trace = tmp_path / "trace.csv"
    keys = [
        "ecc_uncorrected_total",
        "ecc_corrected_total",
        "retired_pages",
        "remapped_rows_pending",
        "remapped_rows_failure",
    ]
    with trace.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["node", "index", "uuid", "sampled_at", *keys])
        for hour in range(14 * 24):
            at = start + timedelta(hours=hour)
            day = hour / 24
            degrading = 5 + round(40 * (1.3**day - 1) / math.log(1.3))
            ue = 0 if day < 12 else 2
            writer.writerow(["host-a", 0, "GPU-A", at.isoformat(), ue, degrading, 0, 0, 0])
            writer.writerow(["host-a", 1, "GPU-B", at.isoformat(), 0, 7, "", 0, 0])
        writer.writerow(["host-a", "x", "GPU-A", "not a time", "", "", "", "", ""])  # an unusable row is skipped
    result = heteroflow(
        "health",
        "backtest",
        "--trace",
        str(trace),
        "--tick-minutes",
        "360",
        "--json",
        "--param",
        "ratio=1.2",
        "--param",
        "min_increase=abc",
    )
    assert result.returncode == 0, result.stderr
    assert "MIN_INCREASE" in result.stderr  # invalid override: default plus a warning
    body = json.loads(result.stdout)
    assert body["skipped_rows"] == 1
    assert body["cards"] == 2
    growth = body["rules"]["corrected_ecc_growth"]
    assert growth["predictions"] >= 1
    assert growth["hit"] >= 1
    assert growth["median_lead_hours"] is not None
    assert body["band"]["failed_cards"] == 1
    assert body["band"]["precision"] is None  # a two-card trace is never enough evidence
    text = heteroflow("health", "backtest", "--trace", str(trace), "--tick-minutes", "720")
    assert text.returncode == 0, text.stderr
    assert "corrected_ecc_growth" in text.stdout
    assert "precision n/a" in text.stdout


@pytest.mark.postgres
def test_two_tick_processes_overlapping_on_postgresql_make_one_prediction_per_card(pg_server: object) -> None:
    from heteroflow.storage.testing import PostgresServer

    assert isinstance(pg_server, PostgresServer)
    if not pg_server.running:
        pg_server.start()
    url = pg_server.create_database()
    generated = heteroflow(
        "sim", "generate", "--profile", "degrading", "--cards", "16", "--days", "9", "--database-url", url
    )
    assert generated.returncode == 0, generated.stderr
    command = [sys.executable, "-m", "heteroflow", "health", "tick", "--database-url", url]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        reports.append(json.loads(out))
    assert sum(r["predictions_created"].get("simulated", 0) for r in reports) == 16
    engine = create_db_engine(url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM gpu_fault_predictions")).scalar_one() == 16
    engine.dispose()
