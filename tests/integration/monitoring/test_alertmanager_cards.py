"""A real Alertmanager and a node-level GPU_FAULT_PREDICTED whose cards change: a card with a strong signal joins
the open alert, Alertmanager lists it as critical with every card, and the warning instance is ended, not left
firing beside it. SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.simulation import Profile, series
from heteroflow.storage.health_store import SqlHealthSampleStore
from tests.integration.monitoring.test_alertmanager import DAY, NOW, alert_named, delivered
from tests.support.harness import Harness, running_server
from tests.support.monitoring import Alertmanager, alertmanager
from tests.support.polling import until


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Alertmanager]:
    with alertmanager(tmp_path / "alertmanager") as am:
        yield am


def write(h: Harness, node: str, index: int, profile: Profile, days: float) -> None:
    key = CardKey(node_id=NodeId(node), gpu_index=index, source="real")
    SqlHealthSampleStore(h.ctx.engine).insert(
        [
            HealthReading(key=key, uuid=s.uuid, sampled_at=s.sampled_at, counters=s.counters)
            for s in series(profile, card=index, start=h.clock.now() - days * DAY, end=h.clock.now())
        ]
    )


def test_a_stronger_card_joining_the_alert_makes_it_critical_in_alertmanager(
    engine: Engine, manager: Alertmanager
) -> None:
    with running_server(engine, start=NOW, delivery={"alertmanager_url": manager.url}) as h:
        node = h.register(h.token("agent"), "gpu-node-cards")
        write(h, node, 0, "degrading", 10)
        assert h.ctx.worker.tick().predictions_created == {"real": 1}
        delivered(h)
        [warning] = until(
            lambda: alert_named(manager, "GPU_FAULT_PREDICTED", "gpu-node-cards"), within=15, what="the warning"
        )
        assert warning["labels"]["severity"] == "warning"
        assert warning["annotations"]["gpus"] == "0"

        h.clock.advance(86400)
        write(h, node, 3, "remap-failure", 1)
        assert h.ctx.worker.tick().predictions_created == {"real": 1}
        delivered(h)

        def critical_only() -> list[dict[str, Any]]:
            found = alert_named(manager, "GPU_FAULT_PREDICTED", "gpu-node-cards")
            return found if [a["labels"]["severity"] for a in found] == ["critical"] else []

        [critical] = until(critical_only, within=15, what="one critical alert, the warning ended")
        assert critical["labels"]["heteroflow_alert_id"] == warning["labels"]["heteroflow_alert_id"]
        assert critical["labels"]["source"] == "real"
        assert critical["annotations"]["gpus"] == "0,3"
        assert "GPU 3" in critical["annotations"]["cards"]
        assert "remap_failure" in critical["annotations"]["cards"]
