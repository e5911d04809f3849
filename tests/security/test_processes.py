"""Real processes: the platform server and the controller, started as an operator would (no host option, the
cluster token and the monitor's platform token in the environment, debug logging), talking to each other.

They must listen on loopback only, and no token — right or wrong, in a header, a query string or a body,
theirs or one passed through them — may appear in anything they print.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.platform.auth import generate_token, parse_scopes
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.token_store import SqlTokenStore
from tests.security.services import CLUSTER_TOKEN, WRONG_TOKEN, auth

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

MONITOR_TOKEN = generate_token()
"""A well-formed platform token the platform does not know: the controller's monitor polls with it and is
refused, so that the refusal path of both processes is logged."""

STARTUP_SEC = 45.0
_SETTINGS_PREFIXES = ("HETEROFLOW_", "GPU_HEALTH_", "GPU_METRICS_", "GPU_MEMORY_HIGH_", "GPU_WEAK_")


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    output: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> str:
        """Stop the process (SIGTERM, then SIGKILL after 15 s) and return everything it printed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.output.read_text(encoding="utf-8", errors="replace")


def start(name: str, args: list[str], *, env: dict[str, str], folder: Path, port: int) -> Running:
    output = folder / f"{name}.out"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "heteroflow", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return Running(name, process, port, output)


def wait_until_up(running: Running, path: str, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + STARTUP_SEC
    while True:
        try:
            if httpx.get(running.url + path, headers=headers, timeout=2, verify=client_tls()).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if running.process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{running.name} did not start:\n{running.stop()[-3000:]}")
        time.sleep(0.1)


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp{,6} print the address as 32-bit words in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from its file descriptors and its /proc/net."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A = LISTEN
                address, port = local.split(":")
                found.add((_address(address), int(port, 16)))
    return found


@dataclass
class Pair:
    server: Running
    controller: Running
    admin: str
    """A platform token with the admin scope and no tenant."""
    tenant_reader: str

    def secrets(self) -> dict[str, str]:
        return {
            "the cluster token": CLUSTER_TOKEN,
            "the platform admin token": self.admin,
            "a tenant's token": self.tenant_reader,
            "the monitor's token": MONITOR_TOKEN,
            "an unknown token": WRONG_TOKEN,
        }


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    folder = tmp_path_factory.mktemp("processes")
    database_url = f"sqlite:///{folder / 'platform.db'}"
    engine = create_db_engine(database_url)
    upgrade_database(engine)
    store = SqlTokenStore(engine)
    now = SystemClock().now()
    admin = store.create_token(name="ops", scopes=parse_scopes("admin"), tenant_id=None, now=now)[1]
    tenant = store.ensure_tenant("team-a", now=now)[0]
    reader = store.create_token(name="team-a", scopes=parse_scopes("nodes:read"), tenant_id=tenant, now=now)[1]
    engine.dispose()
    server_port, controller_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SETTINGS_PREFIXES)}
    env |= {"HETEROFLOW_CLUSTER_TOKEN": CLUSTER_TOKEN, "PYTHONUNBUFFERED": "1"}
    controller = start(
        "controller",
        [
            "controller",
            "--port",
            str(controller_port),
            "--store-url",
            f"sqlite:///{folder / 'ft.db'}",
            "--log-level",
            "debug",
        ],
        env=env
        | {
            "HETEROFLOW_MONITOR_PLATFORM_URL": f"http://127.0.0.1:{server_port}",
            "HETEROFLOW_MONITOR_PLATFORM_TOKEN": MONITOR_TOKEN,
            "HETEROFLOW_MONITOR_PLATFORM_POLL_SEC": "0.2",
        },
        folder=folder,
        port=controller_port,
    )
    server = start(
        "server",
        ["server", "--port", str(server_port), "--database-url", database_url],
        env=env
        | {"HETEROFLOW_LOG_LEVEL": "debug", "HETEROFLOW_SERVER_CONTROLLER_URL": f"http://127.0.0.1:{controller_port}"},
        folder=folder,
        port=server_port,
    )
    try:
        wait_until_up(controller, "/health", {})
        wait_until_up(server, "/healthz", auth(admin))
        yield Pair(server=server, controller=controller, admin=admin, tenant_reader=reader)
    finally:
        server.stop()
        controller.stop()


@pytest.mark.parametrize("which", ["server", "controller"])
def test_a_service_started_without_host_options_listens_on_loopback_only(pair: Pair, which: str) -> None:
    running: Running = getattr(pair, which)
    found = listening(running.process.pid)
    assert (("127.0.0.1", running.port)) in found or (("::1", running.port)) in found, found
    outside = sorted(address for address, _ in found if address not in ("127.0.0.1", "::1"))
    assert not outside, f"{which} listens beyond loopback: {found}"


def test_no_token_reaches_the_output_of_either_process(pair: Pair) -> None:
    server, controller = pair.server.url, pair.controller.url
    with httpx.Client(timeout=10, verify=client_tls()) as http:
        # the platform: right, wrong and foreign tokens, in headers, query strings and bodies
        assert http.get(f"{server}/api/v1/serving/status", headers=auth(pair.admin)).status_code == 200  # proxied
        for token in (WRONG_TOKEN, CLUSTER_TOKEN, MONITOR_TOKEN):
            assert http.get(f"{server}/api/v1/nodes", headers=auth(token)).status_code == 401
        assert http.get(f"{server}/api/v1/serving/status", headers=auth(pair.tenant_reader)).status_code == 403
        assert http.get(f"{server}/api/v1/nodes", params={"access_token": pair.admin}).status_code == 401
        carried = {"hostname": "gpu-1", "vendor": "nvidia", "gpu_count": 1, "token": pair.admin}
        assert http.post(f"{server}/api/v1/nodes/register", json=carried, headers=auth(pair.admin)).status_code == 422
        assert http.post(f"{server}/api/v1/nodes/register", content=pair.admin.encode()).status_code == 401
        # the controller: its own token, a wrong one, the platform's, in the same places
        assert http.get(f"{controller}/controller/config", headers=auth(CLUSTER_TOKEN)).status_code == 200
        for token in (WRONG_TOKEN, pair.admin):
            assert http.get(f"{controller}/controller/config", headers=auth(token)).status_code == 401
        assert http.get(f"{controller}/controller/config", params={"token": CLUSTER_TOKEN}).status_code == 401
        report = {"instance_id": "x", "cluster_token": CLUSTER_TOKEN, "token": pair.admin}
        answer = http.post(f"{controller}/controller/report_software_fault", json=report, headers=auth(CLUSTER_TOKEN))
        assert answer.status_code == 400
    time.sleep(1.0)  # a few polls of the monitor, each refused by the platform
    printed = {"controller": pair.controller.stop(), "server": pair.server.stop()}
    assert "controller.started" in printed["controller"], printed["controller"][-2000:]
    assert "hardware-events answered HTTP 401" in printed["controller"], "the monitor was never refused"
    assert "DEBUG " in printed["server"], "the server did not log at debug level"
    for which, text in printed.items():
        for what, secret in pair.secrets().items():
            assert secret not in text, f"{which} printed {what}"
