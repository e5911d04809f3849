"""The read APIs, auth and tenant scoping, on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from tests.support.harness import Harness, running_server

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def harness(engine: Engine) -> Any:
    with running_server(engine, start=T0) as h:
        yield h


def test_every_route_refuses_a_missing_or_unknown_token(harness: Harness) -> None:
    routes = [
        ("GET", "/api/v1/nodes"),
        ("GET", "/api/v1/nodes/x"),
        ("POST", "/api/v1/nodes/x/release"),
        ("GET", "/api/v1/nodes/x/gpu-metrics"),
        ("DELETE", "/api/v1/nodes/x"),
        ("POST", "/api/v1/nodes/register"),
        ("POST", "/api/v1/nodes/x/heartbeat"),
        ("GET", "/api/v1/gpu-health/samples"),
        ("GET", "/api/v1/gpu-health/capabilities"),
        ("GET", "/api/v1/gpu-health/capabilities.csv"),
        ("GET", "/api/v1/gpu-health/xid-events"),
        ("GET", "/api/v1/gpu-health/predictions"),
        ("GET", "/api/v1/gpu-health/predictions.csv"),
        ("GET", "/api/v1/gpu-health/prediction-stats"),
        ("GET", "/api/v1/alerts"),
        ("GET", "/api/v1/alerts/x"),
        ("POST", "/api/v1/alerts/x/resolve"),
        ("POST", "/api/v1/alerts/x/acknowledge"),
        ("GET", "/api/v1/server/status"),
        ("GET", "/api/v1/hardware-events"),
        ("GET", "/api/v1/serving/status"),
        ("GET", "/api/v1/serving/rounds"),
        ("GET", "/api/v1/serving/rounds/x"),
        ("GET", "/metrics"),
        ("GET", "/healthz"),
        ("GET", "/api/v1/auth/whoami"),
        ("POST", "/api/v1/auth/session"),
        ("GET", "/api/v1/auth/session"),
        ("DELETE", "/api/v1/auth/session"),
        ("GET", "/openapi.json"),
    ]
    schema_paths = set(harness.openapi()["paths"])
    named = {
        path.replace("/nodes/x", "/nodes/{node_id}")
        .replace("/alerts/x", "/alerts/{alert_id}")
        .replace("/serving/rounds/x", "/serving/rounds/{request_id}")
        for _, path in routes
    }
    assert schema_paths - {"/health"} <= named, schema_paths - named
    # the one open route: the liveness probe (a probe carries no token)
    assert harness.client.get("/health").json() == {"status": "ok"}
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer hf_not-a-real-token"}, {"Authorization": "Basic abc"}):
            response = harness.client.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.headers["www-authenticate"] == "Bearer"


def test_scopes_are_enforced_with_403(harness: Harness) -> None:
    reader = harness.token("nodes:read")
    agent = harness.token("agent")
    assert (
        harness.client.post(
            "/api/v1/nodes/register",
            json={"hostname": "n1", "vendor": "nvidia", "gpu_count": 1},
            headers=harness.auth(reader),
        ).status_code
        == 403
    )
    assert harness.get(agent, "/api/v1/nodes").status_code == 403
    assert harness.get(agent, "/metrics").status_code == 403
    assert harness.get(reader, "/api/v1/server/status").status_code == 403
    admin = harness.token("admin")
    assert harness.get(admin, "/metrics").status_code == 200
    assert harness.get(admin, "/api/v1/server/status").status_code == 200
    assert harness.get(reader, "/openapi.json").json()["info"]["title"] == "HeteroFlow platform server"


def test_revoked_token_stops_working_after_one_upkeep_round(harness: Harness) -> None:
    from heteroflow.platform.auth import hash_token
    from heteroflow.storage.token_store import SqlTokenStore

    token = harness.token("nodes:read")
    assert harness.get(token, "/api/v1/nodes").status_code == 200
    store = SqlTokenStore(harness.ctx.engine)
    principal = store.principal(hash_token(token))
    assert principal is not None
    assert store.revoke(principal.token_id, now=harness.clock.now())
    harness.maintain()
    assert harness.get(token, "/api/v1/nodes").status_code == 401


def test_tenants_see_only_their_nodes_and_outside_nodes_are_indistinguishable_from_absent(
    harness: Harness,
) -> None:
    agent_a = harness.token("agent", tenant="team-a")
    agent_b = harness.token("agent", tenant="team-b")
    reader_a = harness.token("nodes:read,nodes:write", tenant="team-a")
    operator = harness.token("nodes:read")
    node_a = harness.register(agent_a, "a-1")
    node_b = harness.register(agent_b, "b-1")
    harness.register(agent_b, "b-2")
    for token, node in ((agent_a, node_a), (agent_b, node_b)):
        harness.beat(token, node, [{"index": 0, "uuid": "GPU-x", "ecc_corrected_total": 1}])
    harness.drain()

    listing = harness.get(reader_a, "/api/v1/nodes").json()
    assert [item["name"] for item in listing["items"]] == ["a-1"]
    assert listing["total"] == 1  # no count leaks
    assert harness.get(operator, "/api/v1/nodes").json()["total"] == 3

    outside = harness.get(reader_a, f"/api/v1/nodes/{node_b}")
    absent = harness.get(reader_a, "/api/v1/nodes/00000000-0000-0000-0000-000000000000")
    assert outside.status_code == absent.status_code == 404
    assert outside.json()["error"] == absent.json()["error"]
    samples_outside = harness.get(reader_a, "/api/v1/gpu-health/samples", node_id=node_b, gpu_index=0)
    assert samples_outside.status_code == 404
    assert harness.client.delete(f"/api/v1/nodes/{node_b}", headers=harness.auth(reader_a)).status_code == 404
    # a tenant's agent cannot beat for another tenant's node either
    assert harness.beat(agent_a, node_b, []).status_code == 404

    caps_a = harness.get(reader_a, "/api/v1/gpu-health/capabilities").json()
    assert {card["node_id"] for card in caps_a["cards"]} == {node_a}
    caps_all = harness.get(operator, "/api/v1/gpu-health/capabilities").json()
    assert {card["node_id"] for card in caps_all["cards"]} == {node_a, node_b}


def test_registration_is_idempotent_by_hostname_and_never_switches_source(harness: Harness) -> None:
    agent = harness.token("agent")
    first = harness.register(agent, "gpu-7", gpu_count=8)
    again = harness.register(agent, "gpu-7", gpu_count=4)
    assert first == again
    conflict = harness.client.post(
        "/api/v1/nodes/register",
        json={"hostname": "gpu-7", "vendor": "nvidia", "gpu_count": 4, "source": "simulated"},
        headers=harness.auth(agent),
    )
    assert conflict.status_code == 409
    assert "never switches source" in conflict.json()["detail"]
    reader = harness.token("nodes:read")
    assert harness.get(reader, f"/api/v1/nodes/{first}").json()["gpu_count"] == 4


def test_a_hostname_is_unique_per_tenant_without_telling_another_tenant_it_exists(harness: Harness) -> None:
    """another tenant's hostname answered 409 "registered in another scope" (an oracle), and
    registering it first locked the real agent out. Now each tenant has its own node of that name."""
    mine = harness.register(harness.token("agent"), "gpu-7")
    other_tenant = harness.token("agent", tenant="t")
    theirs = harness.client.post(
        "/api/v1/nodes/register",
        json={"hostname": "gpu-7", "vendor": "nvidia", "gpu_count": 4},
        headers=harness.auth(other_tenant),
    )
    assert theirs.status_code == 200, theirs.text
    assert theirs.json()["created"] is True
    assert theirs.json()["node_id"] != mine
    reader = harness.token("nodes:read")
    assert harness.get(reader, f"/api/v1/nodes/{mine}").json()["gpu_count"] == 8  # untouched


def test_an_agent_token_cannot_take_over_or_beat_for_a_node_registered_by_another_agent(harness: Harness) -> None:
    """any agent token registered an existing hostname, got the node's id back, overwrote its
    inventory and beat (with XID events) for it. Now the node's own credential is needed for each."""
    fleet = harness.token("agent")
    node = harness.register(fleet, "gpu-real", gpu_count=8)
    forged = {"hostname": "gpu-real", "vendor": "evil", "gpu_count": 256}
    taken = harness.client.post("/api/v1/nodes/register", json=forged, headers=harness.auth(fleet))
    assert taken.status_code == 409, taken.text
    assert "node credential" in taken.json()["detail"]
    assert node not in taken.text
    wrong = {**harness.auth(fleet), "X-HeteroFlow-Node-Credential": "hf_not-the-credential"}
    assert harness.client.post("/api/v1/nodes/register", json=forged, headers=wrong).status_code == 409
    xid = {
        "gpu_stats": [],
        "xid_events": [{"gpu_index": 0, "uuid": "GPU-forged", "xid": 79, "at": "2026-01-01T00:00:00Z"}],
    }
    for headers in (harness.auth(fleet), wrong):
        beat = harness.client.post(f"/api/v1/nodes/{node}/heartbeat", json=xid, headers=headers)
        missing = harness.client.post(
            "/api/v1/nodes/00000000-0000-4000-8000-000000000000/heartbeat", json=xid, headers=headers
        )
        assert beat.status_code == missing.status_code == 404
        assert beat.json() == {**missing.json(), "detail": beat.json()["detail"]}
    reader = harness.token("nodes:read")
    assert harness.get(reader, f"/api/v1/nodes/{node}").json()["vendor"] == "nvidia"  # inventory untouched
    # the real agent, with its credential, carries on
    assert harness.beat(fleet, node, []).status_code == 200
    assert harness.register(fleet, "gpu-real", gpu_count=8) == node
    # an operator re-issues the credential of an agent that lost it; the old one stops working
    admin = harness.token("admin")
    reissued = harness.client.post(
        "/api/v1/nodes/register",
        json={"hostname": "gpu-real", "vendor": "nvidia", "gpu_count": 8},
        headers=harness.auth(admin),
    )
    assert reissued.status_code == 200
    assert reissued.json()["node_credential"]
    assert harness.beat(fleet, node, []).status_code == 404
    headers = {**harness.auth(fleet), "X-HeteroFlow-Node-Credential": reissued.json()["node_credential"]}
    assert (
        harness.client.post(f"/api/v1/nodes/{node}/heartbeat", json={"gpu_stats": []}, headers=headers).status_code
        == 200
    )


