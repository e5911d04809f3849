"""A card's and a node's XID events, readable by the pages: ``/api/v1/gpu-health/xid-events``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine

from tests.integration.test_predictions import NOW
from tests.support.harness import Harness, running_server

XIDS = "/api/v1/gpu-health/xid-events"


@pytest.fixture
def harness(engine: Engine) -> Iterator[Harness]:
    with running_server(engine, start=NOW) as h:
        yield h


def test_xid_events_of_a_node_and_of_one_card_newest_first_in_scope(harness: Harness) -> None:
    agent = harness.token("agent", tenant="t1")
    reader, outsider = harness.token("nodes:read", tenant="t1"), harness.token("nodes:read", tenant="t2")
    node = harness.register(agent, "gpu-x")
    stats = [{"index": i, "uuid": f"GPU-{i}", "ecc_uncorrected_total": 0} for i in (0, 1)]
    at = [(NOW - timedelta(minutes=m)).isoformat() for m in (30, 20, 10)]
    events = [
        {"index": 1, "uuid": "GPU-1", "xid": 79, "occurred_at": at[0]},
        {"index": 0, "uuid": "GPU-0", "xid": 48, "occurred_at": at[1]},
        {"index": 1, "uuid": "GPU-1", "xid": 94, "occurred_at": at[2]},
    ]
    assert harness.beat(agent, node, stats, xid_events=events).status_code == 200
    harness.drain()

    card = harness.get(reader, XIDS, node_id=node, gpu_index=1)
    assert card.status_code == 200, card.text
    assert [(e["gpu_index"], e["xid"]) for e in card.json()["events"]] == [(1, 94), (1, 79)]
    assert card.json()["truncated"] is False
    whole = harness.get(reader, XIDS, node_id=node).json()
    assert [e["xid"] for e in whole["events"]] == [94, 48, 79]
    assert whole["gpu_index"] is None
    newest = harness.get(reader, XIDS, node_id=node, limit=1).json()
    assert ([e["xid"] for e in newest["events"]], newest["truncated"]) == ([94], True)
    later = harness.get(reader, XIDS, node_id=node, since=(NOW - timedelta(minutes=15)).isoformat()).json()
    assert [e["xid"] for e in later["events"]] == [94]
    assert harness.get(reader, XIDS, node_id=node, source="simulated").json()["events"] == []
    assert harness.get(outsider, XIDS, node_id=node).status_code == 404  # another tenant's node
    assert harness.get(reader, XIDS, node_id="nope").status_code == 404
    assert harness.get(reader, XIDS, node_id=node, gpu_index=-1).status_code in (400, 422)
    assert harness.get(reader, XIDS, node_id=node, limit=0).status_code in (400, 422)
    assert harness.get(reader, XIDS, node_id=node, source="all").status_code == 400
