"""Two ``heteroflow server`` processes on one PostgreSQL behind a round-robin load balancer.

The scale-out promise, checked on real processes: heartbeats alternate between the servers; each server's
own dedup cache costs at most one extra row per unchanged card (H-23); both servers answer the same node
liveness once they have flushed it; exactly one runs the prediction worker (H-35), and when it is killed the
other takes the lease within the lease time while heartbeats keep succeeding through the balancer.

The cluster is started once for the module and the heartbeat phase runs in its fixture; the tests then read
what it left. The takeover test kills a server, so it comes last (pytest keeps the file's order).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.agent.client import HttpPlatformClient, Registration
from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.agent.readings import GpuHealth, HealthCollection
from heteroflow.core.clock import SystemClock
from heteroflow.core.ids import NodeId
from heteroflow.core.testing import free_port
from heteroflow.health.counters import Counters
from heteroflow.http.tls import client_tls
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform_server.prediction_worker import LEASE_NAME
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.schema import gpu_health_samples, leases
from heteroflow.storage.testing import PostgresServer
from heteroflow.storage.token_store import SqlTokenStore
from tests.support.polling import until
from tests.support.round_robin import RoundRobinProxy

pytestmark = [pytest.mark.postgres, pytest.mark.e2e, pytest.mark.timeout(90)]

LEASE_SEC = 6.0
"""The worker's lease; every third of it the worker takes or renews it, then ticks if it is due. The lease is not
renewed while a tick runs, so it must outlast a round plus a tick on a busy host (a tick takes about 0.5 s here)."""
TICK_MINUTES = 0.02
"""1.2 s: shorter than a lease round, so the leader ticks on every round."""
TAKEOVER_SLACK_SEC = 1.5
"""Beyond the lease and one retry round: the survivor's lease statement and this test's polling, on a busy host."""
FLUSH_SEC = 0.5
KEEPALIVE_SEC = 3600.0
"""Longer than the test: one server alone writes exactly one row per unchanged card (its first)."""
NODES = 3
"""Odd, so that each round of beats over all nodes sends every node's next beat to the other server."""
CARDS = 8
ROUNDS = 20
CHANGED = (0, 3)
"""(node number, card index) whose corrected-ECC counter steps from 0 to 5 after the steady rounds."""
_SETTINGS_PREFIXES = ("HETEROFLOW_", "GPU_")


@dataclass
class Backend:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, token: str) -> Any:
        response = httpx.get(
            f"{self.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10, verify=client_tls()
        )
        assert response.status_code == 200, response.text
        return response.json()

    def status(self, token: str) -> dict[str, Any]:
        status: dict[str, Any] = self.get("/api/v1/server/status", token)
        return status

    def started(self, token: str) -> bool:
        """The server answers, or its process has exited (and will never answer)."""
        if self.process.poll() is not None:
            return True
        try:
            return (
                httpx.get(
                    f"{self.url}/healthz", headers={"Authorization": f"Bearer {token}"}, verify=client_tls()
                ).status_code
                == 200
            )
        except httpx.TransportError:
            return False


@contextmanager
def server_process(database_url: str, log: Path) -> Iterator[Backend]:
    """A ``heteroflow server`` process with short intervals; killed at the end if still running."""
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith(_SETTINGS_PREFIXES)}
    env |= {
        "HETEROFLOW_DATABASE_URL": database_url,
        "HETEROFLOW_LIVENESS_FLUSH_SECONDS": str(FLUSH_SEC),
        "HETEROFLOW_GPU_HEALTH_KEEPALIVE_SECONDS": str(KEEPALIVE_SEC),
        "HETEROFLOW_GPU_FAULT_PREDICT_ENABLED": "true",
        "HETEROFLOW_GPU_FAULT_PREDICT_LEASE_SECONDS": str(LEASE_SEC),
        "HETEROFLOW_GPU_FAULT_PREDICT_TICK_MINUTES": str(TICK_MINUTES),
    }
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "heteroflow", "server", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        yield Backend(f"http://127.0.0.1:{port}", process, log)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def create_token(engine: Engine, scopes: str) -> str:
    store = SqlTokenStore(engine)
    now = SystemClock().now()
    return store.create_token(name="two-servers", scopes=parse_scopes(scopes), tenant_id=None, now=now)[1]


