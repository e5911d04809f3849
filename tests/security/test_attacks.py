"""Attacks on a real platform server process, with a real agent process beating through them.

Each test replays one attack with the bounded loops CI allows: the slow-body flood
(anonymous sockets trickling a heartbeat body), the megabyte flood (anonymous 1 MiB bodies of small containers),
a huge request head. Throughout each flood the test beats for a node of its own through the agent's real client
and measures every answer: all 200, each in bounded time; the real agent's node stays online.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from heteroflow.agent.client import HttpPlatformClient, Registration
from heteroflow.core.clock import SystemClock
from heteroflow.core.ids import NodeId
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.platform.auth import parse_scopes
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.token_store import SqlTokenStore
from tests.security.services import auth
from tests.security.test_processes import Running, start, wait_until_up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

_SETTINGS_PREFIXES = ("HETEROFLOW_", "GPU_HEALTH_", "GPU_METRICS_", "GPU_MEMORY_HIGH_", "GPU_WEAK_")
BEAT_DEADLINE_SEC = 2.0
"""The slowest answer a probe heartbeat may get under a flood (the agent's interval in these tests is 0.5 s)."""


@dataclass
class Platform:
    server: Running
    agent: Running
    admin: str
    agent_token: str
    folder: Path

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.server.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def node_online(self, name: str) -> bool:
        answer = httpx.get(
            f"{self.server.url}/api/v1/nodes", headers=auth(self.admin), timeout=10, verify=client_tls()
        ).json()
        return any(node["name"] == name and node["online"] for node in answer["items"])


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    folder = tmp_path_factory.mktemp("attacks")
    database_url = f"sqlite:///{folder / 'platform.db'}"
    engine = create_db_engine(database_url)
    upgrade_database(engine)
    store = SqlTokenStore(engine)
    now = SystemClock().now()
    admin = store.create_token(name="ops", scopes=parse_scopes("admin"), tenant_id=None, now=now)[1]
    agent_token = store.create_token(name="fleet", scopes=parse_scopes("agent"), tenant_id=None, now=now)[1]
    engine.dispose()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SETTINGS_PREFIXES)}
    env |= {"PYTHONUNBUFFERED": "1", "HETEROFLOW_OFFLINE_AFTER_SECONDS": "3"}
    server = start(
        "server", ["server", "--port", str(port), "--database-url", database_url], env=env, folder=folder, port=port
    )
    agent: Running | None = None
    try:
        wait_until_up(server, "/healthz", auth(admin))
        agent = start(
            "agent",
            [
                "agent",
                "run",
                "--server",
                server.url,
                "--node-name",
                "real-agent",
                "--simulate",
                "2",
                "--heartbeat-interval",
                "0.5",
            ],
            env=env | {"HETEROFLOW_AGENT_TOKEN": agent_token, "HETEROFLOW_AGENT_STATE_DIR": str(folder / "agent")},
            folder=folder,
            port=0,
        )
        platform = Platform(server=server, agent=agent, admin=admin, agent_token=agent_token, folder=folder)
        deadline = time.monotonic() + 45
        while not platform.node_online("real-agent"):
            assert agent.process.poll() is None, agent.stop()[-3000:]
            assert time.monotonic() < deadline, "the real agent's node never came online"
            time.sleep(0.2)
        yield platform
    finally:
        if agent is not None:
            agent.stop()
        server.stop()


