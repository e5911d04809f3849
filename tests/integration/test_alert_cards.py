"""GPU_FAULT_PREDICTED as an on-call works from it: every predicted card of the node, severity by signal, a later
card joining the open alert, acknowledge apart from resolve, and the list's filters (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.simulation import Profile, series
from heteroflow.storage.health_store import SqlHealthSampleStore
from tests.integration.test_predictions import DAY, NOW
from tests.support.harness import Harness, running_server


@pytest.fixture
def harness(engine: Engine) -> Iterator[Harness]:
    with running_server(engine, start=NOW) as h:
        yield h


def write_profile(h: Harness, node: str, index: int, profile: Profile, *, days: float = 10) -> None:
    key = CardKey(node_id=NodeId(node), gpu_index=index, source="real")
    SqlHealthSampleStore(h.ctx.engine).insert(
        [
            HealthReading(key=key, uuid=s.uuid, sampled_at=s.sampled_at, counters=s.counters)
            for s in series(profile, card=index, start=h.clock.now() - days * DAY, end=h.clock.now())
        ]
    )


def alert_list(h: Harness, token: str, **params: Any) -> dict[str, Any]:
    response = h.get(token, "/api/v1/alerts", **params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_every_predicted_card_is_in_the_node_alert_and_a_later_one_joins_it(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "gpu-a")
    for index in (0, 1, 2):
        write_profile(harness, node, index, "degrading")
    write_profile(harness, node, 3, "healthy")
    assert harness.ctx.worker.tick().predictions_created == {"real": 3}
    [alert] = alert_list(harness, reader)["items"]
    assert alert["severity"] == "WARN"  # trends only
    assert [c["gpu_index"] for c in alert["cards"]] == [0, 1, 2]
    assert {c["source"] for c in alert["cards"]} == {"real"}
    assert all(c["signals"] == ["corrected_ecc_growth"] and c["severity"] == "WARN" for c in alert["cards"])
    assert alert["cards"][0]["evidence"][0]["code"] == "evidence.corrected_growth"
    # every prediction of the node carries the alert's id
    items = harness.get(reader, "/api/v1/gpu-health/predictions", node_id=node).json()["items"]
    assert {p["alert_id"] for p in items} == {alert["id"]}

    # a day later card 3 fails outright (remap failure: a strong signal): it joins the open alert, which rises
    harness.clock.advance(86400)
    write_profile(harness, node, 3, "remap-failure", days=1)
    assert harness.ctx.worker.tick().predictions_created == {"real": 1}
    [after] = alert_list(harness, reader)["items"]
    assert after["id"] == alert["id"]
    assert after["severity"] == "CRITICAL"
    assert after["cards"][0]["gpu_index"] == 3  # the most severe first
    assert after["cards"][0]["severity"] == "CRITICAL"
    assert "remap_failure" in after["cards"][0]["signals"]
    assert sorted(c["gpu_index"] for c in after["cards"]) == [0, 1, 2, 3]
    history = harness.get(reader, f"/api/v1/alerts/{alert['id']}").json()["history"]
    actions = [e["action"] for e in history]
    assert actions.count("card_added") == 3  # cards 1 and 2 in the first tick, card 3 a day later
    joined = [e for e in history if e["action"] == "card_added"][-1]
    assert joined["note_code"]["code"] == "alert.fault_predicted"
    assert joined["note_code"]["params"]["gpu_index"] == "3"

    # the filters: card, severity, node, search, and nothing for a card that is in no alert
    assert alert_list(harness, reader, gpu=3)["total"] == 1
    assert alert_list(harness, reader, gpu=7)["total"] == 0
    assert alert_list(harness, reader, severity="CRITICAL")["total"] == 1
    assert alert_list(harness, reader, severity="WARN")["total"] == 0
    assert alert_list(harness, reader, node="GPU-A")["total"] == 1
    assert alert_list(harness, reader, node="gpu-b")["total"] == 0
    assert alert_list(harness, reader, q="predicted")["total"] == 1
    assert alert_list(harness, reader, q="100%_")["total"] == 0  # LIKE wildcards are literal
    assert harness.get(reader, "/api/v1/alerts", severity="LOUD").status_code in (400, 422)
    assert harness.get(reader, "/api/v1/alerts", gpu=-1).status_code in (400, 422)


def test_acknowledge_is_apart_from_resolve(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    operator = harness.token("alerts:write,nodes:read")
    node = harness.register(agent, "gpu-b")
    write_profile(harness, node, 0, "sudden-ue")
    harness.ctx.worker.tick()
    [alert] = alert_list(harness, reader)["items"]
    assert alert["severity"] == "CRITICAL"  # uncorrectable growth: the card is already failing
    assert alert["acknowledged_by"] is None
    assert alert_list(harness, reader, acknowledged="false")["total"] == 1
    url = f"/api/v1/alerts/{alert['id']}/acknowledge"
    assert harness.client.post(url, json={"note": "x"}, headers=harness.auth(reader)).status_code == 403
    assert harness.client.post(url, json={"note": "x" * 2001}, headers=harness.auth(operator)).status_code in (
        400,
        422,
    )
    missing = "/api/v1/alerts/nope/acknowledge"
    assert harness.client.post(missing, json={"note": ""}, headers=harness.auth(operator)).status_code == 404
    harness.clock.advance(60)
    done = harness.client.post(url, json={"note": "draining the node tonight"}, headers=harness.auth(operator))
    assert done.status_code == 200, done.text
    acked = done.json()["alert"]
    assert acked["status"] == "open"  # acknowledged, not resolved
    assert acked["acknowledged_by"].startswith("token:test:")
    assert acked["acknowledgement"] == "draining the node tonight"
    assert acked["acknowledged_at"] is not None
    assert [e["action"] for e in done.json()["history"]] == ["raised", "acknowledged"]
    assert alert_list(harness, reader, acknowledged="true")["total"] == 1
    assert alert_list(harness, reader, acknowledged="false")["total"] == 0
    resolve = f"/api/v1/alerts/{alert['id']}/resolve"
    assert harness.client.post(resolve, json={"reason": "card replaced"}, headers=harness.auth(operator)).is_success
    late = harness.client.post(url, json={"note": "late"}, headers=harness.auth(operator))
    assert late.status_code == 409