def beat_body(node: int, *, corrected: int) -> dict[str, Any]:
    """What an agent sends: the node's eight cards, collected now; only the changed card's counter moves."""
    gpus = tuple(
        GpuHealth(
            index=index,
            vendor="NVIDIA",
            uuid=f"GPU-{node}-{index}",
            counters=Counters(
                ecc_uncorrected_total=0,
                ecc_corrected_total=corrected if (node, index) == CHANGED else 0,
                retired_pages=0,
                remapped_rows_pending=0,
                remapped_rows_failure=0,
            ),
        )
        for index in range(CARDS)
    )
    health = HealthCollection(collector="nvml", collected_at=datetime.now(UTC), gpus=gpus)
    return heartbeat_body(health=health, telemetry=None, xid_events=())


def settled(status: dict[str, Any]) -> bool:
    """Every reading the server was offered has been decided: skipped, written or dropped."""
    ingest = status["health_ingest"]
    decided = (
        ingest["skipped_dedup_total"]
        + ingest["skipped_all_unknown_total"]
        + ingest["skipped_unchanged_total"]
        + ingest["written_total"]
        + ingest["dropped_total"]
    )
    return bool(ingest["offered_total"] == decided and ingest["pending_readings"] == 0)


def rows_by_card(engine: Engine) -> dict[tuple[str, int], list[int | None]]:
    """Each card's stored corrected-ECC values, oldest first."""
    samples = gpu_health_samples.c
    query = sa.select(samples.node_id, samples.gpu_index, samples.ecc_corrected_total).order_by(
        samples.sampled_at, samples.id
    )
    rows: dict[tuple[str, int], list[int | None]] = {}
    with engine.connect() as conn:
        for node_id, index, corrected in conn.execute(query):
            rows.setdefault((node_id, index), []).append(corrected)
    return rows


def lease_holder(engine: Engine) -> str | None:
    with engine.connect() as conn:
        holder: str | None = conn.scalar(sa.select(leases.c.holder).where(leases.c.name == LEASE_NAME))
    return holder


@dataclass
class Cluster:
    backends: list[Backend]
    proxy: RoundRobinProxy
    agent: HttpPlatformClient
    engine: Engine
    admin: str
    nodes: list[NodeId]
    solo: NodeId
    """A node that beat once, so through one server only."""

    def logs(self) -> str:
        return "\n".join(f"--- {b.log.name}\n{b.log.read_text()[-3000:]}" for b in self.backends)

    def beat_round(self, *, corrected: int) -> None:
        for n, node_id in enumerate(self.nodes):
            self.agent.heartbeat(node_id, beat_body(n, corrected=corrected))  # raises unless answered 200


