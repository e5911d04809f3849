"""One tenant against the others, on a real server process with two tenants.

- Starvation: tenant A's agent tokens register many nodes and open, through each node's own credential,
  heartbeats that declare a large body and never send it — every per-node and per-address limit respected —
  until the heartbeat gate would be full. Its share of the gate fills instead: A's beats beyond it are refused
  at once, and tenant B's beats, and the nodes of no tenant, are answered 200 within 2 s throughout.
- Invented cards: nodes of one registered card report thousands of indexes, fresh uuids every beat, and a
  thousand XID events a beat. Only their registered card reaches ``/metrics`` and the database, the XID events
  stop at their bounds, each refusal is counted in the node's status and the first raises an alert.
- Guessing: random tokens from one address are 401 until the address has used its failures, then 429 with
  Retry-After before any lookup; a valid token from that address is still served; the log holds a line or two.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import free_port
from heteroflow.platform.auth import generate_token, parse_scopes
from heteroflow.platform.nodes import NODE_CREDENTIAL_HEADER
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.token_store import SqlTokenStore
from tests.security.services import auth
from tests.security.test_processes import Running, start, wait_until_up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

_SETTINGS_PREFIXES = ("HETEROFLOW_", "GPU_HEALTH_", "GPU_METRICS_", "GPU_MEMORY_HIGH_", "GPU_WEAK_")
GATE = 16
"""The heartbeat gate of the server under attack; a tenant's share is half of it, a token's half of that."""
TENANT_SHARE, TOKEN_SHARE = GATE // 2, GATE // 4
PER_NODE = 2
NEW_CARDS = 4
FAILURES = 20
"""401s one address may cause per minute on the server under attack (the default)."""
"""Card swaps a node may report per hour on the server under attack."""
STAT = {"index": 0, "uuid": "GPU-fair-0", "ecc_corrected_total": 0}


@dataclass
class Cluster:
    server: Running
    admin: str
    tokens: dict[str, str]
    """Agent tokens: ``a1`` and ``a2`` of tenant A, ``b`` of tenant B, ``none`` of no tenant."""
    database: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("fair")
    database_url = f"sqlite:///{folder / 'platform.db'}"
    engine = create_db_engine(database_url)
    upgrade_database(engine)
    store = SqlTokenStore(engine)
    now = SystemClock().now()
    admin = store.create_token(name="ops", scopes=parse_scopes("admin"), tenant_id=None, now=now)[1]
    team_a = store.ensure_tenant("team-a", now=now)[0]
    team_b = store.ensure_tenant("team-b", now=now)[0]
    agent = parse_scopes("agent")
    tokens = {
        "a1": store.create_token(name="a1", scopes=agent, tenant_id=team_a, now=now)[1],
        "a2": store.create_token(name="a2", scopes=agent, tenant_id=team_a, now=now)[1],
        "b": store.create_token(name="b", scopes=agent, tenant_id=team_b, now=now)[1],
        "none": store.create_token(name="fleet", scopes=agent, tenant_id=None, now=now)[1],
    }
    engine.dispose()
    port = free_port()
    database = folder / "platform.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SETTINGS_PREFIXES)}
    env |= {
        "PYTHONUNBUFFERED": "1",
        "HETEROFLOW_SERVER_MAX_IN_FLIGHT_HEARTBEATS": str(GATE),
        "HETEROFLOW_SERVER_MAX_IN_FLIGHT_PER_NODE": str(PER_NODE),
        "HETEROFLOW_MAX_NEW_CARDS_PER_NODE_HOUR": str(NEW_CARDS),
        "HETEROFLOW_SERVER_MAX_FAILED_CREDENTIALS": str(FAILURES),
    }
    server = start(
        "server", ["server", "--port", str(port), "--database-url", database_url], env=env, folder=folder, port=port
    )
    try:
        wait_until_up(server, "/healthz", auth(admin))
        yield Cluster(server=server, admin=admin, tokens=tokens, database=database)
    finally:
        server.stop()


def register(cluster: Cluster, token: str, hostname: str, *, gpu_count: int = 1) -> tuple[str, str]:
    """A new node of ``token``'s: its id and its own credential."""
    answer = httpx.post(
        f"{cluster.server.url}/api/v1/nodes/register",
        json={"hostname": hostname, "vendor": "nvidia", "model": "H100", "gpu_count": gpu_count},
        headers=auth(token),
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body["node_id"], body["node_credential"]


def slow_beat(cluster: Cluster, token: str, node: tuple[str, str], source: str) -> socket.socket:
    """A heartbeat that declares a 100,000-byte body and sends none of it, from ``source`` (127.0.0.x)."""
    sock = socket.create_connection(("127.0.0.1", cluster.server.port), timeout=5, source_address=(source, 0))
    head = (
        f"POST /api/v1/nodes/{node[0]}/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\n{NODE_CREDENTIAL_HEADER}: {node[1]}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


def admission(cluster: Cluster) -> dict[str, Any]:
    answer = httpx.get(f"{cluster.server.url}/api/v1/server/status", headers=auth(cluster.admin), timeout=5)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()["heartbeat_admission"]
    return found


def test_a_tenant_holding_slow_beats_fills_only_its_share_and_the_others_beat_in_time(cluster: Cluster) -> None:
    victims = {name: register(cluster, cluster.tokens[name], f"victim-{name}") for name in ("b", "none")}
    attackers = [
        (cluster.tokens[name], register(cluster, cluster.tokens[name], f"attacker-{name}-{n}"))
        for name in ("a1", "a2")
        for n in range(GATE // PER_NODE)
    ]
    held: list[socket.socket] = []
    try:
        # every node opens its per-node limit of slow beats, over three source addresses: twice the whole gate
        for number, (token, node) in enumerate(attackers):
            held += [slow_beat(cluster, token, node, f"127.0.0.{2 + (number + k) % 3}") for k in range(PER_NODE)]
        deadline = time.monotonic() + 10
        while (status := admission(cluster))["in_flight"] < TENANT_SHARE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status["in_flight"] == TENANT_SHARE, status  # tenant A holds its share, not the gate
        assert status["busiest_tenants"][0][1] == TENANT_SHARE
        assert (status["max_per_tenant"], status["max_per_token"]) == (TENANT_SHARE, TOKEN_SHARE)
        assert status["refused_tenant_share_total"] + status["refused_token_share_total"] > 0
        with httpx.Client(base_url=cluster.server.url, timeout=2.0) as client:
            for _ in range(5):  # throughout the attack (its sockets stay open, inside the body read time)
                for name, (node_id, credential) in victims.items():
                    started = time.monotonic()
                    answer = client.post(
                        f"/api/v1/nodes/{node_id}/heartbeat",
                        json={"gpu_stats": [STAT]},
                        headers={**auth(cluster.tokens[name]), NODE_CREDENTIAL_HEADER: credential},
                    )
                    assert answer.status_code == 200, (name, answer.status_code, answer.text)
                    assert time.monotonic() - started < 2.0
                time.sleep(0.2)
        assert admission(cluster)["in_flight"] == TENANT_SHARE  # the attack was still holding its share
        metrics = httpx.get(f"{cluster.server.url}/metrics", headers=auth(cluster.admin), timeout=10).text
        assert f"heteroflow_heartbeat_admission_max_per_tenant {float(TENANT_SHARE)}" in metrics
        assert 'heteroflow_heartbeats_refused_total{reason="tenant_share"}' in metrics
    finally:
        for sock in held:
            sock.close()


def _rows(database: Path, table: str, node_id: str) -> int:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table} WHERE node_id = ?", (node_id,)).fetchone()[0])


def test_invented_cards_and_xid_storms_stop_at_their_bounds(cluster: Cluster) -> None:
    token = cluster.tokens["a1"]
    nodes = [register(cluster, token, f"inventor-{n}") for n in range(4)]
    started = SystemClock().now()
    with httpx.Client(base_url=cluster.server.url, timeout=10) as client:
        for beat in range(16):
            for node_id, credential in nodes:
                # 256 cards a beat, each beat at fresh indexes and with fresh uuids: 16,384 cards per node claimed
                stats = [
                    {"index": (beat * 256 + n) % 4096, "uuid": f"GPU-{beat}-{n}", "ecc_corrected_total": 0}
                    for n in range(256)
                ]
                stats[0] = {"index": 0, "uuid": f"GPU-{node_id[:8]}-{beat}", "ecc_corrected_total": 0}
                xids = [  # half on its card, half on a card it does not have; each a distinct event
                    {
                        "index": n % 2,
                        "uuid": stats[0]["uuid"],
                        "xid": 13,
                        "occurred_at": (started - timedelta(seconds=beat * 1000 + n)).isoformat(),
                    }
                    for n in range(1000)
                ]
                answer = client.post(
                    f"/api/v1/nodes/{node_id}/heartbeat",
                    json={"gpu_stats": stats, "xid_events": xids},
                    headers={**auth(token), NODE_CREDENTIAL_HEADER: credential},
                )
                assert answer.status_code == 200, answer.text  # a refused card never costs the beat
        metrics = client.get("/metrics", headers=auth(cluster.admin)).text
        shown = [client.get(f"/api/v1/nodes/{node_id}", headers=auth(cluster.admin)).json() for node_id, _ in nodes]
        alerts = client.get("/api/v1/alerts", headers=auth(cluster.admin), params={"status": "open"}).json()
    for node in shown:
        cards = node["cards"]
        assert cards["known_cards"] == 1
        assert cards["refused_index_total"] == 16 * 255  # every card beyond index 0, one by one
        assert cards["new_cards_this_hour"] == NEW_CARDS  # the uuid at index 0 swapped 15 times
        assert cards["refused_new_card_total"] == 15 - NEW_CARDS
        assert cards["xid_events_this_hour"] == cards["xid_events_per_hour"] == 1000
        assert cards["refused_xid_total"] == 16 * 1000 - 1000
        series = {  # the per-GPU series (the fleet's per-node series carry no gpu label)
            line.split("}", 1)[0]
            for line in metrics.splitlines()
            if f'node="{node["name"]}"' in line and 'gpu="' in line
        }
        assert series
        assert {label.split('gpu="')[1].split('"')[0] for label in series} == {"0"}  # only its registered card
    deadline = time.monotonic() + 20  # the health writer stores in the background: wait for the first card's rows
    while _rows(cluster.database, "gpu_health_samples", nodes[0][0]) == 0:
        assert time.monotonic() < deadline, "the registered card's readings were never stored"
        time.sleep(0.1)
    for node_id, _ in nodes:
        assert _rows(cluster.database, "gpu_health_samples", node_id) <= 1 + NEW_CARDS  # its card, and its swaps
        assert _rows(cluster.database, "gpu_xid_events", node_id) == 1000  # stored before the answer
    raised = {alert["node_id"] for alert in alerts["items"] if alert["type"] == "NODE_CARDS_REFUSED"}
    assert raised == {node_id for node_id, _ in nodes}


def test_guessing_tokens_is_answered_429_after_the_failures_and_costs_no_lookups(cluster: Cluster) -> None:
    guesser = httpx.Client(
        base_url=cluster.server.url, timeout=10, transport=httpx.HTTPTransport(local_address="127.0.0.5")
    )
    with guesser:
        answers = [guesser.get("/api/v1/nodes", headers=auth(generate_token())).status_code for _ in range(FAILURES)]
        assert answers == [401] * FAILURES
        before = admission_status(cluster)["failed_credentials"]
        statements = _statements(cluster)
        blocked = [guesser.get("/api/v1/nodes", headers=auth(generate_token())) for _ in range(200)]
        blocked += [
            guesser.post(f"/api/v1/nodes/{generate_token()[:8]}/heartbeat", json={}, headers=auth(generate_token()))
            for _ in range(50)
        ]
        assert {answer.status_code for answer in blocked} == {429}
        assert all(1 <= int(answer.headers["retry-after"]) <= 60 for answer in blocked)
        assert _statements(cluster) - statements < 20  # no lookup per guess (the background flushes only)
        # a token this server holds as valid is never refused for the address it shares with the guesser
        assert guesser.get("/api/v1/nodes", headers=auth(cluster.admin)).status_code == 200
    after = admission_status(cluster)["failed_credentials"]
    assert after["refused_total"] - before["refused_total"] == 250
    assert after["blocked_keys"] >= 1
    log = cluster.server.output.read_text(errors="replace")
    lines = [line for line in log.splitlines() if "auth.refused" in line or "auth.blocked" in line]
    assert 1 <= len(lines) <= 3, lines  # a line or two, never one per guess


def admission_status(cluster: Cluster) -> dict[str, Any]:
    answer = httpx.get(f"{cluster.server.url}/api/v1/server/status", headers=auth(cluster.admin), timeout=5)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def _statements(cluster: Cluster) -> float:
    metrics = httpx.get(f"{cluster.server.url}/metrics", headers=auth(cluster.admin), timeout=10).text
    (line,) = [line for line in metrics.splitlines() if line.startswith("heteroflow_db_statements_total ")]
    return float(line.split()[1])