def test_a_token_registers_at_most_its_quota_of_nodes_and_cards(harness: Harness) -> None:
    """one agent token created 100 nodes x 256 cards in 4 s. Now its quotas answer 429."""
    harness.ctx.settings = harness.ctx.settings.model_copy(update={"max_nodes_per_token": 3, "max_cards_per_token": 20})
    token = harness.token("agent")
    for n in range(2):
        harness.register(token, f"q-{n}", gpu_count=8)
    too_many_cards = harness.client.post(
        "/api/v1/nodes/register",
        json={"hostname": "q-2", "vendor": "nvidia", "gpu_count": 8},
        headers=harness.auth(token),
    )
    assert too_many_cards.status_code == 429, too_many_cards.text
    harness.register(token, "q-2", gpu_count=4)
    too_many_nodes = harness.client.post(
        "/api/v1/nodes/register",
        json={"hostname": "q-3", "vendor": "nvidia", "gpu_count": 0},
        headers=harness.auth(token),
    )
    assert too_many_nodes.status_code == 429
    assert "quota of 3 nodes" in too_many_nodes.json()["detail"]
    # another token has its own quota
    harness.register(harness.token("agent"), "q-other", gpu_count=8)


@pytest.mark.parametrize(
    "body",
    [
        {"hostname": "", "vendor": "nvidia", "gpu_count": 1},
        {"hostname": "bad host", "vendor": "nvidia", "gpu_count": 1},
        {"hostname": "h", "vendor": "nvidia", "gpu_count": -1},
        {"hostname": "h", "vendor": "nvidia", "gpu_count": 1, "source": "all"},
        {"hostname": "h", "vendor": "nvidia", "gpu_count": 1, "surprise": True},
        {"vendor": "nvidia", "gpu_count": 1},
    ],
)
def test_bad_registrations_get_422_with_a_message(harness: Harness, body: dict[str, Any]) -> None:
    agent = harness.token("agent")
    response = harness.client.post("/api/v1/nodes/register", json=body, headers=harness.auth(agent))
    assert response.status_code == 422
    assert response.json()["detail"]


