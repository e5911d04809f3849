"""A real Alertmanager receives the platform's alerts: GPU_MEMORY_HIGH from real heartbeats and
GPU_FAULT_PREDICTED from the prediction worker, raised by the server and delivered through its Alertmanager
client (``HETEROFLOW_ALERTMANAGER_URL``), then their resolution by the system, read back through Alertmanager's own
v2 API. SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.simulation import series
from heteroflow.storage.health_store import SqlHealthSampleStore
from tests.support.harness import Harness, running_server
from tests.support.monitoring import Alertmanager, alertmanager
from tests.support.polling import until

NOW = datetime(2026, 5, 20, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Alertmanager]:
    with alertmanager(tmp_path / "alertmanager") as am:
        yield am


def alert_named(am: Alertmanager, name: str, node: str) -> list[dict[str, Any]]:
    return [a for a in am.alerts() if a["labels"].get("alertname") == name and a["labels"].get("node") == node]


def delivered(h: Harness) -> None:
    h.client.portal.call(h.ctx.notifier.drained)  # type: ignore[union-attr]


def stat(index: int, used: float) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "memory_used_mib": used, "memory_total_mib": 80_000}


def test_gpu_memory_high_reaches_alertmanager_and_its_resolution_too(engine: Engine, manager: Alertmanager) -> None:
    with running_server(
        engine,
        start=NOW,
        gpu_metrics={"memory_high_minutes": 2},
        delivery={"alertmanager_url": manager.url},
    ) as h:
        agent = h.token("agent")
        node = h.register(agent, "gpu-node-am")

        def beat_for(seconds: int, used: float) -> None:
            for _ in range(seconds // 5):
                assert h.beat(agent, node, [stat(0, used)]).status_code == 200
                h.clock.advance(5)
            h.flush_metrics()

        beat_for(130, 79_500)  # full for more than 2 minutes: raised
        delivered(h)
        [alert] = until(
            lambda: alert_named(manager, "GPU_MEMORY_HIGH", "gpu-node-am"), within=15, what="GPU_MEMORY_HIGH"
        )
        assert alert["status"]["state"] == "active"
        assert alert["labels"]["severity"] == "warning"
        assert alert["labels"]["node_id"] == node
        assert "GPU 0" in alert["annotations"]["summary"]
        [open_alert] = h.get(h.token("nodes:read"), "/api/v1/alerts", type="GPU_MEMORY_HIGH").json()["items"]
        assert alert["labels"]["heteroflow_alert_id"] == open_alert["id"]

        beat_for(5, 1000)  # memory drops: resolved by the system, and Alertmanager is told
        delivered(h)
        until(
            lambda: alert_named(manager, "GPU_MEMORY_HIGH", "gpu-node-am") == [],
            within=15,
            what="GPU_MEMORY_HIGH resolved in Alertmanager (no longer listed as firing)",
        )


def test_gpu_fault_predicted_reaches_alertmanager_and_an_all_miss_resolves_it(
    engine: Engine, manager: Alertmanager
) -> None:
    with running_server(engine, start=NOW, delivery={"alertmanager_url": manager.url}) as h:
        agent = h.token("agent")
        node = h.register(agent, "gpu-node-pred")
        key = CardKey(node_id=NodeId(node), gpu_index=0, source="real")
        store = SqlHealthSampleStore(h.ctx.engine)
        store.insert(
            [
                HealthReading(key=key, uuid=s.uuid, sampled_at=s.sampled_at, counters=s.counters)
                for s in series("degrading", card=0, start=NOW - 10 * DAY, end=NOW)
            ]
        )
        assert h.ctx.worker.tick().predictions_created == {"real": 1}
        delivered(h)
        [alert] = until(
            lambda: alert_named(manager, "GPU_FAULT_PREDICTED", "gpu-node-pred"),
            within=15,
            what="GPU_FAULT_PREDICTED in Alertmanager",
        )
        assert alert["status"]["state"] == "active"
        assert "predicted" in alert["annotations"]["summary"]
        assert alert["annotations"]["backlog"] == "false"
        assert alert["annotations"]["runbook_url"] == "docs/runbooks/platform/GPU_FAULT_PREDICTED.md"

        # the window passes with a sample and no uncorrectable growth: an all-miss, resolved by the system
        reader = h.token("nodes:read")
        t0 = datetime.fromisoformat(h.get(reader, "/api/v1/gpu-health/predictions").json()["items"][0]["t0"])
        uuid = alert_uuid(store, key)
        store.insert(
            [
                HealthReading(
                    key=key,
                    uuid=uuid,
                    sampled_at=t0 + 4 * DAY,
                    counters=Counters(ecc_uncorrected_total=0, ecc_corrected_total=1),
                )
            ]
        )
        h.clock.advance(8 * 86400)
        assert h.ctx.worker.tick().judged == {"miss": 1}
        delivered(h)
        until(
            lambda: alert_named(manager, "GPU_FAULT_PREDICTED", "gpu-node-pred") == [],
            within=15,
            what="GPU_FAULT_PREDICTED resolved in Alertmanager",
        )


def alert_uuid(store: SqlHealthSampleStore, key: CardKey) -> str | None:
    """The card's uuid as last stored (a sample of the same card must carry it to count in the window)."""
    latest = store.latest(key)
    return latest.uuid if latest is not None else None
