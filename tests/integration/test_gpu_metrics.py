"""GPU metrics history, GPU_MEMORY_HIGH and the per-GPU Prometheus series, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId
from heteroflow.health.gpu_metrics import GPU_MEMORY_HIGH, Aggregate, MinuteRow
from heteroflow.health.samples import CardKey
from heteroflow.storage.metrics_store import SqlGpuMetricsStore
from heteroflow.storage.schema import gpu_metrics_minutes
from tests.conftest import StatementCounter
from tests.support.harness import Harness, running_server

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HEALTHY = {
    "ecc_uncorrected_total": 0,
    "ecc_corrected_total": 10,
    "retired_pages": 0,
    "remapped_rows_pending": 0,
    "remapped_rows_failure": 0,
}


def stat(index: int, *, temp: float = 40, used: float = 1000, total: float = 80_000, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "temperature_c": temp,
        "utilization_pct": 50,
        "memory_used_mib": used,
        "memory_total_mib": total,
        "power_w": 300,
        **extra,
    }


@pytest.fixture
def harness(engine: Engine) -> Any:
    with running_server(engine, start=T0, gpu_metrics={"memory_high_minutes": 2}) as h:
        yield h


def metric_rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(gpu_metrics_minutes).order_by(gpu_metrics_minutes.c.minute)))


def test_beats_are_aggregated_per_minute_and_written_in_one_batch_without_a_statement_per_beat(
    harness: Harness, engine: Engine
) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    assert harness.beat(token, node, [stat(0, **HEALTHY), stat(1, **HEALTHY)]).status_code == 200
    harness.drain()
    harness.clock.advance(5)
    counter = StatementCounter(engine)
    for temp in (41, 45, 43, 50, 47, 44, 46, 42, 48, 49):  # steady beats: health unchanged, metrics vary
        assert harness.beat(token, node, [stat(0, temp=temp, **HEALTHY), stat(1, **HEALTHY)]).status_code == 200
        harness.drain()
        harness.clock.advance(5)
    assert counter.count == 0  # no statement per beat: metrics wait in memory

    harness.flush_metrics()  # 12:00:55 — the first minute is still open
    assert counter.matching("INSERT") == []
    harness.clock.advance(60)
    counter.reset()
    harness.flush_metrics()
    inserts = [s for s in counter.matching("INSERT") if "gpu_metrics_minutes" in s]
    assert len(inserts) == 1  # both cards' minute in one batched statement
    rows = metric_rows(engine)
    assert [(r.gpu_index, r.samples) for r in sorted(rows, key=lambda r: r.gpu_index)] == [(0, 11), (1, 11)]
    card0 = next(r for r in rows if r.gpu_index == 0)
    assert (card0.temperature_c_min, card0.temperature_c_max) == (40, 50)
    assert card0.temperature_c_avg == pytest.approx(sum((40, 41, 45, 43, 50, 47, 44, 46, 42, 48, 49)) / 11)

    reader = harness.token("nodes:read")
    body = harness.get(reader, f"/api/v1/nodes/{node}/gpu-metrics", gpu_index=0).json()
    assert [g["gpu_index"] for g in body["gpus"]] == [0]
    (point,) = body["gpus"][0]["points"]
    assert point["temperature_c"]["max"] == 50
    assert point["samples"] == 11
    assert point["memory_used_mib"]["avg"] == 1000


def test_a_flush_writes_a_fleet_minute_in_chunks_of_bounded_size(engine: Engine) -> None:
    with running_server(engine, start=T0, gpu_metrics={"flush_slice_rows": 2}) as harness:  # a fleet, in miniature
        token = harness.token("agent")
        node = harness.register(token, "gpu-node-1")
        assert harness.beat(token, node, [stat(i, **HEALTHY) for i in range(5)]).status_code == 200
        harness.drain()
        harness.clock.advance(65)
        counter = StatementCounter(engine)
        harness.flush_metrics()
    inserts = [s for s in counter.matching("INSERT") if "gpu_metrics_minutes" in s]
    assert len(inserts) == 3  # 2 + 2 + 1 rows: the peak is the chunk's, not the minute's
    assert sorted(r.gpu_index for r in metric_rows(engine)) == [0, 1, 2, 3, 4]


def test_unknown_metrics_stay_null_and_the_route_merges_steps(harness: Harness, engine: Engine) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    for minute in range(5):
        no_power = {"power_w": None} if minute % 2 else {"power_w": "n/a"}
        harness.beat(token, node, [stat(0, temp=40 + minute, **no_power)])
        harness.clock.advance(60)
    harness.clock.advance(5)  # past the last minute's grace for late beats
    harness.flush_metrics()
    assert all(row.power_w_avg is None and row.power_w_n is None for row in metric_rows(engine))
    reader = harness.token("nodes:read")
    body = harness.get(reader, f"/api/v1/nodes/{node}/gpu-metrics", step=180, since=T0.isoformat()).json()
    assert body["step_seconds"] == 180
    points = body["gpus"][0]["points"]
    assert [p["samples"] for p in points] == [3, 2]
    assert points[0]["temperature_c"] == {"min": 40, "avg": 41, "max": 42}
    assert points[0]["power_w"] is None  # unknown, never 0


def test_the_route_is_scoped_like_every_node_route(harness: Harness) -> None:
    agent_a = harness.token("agent", tenant="team-a")
    agent_b = harness.token("agent", tenant="team-b")
    node_b = harness.register(agent_b, "node-b")
    harness.register(agent_a, "node-a")
    reader_a = harness.token("nodes:read", tenant="team-a")
    outside = harness.get(reader_a, f"/api/v1/nodes/{node_b}/gpu-metrics")
    absent = harness.get(reader_a, "/api/v1/nodes/no-such-node/gpu-metrics")
    assert outside.status_code == absent.status_code == 404
    assert harness.get(agent_a, f"/api/v1/nodes/{node_b}/gpu-metrics").status_code == 403


def test_retention_deletes_rows_older_than_the_retention(engine: Engine) -> None:
    with running_server(engine, start=T0, gpu_metrics={"retention_days": 2}) as harness:
        token = harness.token("agent")
        node = harness.register(token, "gpu-node-1")
        store = SqlGpuMetricsStore(engine)
        key = CardKey(node_id=NodeId(node), gpu_index=0, source="real")
        agg = {"temperature_c": Aggregate(min=1, avg=1, max=1, count=1)}
        old = [MinuteRow(key=key, uuid=None, minute=T0 - timedelta(days=d), samples=1, values=agg) for d in (1, 3)]
        assert store.insert(old) == 2
        harness.beat(token, node, [stat(0)])
        harness.clock.advance(120)
        harness.flush_metrics()  # writes the new minute, then the first cleanup runs
        minutes = [row.minute for row in metric_rows(engine)]
        assert minutes == [T0 - timedelta(days=1), T0]
        assert harness.ctx.metrics_recorder.status().cleanup_deleted_total == 1


def test_rows_of_a_deleted_node_are_not_written(harness: Harness, engine: Engine) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    harness.beat(token, node, [stat(0)])
    writer = harness.token("nodes:write")
    assert harness.client.delete(f"/api/v1/nodes/{node}", headers=harness.auth(writer)).status_code == 204
    harness.clock.advance(120)
    harness.flush_metrics()
    assert metric_rows(engine) == []


def memory_alerts(harness: Harness) -> list[dict[str, Any]]:
    admin = harness.token("admin")
    items: list[dict[str, Any]] = harness.get(admin, "/api/v1/alerts", type=GPU_MEMORY_HIGH).json()["items"]
    return items


def test_memory_high_is_raised_after_the_duration_resolved_when_memory_drops_and_deduplicated(
    harness: Harness,
) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")

    def beat_for(seconds: int, *used: float) -> None:
        for _ in range(seconds // 5):
            stats = [stat(i, used=u, total=80_000) for i, u in enumerate(used)]
            assert harness.beat(token, node, stats).status_code == 200
            harness.clock.advance(5)
        harness.flush_metrics()

    beat_for(115, 79_000, 1000)  # 98.75 % for 1 min 50 s: not yet
    assert memory_alerts(harness) == []
    beat_for(15, 79_000, 79_500)  # card 0 full for 2 min; card 1 only just
    (alert,) = memory_alerts(harness)
    assert alert["status"] == "open"
    assert alert["severity"] == "WARN"
    assert "GPU 0" in alert["message"]
    assert "GPU 1" not in alert["message"]
    beat_for(120, 79_000, 79_500)  # both full now: still one open alert on the node (node-scoped dedup)
    assert [a["status"] for a in memory_alerts(harness)] == ["open"]

    beat_for(5, 1000, 79_500)  # card 0 drops, card 1 still full: the node's alert stays open
    assert [a["status"] for a in memory_alerts(harness)] == ["open"]
    beat_for(5, 1000, 1000)  # no card full: resolved by the system at once
    (resolved,) = memory_alerts(harness)
    assert resolved["status"] == "resolved"
    assert resolved["resolved_by"] == "system"


def test_memory_high_wording_says_healthy_and_busy_unlike_the_prediction_alert(harness: Harness) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    for _ in range(30):
        harness.beat(token, node, [stat(3, used=80_000)])
        harness.clock.advance(5)
    harness.flush_metrics()
    (alert,) = memory_alerts(harness)
    message = alert["message"].lower()
    assert "healthy and busy" in message
    assert "not a hardware problem" in message
    for word in ("predicted", "fault", "replace", "maintenance window", "failed", "degrading"):
        assert word not in message


def test_simulated_nodes_and_the_off_switch_never_raise_memory_high(engine: Engine) -> None:
    with running_server(engine, start=T0, gpu_metrics={"memory_high_minutes": 1}) as harness:
        token = harness.token("agent")
        sim = harness.register(token, "sim-node", source="simulated")
        for _ in range(20):
            harness.beat(token, sim, [stat(0, used=80_000)])
            harness.clock.advance(5)
        harness.flush_metrics()
        assert memory_alerts(harness) == []
    with running_server(
        engine, start=T0, gpu_metrics={"memory_high_minutes": 1, "memory_high_alerts": False}
    ) as harness:
        token = harness.token("agent")
        node = harness.register(token, "real-node")
        for _ in range(20):
            harness.beat(token, node, [stat(0, used=80_000)])
            harness.clock.advance(5)
        harness.flush_metrics()
        assert memory_alerts(harness) == []


def test_metrics_scrape_has_per_gpu_series_and_none_for_unknown_values(harness: Harness) -> None:
    token = harness.token("agent")
    node = harness.register(token, "gpu-node-1")
    known = stat(0, **HEALTHY)
    unknown = {"index": 1, "uuid": "GPU-1", "ecc_corrected_total": None, "temperature_c": "n/a", "power_w": 250}
    assert harness.beat(token, node, [known, unknown]).status_code == 200
    text = harness.get(harness.token("metrics:read"), "/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("heteroflow_gpu_")]
    assert 'heteroflow_gpu_ecc_corrected_total{gpu="0",node="gpu-node-1",uuid="GPU-0"} 10.0' in lines
    assert 'heteroflow_gpu_temperature_celsius{gpu="0",node="gpu-node-1",uuid="GPU-0"} 40.0' in lines
    assert 'heteroflow_gpu_memory_used_bytes{gpu="0",node="gpu-node-1",uuid="GPU-0"} 1.048576e+09' in lines
    assert 'heteroflow_gpu_power_watts{gpu="1",node="gpu-node-1",uuid="GPU-1"} 250.0' in lines
    # card 1 never reported a counter or a temperature: no series at all, never a 0
    assert [line for line in lines if 'gpu="1"' in line] == [
        'heteroflow_gpu_power_watts{gpu="1",node="gpu-node-1",uuid="GPU-1"} 250.0'
    ]
    # a card no longer heard of loses its series
    harness.clock.advance(301)
    text = harness.get(harness.token("metrics:read"), "/metrics").text
    assert not [line for line in text.splitlines() if line.startswith("heteroflow_gpu_") and "{" in line]


def test_the_grafana_dashboard_queries_only_series_the_server_exports(harness: Harness) -> None:
    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana-gpu-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"heteroflow_gpu_[a-z_]+", expr)}
    text = harness.get(harness.token("metrics:read"), "/metrics").text
    exported = set(re.findall(r"^# TYPE (heteroflow_gpu_[a-z_]+) (?:gauge|counter)$", text, flags=re.MULTILINE))
    assert used
    assert used <= exported