def test_malformed_heartbeat_bodies_get_4xx_never_5xx(harness: Harness) -> None:
    agent = harness.token("agent")
    node = harness.register(agent, "n1")
    headers = {**harness.node_auth(agent, node), "content-type": "application/json"}
    for raw in (b"{", b"[]", b'{"gpu_stats": 5}', b'{"gpu_stats": [1, 2]}', b"\xff\xfe", b'{"xid_events": "x"}'):
        response = harness.client.post(f"/api/v1/nodes/{node}/heartbeat", content=raw, headers=headers)
        assert 400 <= response.status_code < 500, (raw, response.status_code)
    too_many = {"gpu_stats": [{"index": i} for i in range(300)]}
    assert harness.client.post(f"/api/v1/nodes/{node}/heartbeat", json=too_many, headers=headers).status_code == 422


def test_a_beat_with_times_outside_the_calendar_is_accepted_with_those_times_unknown(harness: Harness) -> None:
    """Both were a 500 (OverflowError converting to UTC): one agent's odd clock failed its own beat."""
    agent = harness.token("agent")
    node = harness.register(agent, "n1")
    stats = [{"index": 0, "uuid": "GPU-0", "sampled_at": "9999-12-31T23:59:59-01:00", "retired_pages": 1}]
    events = [{"index": 0, "xid": 79, "occurred_at": "0001-01-01T00:00:00+01:00"}]
    response = harness.beat(agent, node, stats, xid_events=events)
    assert response.status_code == 200, response.text
    assert response.json()["xid_events"]["rejected"] == ["xid_events[0]: occurred_at must be an ISO-8601 time"]


