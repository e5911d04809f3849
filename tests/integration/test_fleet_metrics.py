"""The fleet series of the platform's ``/metrics`` (open alerts, node heartbeats), read from the database at
scrape time, on SQLite and PostgreSQL; and what a scrape says when the database cannot be read."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.engine import Engine

from heteroflow.platform_server.fleet_metrics import render_fleet
from tests.support.harness import Harness, running_server

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def series(text: str, name: str) -> dict[str, float]:
    found = re.findall(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, flags=re.MULTILINE)
    return {labels: float(value) for labels, value in found}


def scrape(h: Harness) -> str:
    response = h.get(h.token("metrics:read"), "/metrics")
    assert response.status_code == 200, response.text
    # sent in parts (never joined on the event loop), with the whole length announced, not chunked
    assert response.headers["content-length"] == str(len(response.content))
    assert "transfer-encoding" not in response.headers
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    return response.text


def test_open_alerts_are_counted_by_type_and_known_types_are_zero_not_absent(engine: Engine) -> None:
    with running_server(engine, start=T0, gpu_metrics={"memory_high_minutes": 1}) as h:
        text = scrape(h)
        assert series(text, "heteroflow_fleet_scrape_ok") == {"": 1.0}
        assert series(text, "heteroflow_alerts_open") == {
            '{severity="WARN",type="GPU_FAULT_PREDICTED"}': 0.0,
            '{severity="CRITICAL",type="GPU_FAULT_PREDICTED"}': 0.0,
            '{severity="WARN",type="GPU_MEMORY_HIGH"}': 0.0,
            '{severity="WARN",type="NODE_CARDS_REFUSED"}': 0.0,
        }
        assert series(text, "heteroflow_node_last_heartbeat_timestamp_seconds") == {}  # no node: no series

        agent = h.token("agent")
        node = h.register(agent, "gpu-fleet-1")
        h.register(agent, "gpu-fleet-silent")  # never beats: no series, never a 0
        full = {"index": 0, "uuid": "GPU-0", "memory_used_mib": 79_900, "memory_total_mib": 80_000}
        for _ in range(15):
            assert h.beat(agent, node, [full]).status_code == 200
            h.clock.advance(5)
        h.flush_metrics()
        h.maintain()  # the liveness flush writes the last beat
        text = scrape(h)
        assert series(text, "heteroflow_alerts_open")['{severity="WARN",type="GPU_MEMORY_HIGH"}'] == 1.0
        assert series(text, "heteroflow_alerts_open_backlog") == {
            '{type="GPU_FAULT_PREDICTED"}': 0.0,
            '{type="GPU_MEMORY_HIGH"}': 0.0,
            '{type="NODE_CARDS_REFUSED"}': 0.0,
        }
        beats = series(text, "heteroflow_node_last_heartbeat_timestamp_seconds")
        assert list(beats) == ['{node="gpu-fleet-1",source="real"}']
        assert T0.timestamp() < beats['{node="gpu-fleet-1",source="real"}'] <= h.clock.now().timestamp()


def test_an_unreadable_database_says_so_instead_of_reporting_zero() -> None:
    text = render_fleet(None).decode()
    assert series(text, "heteroflow_fleet_scrape_ok") == {"": 0.0}
    assert "heteroflow_alerts_open" not in text
