"""A node's own credential through the real routes: an agent that lost it gets 409 however long its node stays
silent (silence can be provoked), and its token claims a new one after an operator releases it; no other token
ever does; the node says whose credential speaks for it since when, and its hardware events just after a re-issue
are held for an operator. And the per-client limits before the heartbeat gate: one node, one address, each its
share (429)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from tests.support.harness import Harness, running_server

REGISTRATION = {"hostname": "gpu-lost", "vendor": "nvidia", "model": "H100", "gpu_count": 8}


@pytest.fixture
def harness(engine: Engine) -> Iterator[Harness]:
    with running_server(engine) as h:
        yield h


def _register(harness: Harness, token: str, credential: str | None = None) -> Any:
    headers = harness.auth(token) | ({"X-HeteroFlow-Node-Credential": credential} if credential else {})
    return harness.client.post("/api/v1/nodes/register", json=REGISTRATION, headers=headers)


def test_a_lost_credential_is_never_reclaimed_by_time_however_long_the_node_is_silent(harness: Harness) -> None:
    """A node's silence used to let its token re-register it without the credential: an attacker holding the
    token starved the node's beats (503s, the agent's back-off) until it was offline long enough, took a new
    credential and locked the real agent out. Silence proves nothing; only an operator re-issues."""
    fleet, other = harness.token("agent"), harness.token("agent")
    first = _register(harness, fleet).json()
    node = first["node_id"]
    lost = _register(harness, fleet)  # the agent's state folder is gone: no credential
    assert lost.status_code == 409
    assert lost.json()["error"] == "node_credential_required"
    assert "retry-after" not in lost.headers  # nothing to wait for: waiting never helps
    assert first["node_id"] not in lost.text
    harness.clock.advance(24 * 3600)  # a day offline
    for token in (fleet, other):
        refused = _register(harness, token)
        assert (refused.status_code, refused.json()["error"]) == (409, "node_credential_required")
    old = harness.auth(fleet) | {"X-HeteroFlow-Node-Credential": first["node_credential"]}
    assert harness.client.post(f"/api/v1/nodes/{node}/heartbeat", json={}, headers=old).status_code == 200
    shown = harness.get(harness.token("nodes:read"), f"/api/v1/nodes/{node}").json()
    assert shown["credential"] == {  # the real agent still speaks for it, with its first credential
        "state": "issued",
        "issued_at": shown["registered_at"],
        "reissued": False,
        "released_at": None,
    }


def test_an_operator_releases_a_credential_and_only_the_creating_token_claims_a_new_one_at_once(
    harness: Harness,
) -> None:
    fleet, other, operator = harness.token("agent"), harness.token("agent"), harness.token("nodes:write,nodes:read")
    first = _register(harness, fleet).json()
    node, old = first["node_id"], {"X-HeteroFlow-Node-Credential": first["node_credential"]}
    beat = harness.client.post(f"/api/v1/nodes/{node}/heartbeat", json={}, headers=harness.auth(fleet) | old)
    assert beat.status_code == 200
    assert harness.client.post(f"/api/v1/nodes/{node}/release", headers=harness.auth(fleet)).status_code == 403
    released = harness.client.post(f"/api/v1/nodes/{node}/release", headers=harness.auth(operator))
    assert released.status_code == 200, released.text
    assert released.json()["id"] == node
    # no one speaks for it now, the old credential included, until the creating token registers it again
    beat = harness.client.post(f"/api/v1/nodes/{node}/heartbeat", json={}, headers=harness.auth(fleet) | old)
    assert beat.status_code == 404
    assert _register(harness, other).status_code == 409
    assert released.json()["credential"]["state"] == "released"
    assert released.json()["credential"]["released_at"] is not None
    harness.clock.advance(5)
    claimed = _register(harness, fleet)
    assert claimed.status_code == 200, claimed.text
    assert claimed.json()["node_id"] == node
    shown = harness.get(operator, f"/api/v1/nodes/{node}").json()
    # told apart from a node that never beat: its beats kept, its credential re-issued after its registration
    assert shown["last_heartbeat"] is not None
    assert (shown["credential"]["state"], shown["credential"]["reissued"]) == ("issued", True)
    new = {"X-HeteroFlow-Node-Credential": claimed.json()["node_credential"]}
    beat = harness.client.post(f"/api/v1/nodes/{node}/heartbeat", json={}, headers=harness.auth(fleet) | new)
    assert beat.status_code == 200
    missing = "00000000-0000-4000-8000-000000000000"
    assert harness.client.post(f"/api/v1/nodes/{missing}/release", headers=harness.auth(operator)).status_code == 404


@pytest.fixture
def limited(engine: Engine) -> Iterator[Harness]:
    settings = {"max_in_flight_per_node": 1, "max_in_flight_per_peer": 2, "heartbeat_interval_seconds": 2.5}
    with running_server(engine, server=settings) as h:
        yield h


def _holding(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the next beat with XID events wait in its XID write until released (a beat held in flight)."""
    storing, release = threading.Event(), threading.Event()
    store = harness.ctx.samples.insert_xid_events

    def slow_store(*args: Any, **kwargs: Any) -> int:
        storing.set()
        assert release.wait(30), "the held beat was never released"
        return store(*args, **kwargs)

    monkeypatch.setattr(harness.ctx.samples, "insert_xid_events", slow_store)
    return storing, release


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