def test_bodies_too_large_too_deep_or_not_text_get_4xx_in_the_servers_error_shape(harness: Harness) -> None:
    agent = harness.token("agent")
    headers = {**harness.auth(agent), "content-type": "application/json"}
    for raw, status, code in [
        (b'{"hostname": "' + b"a" * (1 << 20) + b'"}', 413, "body_too_large"),
        (b"[" * 10_000 + b"]" * 10_000, 400, "invalid_body"),  # past CPython's recursion limit
        (b'{"a": ' * 40 + b"1" + b"}" * 40, 400, "invalid_body"),  # deeper than 32 levels
        # not text: FastAPI's own answer was {"detail": "There was an error parsing the body"}
        (b'{"hostname": "\xff"}', 400, "invalid_body"),
    ]:
        response = harness.client.post("/api/v1/nodes/register", content=raw, headers=headers)
        assert response.status_code == status, (raw[:20], response.text)
        assert response.json()["error"] == code
        assert response.json()["detail"]


def test_samples_are_ascending_bounded_and_truncated_keeping_the_newest(harness: Harness) -> None:
    agent = harness.token("agent")
    reader = harness.token("nodes:read")
    node = harness.register(agent, "n1")
    for value in range(10):
        harness.beat(agent, node, [{"index": 3, "uuid": "GPU-3", "ecc_corrected_total": value}])
        harness.clock.advance(60)
    harness.drain()
    full = harness.get(reader, "/api/v1/gpu-health/samples", node_id=node, gpu_index=3).json()
    assert [s["ecc_corrected_total"] for s in full["samples"]] == list(range(10))
    assert full["truncated"] is False
    assert full["samples"][0]["ecc_uncorrected_total"] is None  # unknown stays null, never 0
    cut = harness.get(reader, "/api/v1/gpu-health/samples", node_id=node, gpu_index=3, limit=4).json()
    assert [s["ecc_corrected_total"] for s in cut["samples"]] == [6, 7, 8, 9]
    assert cut["truncated"] is True
    since = (T0 + timedelta(minutes=8)).isoformat()
    recent = harness.get(reader, "/api/v1/gpu-health/samples", node_id=node, gpu_index=3, since=since).json()
    assert [s["ecc_corrected_total"] for s in recent["samples"]] == [8, 9]
    simulated = harness.get(reader, "/api/v1/gpu-health/samples", node_id=node, gpu_index=3, source="simulated").json()
    assert simulated["samples"] == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 20001}, "limit"),
        ({"source": "all"}, "source"),
        ({"source": "REAL"}, "source"),
    ],
)
def test_sample_parameters_out_of_range_get_400(harness: Harness, params: dict[str, Any], message: str) -> None:
    agent = harness.token("agent")
    reader = harness.token("nodes:read")
    node = harness.register(agent, "n1")
    response = harness.get(reader, "/api/v1/gpu-health/samples", node_id=node, gpu_index=0, **params)
    assert response.status_code == 400
    assert message in response.json()["detail"]


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_time_outside_the_calendar_once_in_utc_gets_422_on_every_time_parameter(harness: Harness, when: str) -> None:
    """Each of these was a 500 (OverflowError converting to UTC)."""
    agent = harness.token("agent")
    reader = harness.token("nodes:read")
    node = harness.register(agent, "n1")
    cases: list[tuple[str, dict[str, Any]]] = [
        ("/api/v1/gpu-health/samples", {"node_id": node, "gpu_index": 0, "since": when}),
        ("/api/v1/gpu-health/capabilities", {"since": when}),
        (f"/api/v1/nodes/{node}/gpu-metrics", {"since": when}),
        ("/api/v1/hardware-events", {"since": when}),
        ("/api/v1/gpu-health/predictions", {"since": when}),
        ("/api/v1/gpu-health/predictions", {"until": when}),
        ("/api/v1/gpu-health/prediction-stats", {"since": when}),
    ]
    for path, params in cases:
        response = harness.get(reader, path, **params)
        assert response.status_code == 422, (path, params, response.text)
        assert "outside years 1 to 9999" in response.text
    # the same instants without an offset are within the calendar: accepted
    assert harness.get(reader, "/api/v1/gpu-health/capabilities", since=when[:19]).status_code == 200