@pytest.fixture(scope="module")
def cluster(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two servers and the balancer, after the heartbeat phase; every server has written what it was offered."""
    if not pg_server.running:
        pg_server.start()  # a previous test stopped it on purpose
    database_url = pg_server.create_database()
    engine = create_db_engine(database_url)
    upgrade_database(engine)
    agent_token = create_token(engine, "agent")
    admin = create_token(engine, "admin")
    logs = tmp_path_factory.mktemp("servers")
    with ExitStack() as stack:
        stack.callback(engine.dispose)
        backends = [stack.enter_context(server_process(database_url, logs / f"server-{i}.log")) for i in (0, 1)]
        for backend in backends:
            until(partial(backend.started, admin), within=60, what="start")
            assert backend.process.poll() is None, backend.log.read_text()
        proxy = stack.enter_context(RoundRobinProxy([b.url for b in backends], port=free_port()).running())
        agent = HttpPlatformClient(base_url=proxy.url, token=agent_token)
        stack.callback(agent.close)

        registration = Registration(hostname="", vendor="nvidia", model="H100", gpu_count=CARDS, source="real")
        nodes = [agent.register(replace(registration, hostname=f"gpu-{n}")).node_id for n in range(NODES)]
        cluster = Cluster(backends, proxy, agent, engine, admin, nodes, solo=NodeId(""))
        # as fast as the servers answer: a card's first beats reach both servers milliseconds apart, the race
        # in which both may write a first row
        for _ in range(ROUNDS):
            cluster.beat_round(corrected=0)
        # one card changes; its next beat, on the other server, comes after the change is stored (as an
        # agent's beats do, 5 s apart)
        changed_node = nodes[CHANGED[0]]
        agent.heartbeat(changed_node, beat_body(CHANGED[0], corrected=5))
        until(lambda: 5 in rows_by_card(engine).get((changed_node, CHANGED[1]), []), within=10, what="change")
        for _ in range(ROUNDS // 2):
            cluster.beat_round(corrected=5)
        cluster.solo = agent.register(replace(registration, hostname="gpu-solo")).node_id
        agent.heartbeat(cluster.solo, beat_body(NODES, corrected=0))
        until(lambda: all(settled(b.status(admin)) for b in backends), within=20, what="the writers")
        yield cluster


def test_heartbeats_alternate_between_the_servers(cluster: Cluster) -> None:
    log = cluster.proxy.log  # registrations and heartbeats, one request at a time
    assert all(f.status == 200 for f in log)
    assert [f.backend for f in log] == [(log[0].backend + i) % 2 for i in range(len(log))]  # strictly alternating
    beats = [f for f in log if f.path.endswith("/heartbeat")]
    per_backend = Counter(f.backend for f in beats)
    assert abs(per_backend[0] - per_backend[1]) <= len(log) - len(beats), per_backend  # registrations shift it
    for node_id in cluster.nodes:
        assert {f.backend for f in beats if node_id in f.path} == {0, 1}, f"{node_id}'s beats reached one server"


def test_each_unchanged_card_costs_at_most_one_extra_row(cluster: Cluster) -> None:
    rows = rows_by_card(cluster.engine)
    changed = (cluster.nodes[CHANGED[0]], CHANGED[1])
    steady = {card: values for card, values in rows.items() if card != changed}
    assert len(steady) == (NODES + 1) * CARDS - 1  # every card has its rows, the solo node's too
    # one server alone writes each card's first row and nothing more (the keepalive is longer than the test);
    # two servers may both write a first row, each before its cache holds the other's
    assert all(values == [0] * len(values) for values in steady.values())
    assert Counter(len(values) for values in steady.values()).keys() <= {1, 2}
    assert len(steady[(cluster.solo, 0)]) == 1  # beaten once: one row
    assert 1 <= rows[changed].count(0) <= 2


def test_a_change_is_recorded_once(cluster: Cluster) -> None:
    rows = rows_by_card(cluster.engine)
    assert rows[(cluster.nodes[CHANGED[0]], CHANGED[1])].count(5) == 1


def test_both_servers_answer_the_same_liveness(cluster: Cluster) -> None:
    until(
        lambda: all(b.status(cluster.admin)["liveness"]["unflushed_nodes"] == 0 for b in cluster.backends),
        within=10,
        what="both servers' liveness flushes",
    )
    views = [
        {
            node["id"]: (node["online"], node["last_heartbeat"])
            for node in b.get("/api/v1/nodes", cluster.admin)["items"]
        }
        for b in cluster.backends
    ]
    assert views[0] == views[1]  # the same newest heartbeat, read from the database by each
    assert set(views[0]) == {*cluster.nodes, cluster.solo}
    assert all(online for online, _ in views[0].values())


def test_one_server_runs_the_worker_and_the_other_takes_over_when_it_dies(cluster: Cluster) -> None:
    def workers() -> list[dict[str, Any]]:
        return [b.status(cluster.admin)["prediction_worker"] for b in cluster.backends]

    until(lambda: any(w["leader"] and w["ticks_total"] >= 2 for w in workers()), within=10, what="ticks")
    now = workers()
    leader = next(i for i, w in enumerate(now) if w["leader"])
    follower = 1 - leader
    assert not now[follower]["leader"]
    assert now[follower]["ticks_total"] == 0
    assert lease_holder(cluster.engine) == now[leader]["holder"]

    served_before = cluster.proxy.counts()
    cluster.backends[leader].process.send_signal(signal.SIGKILL)  # no release: the lease must expire
    killed_at = time.monotonic()
    cluster.backends[leader].process.wait(10)

    def survivor() -> dict[str, Any]:
        worker: dict[str, Any] = cluster.backends[follower].status(cluster.admin)["prediction_worker"]
        return worker

    while True:
        cluster.beat_round(corrected=5)  # the balancer skips the dead server; every beat must succeed
        if survivor()["leader"]:
            break
        assert time.monotonic() - killed_at < 3 * LEASE_SEC, f"no takeover: {survivor()}\n{cluster.logs()}"
        time.sleep(0.1)
    takeover = time.monotonic() - killed_at
    # the lease expires at most one TTL after its last renewal; the survivor tries every third of it
    assert takeover <= LEASE_SEC + LEASE_SEC / 3 + TAKEOVER_SLACK_SEC, takeover
    until(lambda: survivor()["ticks_total"] >= 1, within=10, what="the new leader's first tick")
    worker = survivor()
    assert lease_holder(cluster.engine) == worker["holder"]
    served_after = cluster.proxy.counts()
    assert served_after[leader] == served_before[leader]
    assert served_after[follower] - served_before[follower] >= NODES
    assert leader in cluster.proxy.refused