XID = {"index": 0, "uuid": "GPU-1", "xid": 79, "occurred_at": "2026-03-01T12:00:00+00:00"}


def test_one_node_and_one_address_each_hold_their_share_and_the_excess_is_429_unread(
    limited: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = limited.token("agent")
    node_a, node_b = limited.register(token, "gpu-a"), limited.register(token, "gpu-b")
    storing, release = _holding(limited, monkeypatch)
    holder, held = _in_thread(lambda: limited.beat(token, node_a, [], xid_events=[XID]))
    try:
        assert storing.wait(30), "the first beat never reached its XID write"
        again = limited.beat(token, node_a, [])
        assert again.status_code == 429
        assert again.headers["retry-after"] == "3"
        assert again.json()["error"] == "too_many_requests"
        assert "this node has 1 requests in flight" in again.json()["detail"]
        assert limited.beat(token, node_b, []).status_code == 200  # another node beats on
        # the address holds one beat; a second one in flight would be its limit of 2, a third is refused
        second, other = _in_thread(lambda: limited.beat(token, node_b, [], xid_events=[XID]))
        deadline = time.monotonic() + 30
        while limited.ctx.heartbeat_admission.status().in_flight < 2:  # polled with a deadline
            assert second.is_alive(), other
            assert time.monotonic() < deadline, "the second beat never took its place"
            time.sleep(0.01)
        refused = limited.client.post("/api/v1/nodes/register", json=REGISTRATION, headers=limited.auth(token))
        assert refused.status_code == 429
        assert "this address has 2 requests in flight" in refused.json()["detail"]
        assert limited.get(token, "/healthz").status_code == 200  # what has no body is never limited
    finally:
        release.set()
        holder.join(30)
    second.join(30)
    assert [r.status_code for r in held + other] == [200, 200]
    assert limited.beat(token, node_a, []).status_code == 200  # the places came back
    metrics = limited.ctx.metrics.render().decode()
    assert 'heteroflow_requests_limited_total{limit="node"} 1.0' in metrics
    assert 'heteroflow_requests_limited_total{limit="peer"} 1.0' in metrics


def test_a_heartbeat_credential_is_at_most_200_characters_and_an_administrator_needs_none(harness: Harness) -> None:
    fleet, admin = harness.token("agent"), harness.token("admin")
    first = _register(harness, fleet).json()
    node, url = first["node_id"], f"/api/v1/nodes/{first['node_id']}/heartbeat"
    long = {"X-HeteroFlow-Node-Credential": "x" * 201}
    # not the node's credential: the same 404 as a missing node, before the body is read
    assert harness.client.post(url, json={}, headers=harness.auth(fleet) | long).status_code == 404
    too_long = harness.client.post(url, json={}, headers=harness.auth(admin) | long)
    assert too_long.status_code == 422, too_long.text
    assert too_long.json()["detail"][0]["loc"] == ["header", "X-HeteroFlow-Node-Credential"]
    assert harness.client.post(url, json={}, headers=harness.auth(admin)).status_code == 200
    own = {"X-HeteroFlow-Node-Credential": first["node_credential"]}
    assert harness.client.post(url, json={}, headers=harness.auth(fleet) | own).status_code == 200
    assert harness.client.post(url, json={}, headers=harness.auth(fleet)).status_code == 404
    assert node in harness.client.get(f"/api/v1/nodes/{node}", headers=harness.auth(admin)).text


def test_an_xid_from_a_node_whose_credential_was_just_reissued_is_held_for_an_operator(harness: Harness) -> None:
    """The chained attack: lock the real agent out, take a new credential, report XID 79 on the node's real card,
    and the controller retired the rank. The feed now marks such an event, and the controller never acts on it."""
    fleet, operator = harness.token("agent"), harness.token("nodes:write,nodes:read")
    first = _register(harness, fleet).json()
    node = first["node_id"]
    stat = {"index": 0, "uuid": "GPU-real-0", "ecc_corrected_total": 0}

    def beat(credential: str, at: str) -> None:
        xid = {"index": 0, "uuid": "GPU-real-0", "xid": 79, "occurred_at": at}
        headers = harness.auth(fleet) | {"X-HeteroFlow-Node-Credential": credential}
        answer = harness.client.post(
            f"/api/v1/nodes/{node}/heartbeat", json={"gpu_stats": [stat], "xid_events": [xid]}, headers=headers
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["xid_events"]["stored"] == 1

    start = harness.clock.now()
    beat(first["node_credential"], start.isoformat())  # the real agent's own XID: evidence
    harness.clock.advance(10)
    assert harness.client.post(f"/api/v1/nodes/{node}/release", headers=harness.auth(operator)).status_code == 200
    claimed = _register(harness, fleet).json()["node_credential"]
    harness.clock.advance(1)
    beat(claimed, harness.clock.now().isoformat())  # reported by whoever claimed the credential
    hold = harness.ctx.settings.node_reissue_hold_seconds
    harness.clock.advance(hold + 1)
    beat(claimed, harness.clock.now().isoformat())  # the new speaker, an hour on: evidence again
    feed = harness.get(operator, "/api/v1/hardware-events", since=(start.isoformat()), source="real")
    assert feed.status_code == 200, feed.text
    xids = [event for event in feed.json()["events"] if event["kind"] == "xid"]
    assert [event["identity_changed"] for event in xids] == [False, True, False]