def test_samples_require_node_and_index(harness: Harness) -> None:
    reader = harness.token("nodes:read")
    assert harness.get(reader, "/api/v1/gpu-health/samples", gpu_index=0).status_code == 422
    assert harness.get(reader, "/api/v1/gpu-health/samples", node_id="n").status_code == 422
    assert harness.get(reader, "/api/v1/gpu-health/samples", node_id="n", gpu_index=-1).status_code == 422


def test_capabilities_are_derived_from_samples_with_stall_and_trend_flags(harness: Harness) -> None:
    agent = harness.token("agent")
    reader = harness.token("nodes:read")
    sim_agent = harness.token("agent")
    node = harness.register(agent, "n1")
    sim_node = harness.register(sim_agent, "sim-1", source="simulated")
    # card 0 reports corrected ECC; card 1 only uncorrected (like a Kunlunxin card), and stops reporting
    harness.beat(
        agent,
        node,
        [
            {"index": 0, "uuid": "GPU-0", "ecc_corrected_total": 5, "ecc_uncorrected_total": 0},
            {"index": 1, "uuid": None, "ecc_uncorrected_total": 0, "ecc_corrected_total": "[N/A]"},
        ],
    )
    harness.beat(sim_agent, sim_node, [{"index": 0, "uuid": "SIM-0", "retired_pages": 1}])
    harness.drain()
    harness.clock.advance(61 * 60)
    harness.beat(agent, node, [{"index": 0, "uuid": "GPU-0", "ecc_corrected_total": 6, "ecc_uncorrected_total": 0}])
    harness.drain()

    body = harness.get(reader, "/api/v1/gpu-health/capabilities").json()
    assert body["source"] == "real"
    assert body["stall_threshold_minutes"] == 60
    assert "not zero errors" in body["note"] or "does not mean zero errors" in body["note"]
    cards = {card["gpu_index"]: card for card in body["cards"]}
    assert set(cards) == {0, 1}
    assert cards[0]["metrics"]["ecc_corrected_total"] == "collectable"
    assert cards[0]["metrics"]["retired_pages"] == "unknown"
    assert cards[0]["sample_count"] == 2
    assert cards[0]["trend_prediction_possible"] is True
    assert cards[0]["collection_stalled"] is False
    assert cards[1]["uuid"] is None
    assert cards[1]["trend_prediction_possible"] is False
    assert cards[1]["collection_stalled"] is True
    simulated = harness.get(reader, "/api/v1/gpu-health/capabilities", source="simulated").json()
    assert [(c["node_id"], c["metrics"]["retired_pages"]) for c in simulated["cards"]] == [(sim_node, "collectable")]
    assert harness.get(reader, "/api/v1/gpu-health/capabilities", source="all").status_code == 400


def test_liveness_agrees_across_two_servers_on_one_database(engine: Engine) -> None:
    with running_server(engine, start=T0) as first, running_server(engine, start=T0) as second:
        agent = first.token("agent")
        reader = first.token("nodes:read")
        node = first.register(agent, "n1")
        first.beat(agent, node, [])
        first.clock.advance(10)
        second.clock.advance(10)
        second.beat(agent, node, [])
        first.maintain()
        second.maintain()
        # each server answers with the newest heartbeat either of them received
        seen = {h.get(reader, f"/api/v1/nodes/{node}").json()["last_heartbeat"] for h in (first, second)}
        assert seen == {(T0 + timedelta(seconds=10)).isoformat().replace("+00:00", "Z")}
        # an older flush from a lagging server never moves the stored time backwards
        first.clock.advance(100)
        second.clock.advance(100)
        listing = second.get(reader, "/api/v1/nodes").json()["items"][0]
        assert listing["online"] is False


def test_a_node_deleted_through_another_server_is_refused_after_one_upkeep_round(engine: Engine) -> None:
    with running_server(engine, start=T0) as first, running_server(engine, start=T0) as second:
        agent = first.token("agent")
        operator = first.token("nodes:write")
        node = first.register(agent, "n1")
        assert second.beat(agent, node, []).status_code == 200  # second now trusts the node from memory
        assert first.client.delete(f"/api/v1/nodes/{node}", headers=first.auth(operator)).status_code == 204
        assert second.beat(agent, node, []).status_code == 200  # not yet re-confirmed
        second.maintain()
        assert second.beat(agent, node, []).status_code == 404  # the agent re-registers on 404
