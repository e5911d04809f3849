"""``heteroflow server --workers 2`` on PostgreSQL: two worker processes on one port, as one server.

Checked on the real command: new connections reach both workers; every scrape of /metrics, whichever worker
answers it, counts every heartbeat the host accepted, reports a card both workers heard once (its ECC total as
the card reported it, not doubled) and passes ``promtool check metrics``; a worker killed with
SIGKILL is replaced by the supervisor while the other keeps answering; and several workers on SQLite are refused
with a clear message before anything starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from heteroflow.agent.client import NODE_CREDENTIAL_HEADER, HttpPlatformClient, Registration
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.testing import PostgresServer
from tests.integration.test_two_servers import CARDS, beat_body, create_token, settled
from tests.support.monitoring import promtool
from tests.support.polling import until

pytestmark = [pytest.mark.postgres, pytest.mark.e2e, pytest.mark.timeout(180)]

BEATS = 60
CORRECTED = 7
_SETTINGS_PREFIXES = ("HETEROFLOW_", "GPU_")


@dataclass
class Host:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    admin: str
    database_url: str
    last_scrape: bytes = b""

    def fresh(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request on a new connection (the kernel hands each new connection to one worker)."""
        headers = {"Authorization": f"Bearer {self.admin}", "Connection": "close"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=10, verify=client_tls()) as client:
            return client.request(method, path, **kwargs)

    def status(self) -> dict[str, Any]:
        response = self.fresh("GET", "/api/v1/server/status")
        assert response.status_code == 200, response.text
        status: dict[str, Any] = response.json()
        return status

    def statuses_by_worker(self, tries: int = 60) -> dict[int, dict[str, Any]]:
        """Each worker's status as seen over new connections (up to ``tries`` of them)."""
        seen: dict[int, dict[str, Any]] = {}
        for _ in range(tries):
            status = self.status()
            seen[status["worker"]["pid"]] = status
            if len(seen) == 2:
                break
        return seen

    def scrape(self) -> dict[str, float]:
        response = self.fresh("GET", "/metrics")
        assert response.status_code == 200, response.text
        self.last_scrape = response.content
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
            if not sample.labels
        }

    def card_values(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The last scrape's per-GPU samples, by name and sorted labels."""
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(self.last_scrape.decode())
            for sample in family.samples
            if family.name.startswith("heteroflow_gpu_")
        }


@contextmanager
def workers_process(database_url: str, log: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(_SETTINGS_PREFIXES)}
    env |= {"HETEROFLOW_DATABASE_URL": database_url, "HETEROFLOW_LIVENESS_FLUSH_SECONDS": "0.5"}
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "heteroflow", "server", "--port", str(port), "--workers", "2"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # the supervisor stops its workers
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@pytest.fixture(scope="module")
def host(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    if not pg_server.running:
        pg_server.start()  # a previous test stopped it on purpose
    database_url = pg_server.create_database()
    engine = create_db_engine(database_url)
    upgrade_database(engine)
    admin = create_token(engine, "admin")
    engine.dispose()
    log = tmp_path_factory.mktemp("workers") / "server.log"
    port = free_port()
    with workers_process(database_url, log, port) as process:
        host = Host(f"http://127.0.0.1:{port}", process, log, admin, database_url)

        def answering() -> bool:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                return len(host.statuses_by_worker(tries=20)) == 2
            except httpx.TransportError:
                return False

        until(answering, within=90, what="both workers answering")
        yield host


def test_every_scrape_counts_every_worker_beats(host: Host) -> None:
    engine = create_db_engine(host.database_url)
    agent_token = create_token(engine, "agent")
    engine.dispose()
    registration = Registration(hostname="gpu-w", vendor="nvidia", model="H100", gpu_count=CARDS, source="real")
    agent = HttpPlatformClient(base_url=host.url, token=agent_token)
    try:
        registered = agent.register(registration)
    finally:
        agent.close()
    node_id, credential = registered.node_id, registered.node_credential
    assert credential is not None
    before = host.scrape().get("heteroflow_heartbeats_total", 0.0)
    for _ in range(BEATS):  # each on a new connection, so over both workers
        response = httpx.post(
            f"{host.url}/api/v1/nodes/{node_id}/heartbeat",
            json=beat_body(0, corrected=CORRECTED),  # card 3 reports CORRECTED, the others 0
            headers={
                "Authorization": f"Bearer {agent_token}",
                NODE_CREDENTIAL_HEADER: credential,
                "Connection": "close",
            },
            timeout=10,
            verify=client_tls(),
        )
        assert response.status_code == 200, response.text
    statuses = host.statuses_by_worker()
    assert len(statuses) == 2
    until(lambda: all(settled(s) for s in host.statuses_by_worker().values()), within=20, what="both writers")
    offered = {pid: s["health_ingest"]["offered_total"] for pid, s in host.statuses_by_worker().items()}
    assert len(offered) == 2
    assert all(count > 0 for count in offered.values()), offered  # both workers took beats

    card = ("heteroflow_gpu_ecc_corrected_total", (("gpu", "3"), ("node", "gpu-w"), ("uuid", "GPU-0-3")))
    for _ in range(6):  # whichever worker answers the scrape
        scraped = host.scrape()
        assert scraped["heteroflow_server_workers"] == 2
        assert scraped["heteroflow_heartbeats_total"] - before == BEATS
        # both workers hold the card: the host reports it once, with what it reported, never the two summed
        assert host.card_values()[card] == CORRECTED
    checked = promtool("check", "metrics", stdin=host.last_scrape)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_killed_worker_is_replaced_while_the_other_answers(host: Host) -> None:
    pids = set(host.statuses_by_worker())
    assert len(pids) == 2
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    answered = 0

    def replaced() -> bool:
        nonlocal answered
        response = host.fresh("GET", "/api/v1/server/status")  # never refused: the survivor holds the socket
        assert response.status_code == 200, response.text
        answered += 1
        now = set(host.statuses_by_worker())
        return victim not in now and len(now) == 2

    until(replaced, within=60, what="the supervisor's replacement worker")
    assert answered > 0
    assert host.scrape()["heteroflow_server_workers"] == 2
    assert host.process.poll() is None


def test_several_workers_on_sqlite_are_refused_before_anything_starts(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith(_SETTINGS_PREFIXES)}
    env["HETEROFLOW_DATABASE_URL"] = f"sqlite:///{tmp_path / 'one-writer.db'}"
    result = subprocess.run(
        [sys.executable, "-m", "heteroflow", "server", "--port", str(free_port()), "--workers", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--workers 2 needs PostgreSQL" in result.stderr
    assert not (tmp_path / "one-writer.db").exists()