@dataclass
class Probe:
    """Heartbeats of a node of the test's own, through the agent's real client, every ``interval_sec``."""

    platform: Platform
    hostname: str
    interval_sec: float = 0.5
    answers: list[tuple[str, float]] = field(default_factory=list)
    """(outcome, seconds) per beat: ``ok`` or the error's text."""
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = HttpPlatformClient(base_url=self.platform.server.url, token=self.platform.agent_token, timeout_sec=10)
        try:
            node_id: NodeId = client.register(
                Registration(hostname=self.hostname, vendor="nvidia", model="sim", gpu_count=0, source="simulated")
            ).node_id
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    client.heartbeat(node_id, {"gpu_stats": []})
                    outcome = "ok"
                except Exception as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                self.answers.append((outcome, time.monotonic() - started))
                self._stop.wait(self.interval_sec)
        finally:
            client.close()

    @contextlib.contextmanager
    def running(self) -> Iterator[Probe]:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(15)

    def assert_all_ok(self, *, at_least: int) -> None:
        failed = [answer for answer in self.answers if answer[0] != "ok"]
        assert not failed, f"{len(failed)} of {len(self.answers)} beats failed: {failed[:3]}"
        assert len(self.answers) >= at_least, self.answers
        slowest = max(seconds for _, seconds in self.answers)
        assert slowest < BEAT_DEADLINE_SEC, f"the slowest beat took {slowest:.2f} s"


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """What the server sent before closing (or in 10 s), the status line first."""
    chunks = []
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_slow_body_flood_of_anonymous_sockets_leaves_real_heartbeats_at_200(platform: Platform) -> None:
    """256 sockets declaring a 100 kB heartbeat and sending it a byte at a time took every admission
    slot. Now each is refused 401 on its head, before a slot or a body read, and the connection is closed."""
    port = platform.server.port
    head = (
        b"POST /api/v1/nodes/00000000-0000-4000-8000-000000000000/heartbeat HTTP/1.1\r\n"
        b"Host: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    )
    sockets = []
    with Probe(platform, "probe-slow-body").running() as probe:
        for _ in range(256):
            sock = _connect(port)
            sock.sendall(head)
            sockets.append(sock)
        deadline = time.monotonic() + 6
        refused = 0
        for sock in sockets:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            answer = _answer(sock)
            refused += answer.startswith(b"HTTP/1.1 401")
            sock.close()
        time.sleep(2)  # a few more probe beats after the flood
    assert refused == 256, f"only {refused} of 256 slow anonymous bodies were refused at once"
    probe.assert_all_ok(at_least=4)
    assert platform.node_online("real-agent")


def test_a_slow_body_flood_with_a_valid_agent_token_leaves_real_heartbeats_at_200(platform: Platform) -> None:
    """256 slow heartbeats with one valid agent token (and a node of its own, its credential in hand) still filled
    the heartbeat gate for up to 10 s each. Now one node holds at most 4 beats in flight (429 + Retry-After for the
    rest, at once, unread), and a beat for another node without its credential, or for no node, is 404 on its head:
    the real agent's beats (another node, its own credential) stay 200 and its node online."""
    url, fleet = platform.server.url, platform.agent_token
    own = httpx.post(
        f"{url}/api/v1/nodes/register",
        json={"hostname": "attacker-slow", "vendor": "x", "gpu_count": 0},
        headers=auth(fleet),
        timeout=10,
        verify=client_tls(),
    ).json()
    nodes = httpx.get(f"{url}/api/v1/nodes", headers=auth(platform.admin), timeout=10, verify=client_tls()).json()[
        "items"
    ]
    real = next(node for node in nodes if node["name"] == "real-agent")

    def head(node_id: str, credential: str | None) -> bytes:
        extra = b"X-HeteroFlow-Node-Credential: %s\r\n" % credential.encode() if credential else b""
        return (
            b"POST /api/v1/nodes/%s/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer %s\r\n%sContent-Length: 100000\r\n\r\n{"
        ) % (node_id.encode(), fleet.encode(), extra)

    floods = {
        "own": [head(own["node_id"], own["node_credential"])] * 256,
        "victim": [head(real["id"], None)] * 32,
        "missing": [head(f"00000000-0000-4000-8000-{n:012d}", None) for n in range(32)],
    }
    answers: dict[str, list[bytes]] = {}
    held: list[socket.socket] = []
    started = time.monotonic()
    with Probe(platform, "probe-token-flood").running() as probe:
        for kind, heads in floods.items():
            sockets = []
            for raw in heads:
                sock = _connect(platform.server.port)
                sock.sendall(raw)
                sockets.append(sock)
            answers[kind] = []
            for sock in sockets:
                sock.settimeout(1.0)  # a refusal comes at once; a held body gets nothing until the read limit
                answer = _answer(sock)
                answers[kind].append(answer)
                (held if not answer else []).append(sock)
                if answer:
                    sock.close()
        flooded_sec = time.monotonic() - started
        deadline = time.monotonic() + 3
        while len(probe.answers) < 6 + 2 * flooded_sec:  # the probe beats on while the held bodies hold
            assert time.monotonic() < deadline + flooded_sec, probe.answers
            time.sleep(0.1)
        for sock in held:
            sock.close()
    statuses = {kind: sorted({a[:12].decode() for a in got}) for kind, got in answers.items()}
    assert sum(not a for a in answers["own"]) == 4, statuses  # the node's 4 places, then the read limit
    assert sum(a.startswith(b"HTTP/1.1 429") for a in answers["own"]) == 252, statuses
    assert all(b"retry-after:" in a.lower() for a in answers["own"] if a), answers["own"][-1][:300]
    assert all(a.startswith(b"HTTP/1.1 404") for a in answers["victim"] + answers["missing"]), statuses
    probe.assert_all_ok(at_least=6)
    assert platform.node_online("real-agent")
    metrics = httpx.get(f"{url}/metrics", headers=auth(platform.admin), timeout=10, verify=client_tls()).text
    assert 'heteroflow_requests_limited_total{limit="node"} 252.0' in metrics


def test_an_authenticated_slow_body_is_cut_off_with_408(platform: Platform) -> None:
    """A caller with a valid token who trickles a body holds its connection for at most the read time limit."""
    started = time.monotonic()
    answer = b""
    with contextlib.closing(_connect(platform.server.port)) as sock:
        sock.sendall(
            b"POST /api/v1/nodes/register HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + platform.agent_token.encode() + b"\r\nContent-Length: 1000\r\n\r\n{"
        )
        sock.settimeout(0.5)
        while not answer:
            assert time.monotonic() - started < 20, "the slow body was never cut off"
            with contextlib.suppress(OSError):
                sock.send(b" ")
            with contextlib.suppress(TimeoutError):
                answer = sock.recv(65536)
        elapsed = time.monotonic() - started
        sock.settimeout(5)
        answer += _answer(sock)  # the head and the body may come in separate segments
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"did not arrive within" in answer
    assert 9 < elapsed < 20


def test_a_megabyte_flood_of_anonymous_bodies_leaves_real_heartbeats_at_200(platform: Platform) -> None:
    """anonymous 1 MiB bodies of small containers were parsed and walked in Python before the token
    check (about a second of event loop each). Now they are refused on their head, unread."""
    body = b"[" + b",".join([b"[]"] * 349_000) + b"]"
    assert len(body) < 1 << 20
    heads = [
        b"POST /api/v1/nodes/00000000-0000-4000-8000-000000000000/heartbeat HTTP/1.1\r\n",
        b"POST /no/such/path HTTP/1.1\r\n",
    ]
    with Probe(platform, "probe-megabyte").running() as probe:
        deadline = time.monotonic() + 8
        sent = 0
        while time.monotonic() < deadline:
            sockets = []
            for i in range(8):
                sock = _connect(platform.server.port)
                sock.sendall(
                    heads[i % 2] + b"Host: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body)
                )
                with contextlib.suppress(OSError):  # the server may close before the body is all sent
                    sock.sendall(body)
                sockets.append(sock)
            answers = []
            for sock in sockets:
                answers.append(_answer(sock))
                sock.close()
            assert all(answer.startswith(b"HTTP/1.1 401") for answer in answers), answers
            sent += len(sockets)
    assert sent >= 16
    probe.assert_all_ok(at_least=8)
    assert platform.node_online("real-agent")


def test_a_huge_request_head_is_refused_431_without_growing_the_server(platform: Platform) -> None:
    """four 128 MiB headers cost the server +580 MiB before any middleware ran. Now a head is cut off
    past 64 KiB with 431; sixteen 8 MiB attempts leave the resident size within a few MiB."""
    before = platform.rss_kib()
    chunk = b"a" * (1 << 20)
    with Probe(platform, "probe-header").running() as probe:
        for _ in range(16):
            sock = _connect(platform.server.port)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
            with contextlib.suppress(OSError):
                for _ in range(8):
                    sock.sendall(chunk)
            answer = _answer(sock)
            sock.close()
            assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        time.sleep(1)
    grown_mib = (platform.rss_kib() - before) / 1024
    assert grown_mib < 32, f"the server grew by {grown_mib:.0f} MiB"
    probe.assert_all_ok(at_least=2)
    # a head under the limit is still served
    assert (
        httpx.get(
            f"{platform.server.url}/health", headers={"X-Fine": "b" * 30_000}, timeout=5, verify=client_tls()
        ).status_code
        == 200
    )


def _token(platform: Platform, scopes: str, *, tenant: str | None = None) -> str:
    engine = create_db_engine(f"sqlite:///{platform.folder / 'platform.db'}")
    try:
        store = SqlTokenStore(engine)
        now = SystemClock().now()
        tenant_id = store.ensure_tenant(tenant, now=now)[0] if tenant else None
        return store.create_token(name="attacker", scopes=parse_scopes(scopes), tenant_id=tenant_id, now=now)[1]
    finally:
        engine.dispose()


def test_a_stolen_agent_token_neither_takes_over_a_node_nor_storms_its_cards(platform: Platform) -> None:
    """The fleet's own agent token, in an attacker's hands: re-registering the real node is refused (no node id
    back, no inventory overwritten); beats and XID events for it are 404; a node of its own with invented cards
    yields events the controller's source does not take as evidence."""
    url, fleet = platform.server.url, platform.agent_token
    now = SystemClock().now().strftime("%Y-%m-%dT%H:%M:%SZ")
    with httpx.Client(base_url=url, headers=auth(fleet), timeout=10, verify=client_tls()) as http:
        nodes = httpx.get(f"{url}/api/v1/nodes", headers=auth(platform.admin), timeout=10, verify=client_tls()).json()[
            "items"
        ]
        real = next(node for node in nodes if node["name"] == "real-agent")
        forged = http.post("/api/v1/nodes/register", json={"hostname": "real-agent", "vendor": "x", "gpu_count": 256})
        assert forged.status_code == 409
        assert real["id"] not in forged.text
        storm = [
            {"index": n % 8, "uuid": f"GPU-{n:08d}-0000-0000-0000-000000000000", "xid": 79, "occurred_at": now}
            for n in range(200)
        ]
        assert http.post(f"/api/v1/nodes/{real['id']}/heartbeat", json={"xid_events": storm}).status_code == 404
        own = http.post("/api/v1/nodes/register", json={"hostname": "attacker-1", "vendor": "x", "gpu_count": 1})
        assert own.status_code == 200
        headers = {"X-HeteroFlow-Node-Credential": own.json()["node_credential"]}
        node = own.json()["node_id"]
        beat = http.post(f"/api/v1/nodes/{node}/heartbeat", json={"xid_events": storm}, headers=headers)
        assert beat.status_code == 200
        assert beat.json()["xid_events"]["stored"] > 0, beat.text
    reader = _token(platform, "nodes:read")
    events = httpx.get(
        f"{url}/api/v1/hardware-events",
        params={"since": "2000-01-01T00:00:00Z", "limit": 1000},
        headers=auth(reader),
        verify=client_tls(),
    ).json()["events"]
    invented = [e for e in events if e["node_id"] == node]
    assert invented, "the storm's events were not stored"
    assert not any(e["card_known"] for e in invented)  # never a fault key at the controller
    after = httpx.get(
        f"{url}/api/v1/nodes/{real['id']}", headers=auth(platform.admin), timeout=10, verify=client_tls()
    ).json()
    assert (after["vendor"], after["gpu_count"]) == (real["vendor"], real["gpu_count"])
    assert platform.node_online("real-agent")


def test_another_tenant_cannot_squat_or_capture_a_hostname_even_after_its_node_is_deleted(platform: Platform) -> None:
    """Another tenant registering our hostname learns nothing and locks no one out; after an operator deletes
    our node, our agent (its credential kept on disk) registers it again, and the other tenant's node of that
    name stays theirs."""
    url = platform.server.url
    intruder = _token(platform, "agent", tenant="intruders")
    theirs = httpx.post(
        f"{url}/api/v1/nodes/register",
        json={"hostname": "real-agent", "vendor": "x", "gpu_count": 1},
        headers=auth(intruder),
        timeout=10,
        verify=client_tls(),
    )
    assert theirs.status_code == 200  # their own node of that name: no "registered in another scope" oracle
    nodes = httpx.get(f"{url}/api/v1/nodes", headers=auth(platform.admin), timeout=10, verify=client_tls()).json()[
        "items"
    ]
    ours = next(n for n in nodes if n["name"] == "real-agent" and n["id"] != theirs.json()["node_id"])
    assert (
        httpx.delete(
            f"{url}/api/v1/nodes/{ours['id']}", headers=auth(platform.admin), timeout=10, verify=client_tls()
        ).status_code
        == 204
    )
    deadline = time.monotonic() + 30
    while True:  # the real agent gets 404, registers again in its own scope and beats on
        nodes = httpx.get(f"{url}/api/v1/nodes", headers=auth(platform.admin), timeout=10, verify=client_tls()).json()[
            "items"
        ]
        again = [
            n for n in nodes if n["name"] == "real-agent" and n["id"] not in (ours["id"], theirs.json()["node_id"])
        ]
        if again and again[0]["online"]:
            break
        assert platform.agent.process.poll() is None, platform.agent.stop()[-3000:]
        assert time.monotonic() < deadline, "the real agent did not come back after its node was deleted"
        time.sleep(0.2)
    assert again[0]["tenant_id"] is None


def test_the_database_is_owner_only_with_its_side_files(platform: Platform) -> None:
    for suffix in ("", "-wal", "-shm"):
        path = platform.folder / f"platform.db{suffix}"
        assert path.stat().st_mode & 0o077 == 0, f"{path.name} is readable by others"


def test_an_agent_that_lost_its_credential_waits_for_an_operator_without_crash_looping(
    platform: Platform,
) -> None:
    """An agent pod whose stored credential is gone exited 409 and crash-looped. Now it logs why and waits, backing
    off; no credential captures the node meanwhile — not another token, not its own token however long the node
    is silent — until an operator releases the node; then the agent claims it (same id, history kept)."""
    url, state = platform.server.url, platform.folder / "lost-state"
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SETTINGS_PREFIXES)}
    env |= {"PYTHONUNBUFFERED": "1", "HETEROFLOW_AGENT_TOKEN": platform.agent_token}
    env |= {"HETEROFLOW_AGENT_STATE_DIR": str(state)}
    env |= {"HETEROFLOW_AGENT_RECONNECT_INITIAL_SECONDS": "0.5", "HETEROFLOW_AGENT_RECONNECT_MAX_SECONDS": "1"}
    args = ["agent", "run", "--server", url, "--node-name", "lost-agent", "--simulate", "1"]
    args += ["--heartbeat-interval", "0.5"]

    def lost_agent() -> dict[str, object] | None:
        nodes = httpx.get(f"{url}/api/v1/nodes", headers=auth(platform.admin), timeout=10, verify=client_tls()).json()[
            "items"
        ]
        return next((node for node in nodes if node["name"] == "lost-agent"), None)

    first = start("agent-lost-1", args, env=env, folder=platform.folder, port=0)
    try:
        deadline = time.monotonic() + 30
        while not ((node := lost_agent()) and node["online"]):
            assert first.process.poll() is None, first.stop()[-3000:]
            assert time.monotonic() < deadline, "the agent's node never came online"
            time.sleep(0.2)
    finally:
        first.stop()
    deadline = time.monotonic() + 15
    while (gone := lost_agent()) and gone["online"]:  # the pod is gone: its node goes offline
        assert time.monotonic() < deadline, "the stopped agent's node stayed online"
        time.sleep(0.2)
    kept = list(state.glob("node-*.credential"))
    assert kept, "the agent kept no credential"
    for path in kept:
        path.unlink()  # the pod's state folder is lost
    other = _token(platform, "agent")  # another credential of the same (tenantless) scope
    intruder = _token(platform, "agent", tenant="takers")
    second = start("agent-lost-2", args, env=env, folder=platform.folder, port=0)
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 30
        while second.output.read_text(errors="replace").count("agent.node_credential_missing") < 2:
            assert second.process.poll() is None, second.stop()[-3000:]  # waits, never exits
            assert time.monotonic() < deadline, "the agent never asked again"
            for token in (other, platform.agent_token):  # neither another token nor its own takes the node
                forged = httpx.post(
                    f"{url}/api/v1/nodes/register",
                    json={"hostname": "lost-agent", "vendor": "x", "gpu_count": 1},
                    headers=auth(token),
                    timeout=10,
                    verify=client_tls(),
                )
                assert forged.status_code == 409, forged.text
                assert str(node["id"]) not in forged.text
            time.sleep(0.5)
        assert not (lost_agent() or {}).get("online")
        released = httpx.post(
            f"{url}/api/v1/nodes/{node['id']}/release", headers=auth(platform.admin), timeout=10, verify=client_tls()
        )
        assert released.status_code == 200, released.text
        deadline = time.monotonic() + 30
        while not ((back := lost_agent()) and back["online"]):
            assert second.process.poll() is None, second.stop()[-3000:]
            assert time.monotonic() < deadline, "the agent never claimed its released node"
            time.sleep(0.2)
        assert back["id"] == node["id"]  # the same node, its history kept
        credential = back["credential"]
        assert isinstance(credential, dict)
        assert (credential["state"], credential["reissued"]) == ("issued", True)  # told apart from a new node
        theirs = httpx.post(
            f"{url}/api/v1/nodes/register",
            json={"hostname": "lost-agent", "vendor": "x", "gpu_count": 1},
            headers=auth(intruder),
            timeout=10,
            verify=client_tls(),
        )
        assert theirs.status_code == 200  # their own node of that name, not ours
        assert theirs.json()["node_id"] != node["id"]
    finally:
        output = second.stop()
    waits = output.count("agent.node_credential_missing")
    assert 2 <= waits <= 2 + 2 * (time.monotonic() - started), output[-3000:]  # backs off, no tight loop
    assert list(state.glob("node-*.credential")), "the claimed credential was not kept"
