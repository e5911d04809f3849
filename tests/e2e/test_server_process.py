"""The real commands: ``heteroflow admin create-token`` and ``heteroflow server`` as processes over HTTP."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from heteroflow.agent.client import HttpPlatformClient
from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.agent.runner import registration_for
from heteroflow.agent.simulated import SimulatedCollector
from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls

pytestmark = pytest.mark.e2e


def heteroflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "heteroflow", *args], capture_output=True, text=True, timeout=60, check=False
    )


def create_token(database_url: str, scopes: str, *extra: str) -> str:
    result = heteroflow("admin", "create-token", "--scopes", scopes, "--database-url", database_url, *extra)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def running_server(
    database_url: str,
    token: str,
    env: dict[str, str] | None = None,
    *,
    preexec_fn: Callable[[], object] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "heteroflow", "server", "--port", str(port), "--database-url", database_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=None if env is None else {**os.environ, **env},
        preexec_fn=preexec_fn,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if (
                httpx.get(
                    f"{url}/healthz", headers={"Authorization": f"Bearer {token}"}, verify=client_tls()
                ).status_code
                == 200
            ):
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"server did not start: {process.stderr.read() if process.stderr else ''!r}")
        time.sleep(0.1)
    try:
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


@pytest.fixture
def server(database_url: str) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    token = create_token(database_url, "agent,nodes:read")
    with running_server(database_url, token) as (url, process):
        yield url, token, process


def test_the_server_process_exports_how_long_its_garbage_collections_held_it(database_url: str) -> None:
    # with CPython's own thresholds (the setting at 0) a server's start-up alone runs many young collections
    token = create_token(database_url, "metrics:read")
    with running_server(database_url, token, {"HETEROFLOW_SERVER_GC_YOUNG_THRESHOLD": "0"}) as (url, _):
        text = httpx.get(
            f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10, verify=client_tls()
        ).text
    assert "# TYPE heteroflow_gc_pause_seconds histogram" in text
    (count,) = [
        line for line in text.splitlines() if line.startswith('heteroflow_gc_pause_seconds_count{generation="0"}')
    ]
    assert float(count.split()[-1]) > 0


def status_lines(sockets: list[socket.socket], *, within_sec: float) -> list[bytes]:
    """The first line each socket answers (``b""``: closed, or nothing before the deadline), waited for together."""
    lines = dict.fromkeys(sockets, b"")
    with selectors.DefaultSelector() as selector:
        for sock in sockets:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + within_sec
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(timeout=left):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                with contextlib.suppress(OSError):
                    lines[ready] = ready.recv(4096).split(b"\r\n", 1)[0]
                selector.unregister(ready)
    return [lines[sock] for sock in sockets]


def test_a_server_started_under_a_low_open_file_limit_answers_more_connections_than_it(tmp_path: Path) -> None:
    """Every agent keeps a connection open, and a service's usual soft limit on open files is 1,024. Started with
    a soft limit of 256, the server raises it to the hard limit and answers 400 connections held open at once
    (under the limit it was started with, 161 of 400 went unanswered)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"this machine's hard limit on open files ({hard}) leaves no room over 400 connections")
    if soft != resource.RLIM_INFINITY and soft < 1024:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))  # this test's own 400 sockets
    database_url = f"sqlite:///{tmp_path / 'limits.db'}"
    token = create_token(database_url, "agent")
    request = f"GET /healthz HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    with running_server(
        database_url, token, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    ) as (url, process):
        limits = Path(f"/proc/{process.pid}/limits").read_text()
        (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
        if hard != resource.RLIM_INFINITY:
            assert line.split()[3:5] == [str(hard), str(hard)], line  # soft raised to hard
        port = int(url.rsplit(":", 1)[1])
        sockets: list[socket.socket] = []
        try:
            for _ in range(400):
                sockets.append(socket.create_connection(("127.0.0.1", port), timeout=10))
                sockets[-1].sendall(request)
            lines = status_lines(sockets, within_sec=60)
        finally:
            for sock in sockets:
                sock.close()
    assert lines.count(b"HTTP/1.1 200 OK") == 400, collections.Counter(lines)


def test_an_agent_beats_over_the_connection_it_kept_since_its_last_beat(tmp_path: Path) -> None:
    """Two beats 6 s apart (the agent's default interval is 5 s, and httpx and uvicorn each drop an idle connection
    after 5 s by default) go over one connection: the agent keeps it (``IDLE_CONNECTION_SEC``) and so does the
    server (``keep_alive_timeout_seconds``). Before, every beat of an agent opened a connection."""
    database_url = f"sqlite:///{tmp_path / 'agent.db'}"
    token = create_token(database_url, "agent")
    collector = SimulatedCollector(clock=SystemClock(), count=2, seed="kept")
    with running_server(database_url, token) as (url, _):
        agent = HttpPlatformClient(base_url=url, token=token)
        local_ports: list[int] = []
        agent._http.event_hooks["response"].append(  # which connection each answer came over
            lambda response: local_ports.append(response.extensions["network_stream"].get_extra_info("client_addr")[1])
        )
        try:
            health, telemetry = collector.read_health(), collector.read_telemetry()
            node = agent.register(
                registration_for(hostname="kept-1", source="simulated", health=health, telemetry=telemetry)
            ).node_id
            for idle_sec in (0, 6):
                time.sleep(idle_sec)  # the idle time between two beats is the subject here, not a wait for an event
                agent.heartbeat(
                    node,
                    heartbeat_body(health=collector.read_health(), telemetry=collector.read_telemetry(), xid_events=()),
                )
        finally:
            agent.close()
    assert len(local_ports) == 3
    assert len(set(local_ports)) == 1, local_ports


def test_token_register_heartbeat_and_read_back_over_http(server: tuple[str, str, subprocess.Popen[bytes]]) -> None:
    url, token, process = server
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=10, verify=client_tls()) as client:
        assert httpx.get(f"{url}/api/v1/nodes", verify=client_tls()).status_code == 401
        registered = client.post(
            "/api/v1/nodes/register", json={"hostname": "gpu-a", "vendor": "nvidia", "gpu_count": 1}
        ).json()
        node = registered["node_id"]
        beat = {"gpu_stats": [{"index": 0, "uuid": "GPU-1", "ecc_corrected_total": 3, "retired_pages": "[N/A]"}]}
        # an agent token speaks for a node only with the credential that node's registration issued
        assert client.post(f"/api/v1/nodes/{node}/heartbeat", json=beat).status_code == 404
        credential = {"X-HeteroFlow-Node-Credential": registered["node_credential"]}
        assert client.post(f"/api/v1/nodes/{node}/heartbeat", json=beat, headers=credential).status_code == 200
        deadline = time.monotonic() + 15
        while True:
            body = client.get("/api/v1/gpu-health/samples", params={"node_id": node, "gpu_index": 0}).json()
            if body["samples"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert [(s["ecc_corrected_total"], s["retired_pages"]) for s in body["samples"]] == [(3, None)]
        assert client.get("/api/v1/nodes").json()["items"][0]["online"] is True
    process.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal so the exit status tells why it stopped
    assert process.wait(15) in (0, -signal.SIGTERM)
    assert process.stderr is not None
    assert "Application shutdown complete" in process.stderr.read().decode()


def test_create_token_refuses_unknown_scopes_with_a_message(tmp_path: object) -> None:
    result = heteroflow("admin", "create-token", "--scopes", "nodes:read,root", "--database-url", "sqlite:///:memory:")
    assert result.returncode == 2
    assert "unknown scope" in result.stderr


def test_create_token_for_a_tenant_prints_the_token_last(database_url: str) -> None:
    result = heteroflow(
        "admin", "create-token", "--scopes", "nodes:read", "--tenant", "team-a", "--database-url", database_url
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("hf_")
    assert "created tenant 'team-a'" in result.stderr


def test_revoke_token_through_the_cli(database_url: str) -> None:
    result = heteroflow("admin", "create-token", "--scopes", "nodes:read", "--database-url", database_url)
    token_id = result.stderr.split("token id ")[1].split()[0]
    revoked = heteroflow("admin", "revoke-token", token_id, "--database-url", database_url)
    assert revoked.returncode == 0, revoked.stderr
    again = heteroflow("admin", "revoke-token", token_id, "--database-url", database_url)
    assert again.returncode == 1
    assert "no live token" in again.stderr


def agent_logs(log_dir: Path) -> dict[str, str]:
    """The simulated agents' logs (their tails), for a failure's message."""
    return {path.name: path.read_text(errors="replace")[-3000:] for path in sorted(log_dir.glob("agent-*.log"))}


def test_up_runs_the_local_platform_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    state_file = tmp_path / "state.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "heteroflow",
            "up",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
            "--state-file",
            str(state_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not state_file.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else b""
            assert time.monotonic() < deadline, "no state file"
            time.sleep(0.05)
        state = json.loads(state_file.read_text())
        assert state_file.stat().st_mode & 0o077 == 0  # the admin token is for its owner only
        headers = {"Authorization": f"Bearer {state['admin_token']}"}
        while True:
            try:
                response = httpx.get(f"{state['server_url']}/api/v1/nodes", headers=headers, verify=client_tls())
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not answer"
                time.sleep(0.05)
        assert response.status_code == 200
        assert state["server_url"] == f"http://127.0.0.1:{port}"
        # the simulated GPU nodes register and report simulated samples
        while True:
            nodes = httpx.get(f"{state['server_url']}/api/v1/nodes", headers=headers, verify=client_tls()).json()[
                "items"
            ]
            caps = httpx.get(
                f"{state['server_url']}/api/v1/gpu-health/capabilities",
                params={"source": "simulated"},
                headers=headers,
                verify=client_tls(),
            ).json()["cards"]
            # both nodes online at once: a node whose beats stopped for 30 s (an agent that died, a server that
            # shed its beats) fails here with the agents' logs
            if len(nodes) == 2 and len(caps) == 16 and all(n["online"] for n in nodes):
                break
            assert time.monotonic() < deadline + 30, (nodes, len(caps), agent_logs(tmp_path / "data" / "logs"))
            time.sleep(0.2)
        assert {n["source"] for n in nodes} == {"simulated"}
        process.send_signal(signal.SIGINT)
        assert process.wait(15) in (0, -signal.SIGINT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
