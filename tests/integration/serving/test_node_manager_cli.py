"""``heteroflow node-manager`` as a real process: a 2-rank simulator instance, the proxy off (row A18).

The controller is the recording fake served over HTTP on loopback (uvicorn in a thread of the test).
With the scale-down proxy off the four FT routes answer 404 and heartbeats carry the complete endpoint set
(the baseline); SIGTERM stops the NodeManager with exit code 0 and leaves no engine process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from heteroflow.contracts.serving import (
    NM_FT_APPLY_PATH,
    NM_FT_FINALIZE_PATH,
    NM_FT_GUARD_PATH,
    NM_FT_STATUS_PATH,
    NM_STATUS_PATH,
    FtFlags,
)
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.serving.node_manager.supervisor import session_processes
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN, FakeController
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

AUTH = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}


@pytest.fixture
def controller() -> Iterator[tuple[FakeController, str]]:
    fake = FakeController(flags=FtFlags(enable_dp_scale_down_proxy=False), heartbeat_interval_sec=0.3)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            fake.app(cluster_token=TEST_CLUSTER_TOKEN),
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started, within=10, what="fake controller up")
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_node_manager_command_with_the_proxy_off(tmp_path: Path, controller: tuple[FakeController, str]) -> None:
    pytest.importorskip("torch")
    fake, url = controller
    ports = [free_port(), free_port()]
    spec = {
        "instance_id": "cli-1",
        "dp_size": 2,
        "dp_master_ip": "127.0.0.1",
        "dp_rpc_port": free_port(),
        "dp_store_port": free_port(),
        "num_logical_experts": 2,
        "num_redundant_experts": 2,
        "endpoints": [{"id": 0, "port": ports[0]}, {"id": 1, "port": ports[1]}],
        "sim": {"python": sys.executable},
    }
    config = tmp_path / "pod.json"
    config.write_text(json.dumps(spec))
    nm_port = free_port()
    env = {
        **os.environ,
        "HETEROFLOW_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN,
        "HETEROFLOW_NODE_MANAGER_PORT": str(nm_port),
        "HETEROFLOW_NODE_MANAGER_HEARTBEAT_INTERVAL_SEC": "0.3",
        "HETEROFLOW_NODE_MANAGER_LOG_DIR": str(tmp_path / "engines"),
    }
    log = (tmp_path / "node-manager.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "heteroflow.cli.main",
            "node-manager",
            "--controller",
            url,
            "--pod-id",
            "pod-0",
            "--pod-ip",
            "127.0.0.1",
            "--config",
            str(config),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{nm_port}"
    engine_pids: list[int] = []
    try:

        def both_ready() -> bool:
            try:
                status = httpx.get(base + NM_STATUS_PATH, headers=AUTH, timeout=2, verify=client_tls()).json()
            except httpx.HTTPError:
                return False
            engine_pids[:] = [e["pid"] for e in status["endpoints"] if e["pid"]]
            return all(e["ready"] for e in status["endpoints"])

        until(both_ready, within=90, what="NodeManager up with both engines ready")
        # registered at start, and again once the engines' protocol profile was discovered
        until(
            lambda: fake.registrations[-1].ft_capability.protocol_profile == "vllm-0.34",
            within=30,
            what="the discovered profile registered",
        )
        assert {r.pod_id for r in fake.registrations} == {"pod-0"}
        assert fake.registrations[0].ft_capability.protocol_profile is None
        beats = len(fake.heartbeats)
        until(lambda: len(fake.heartbeats) >= beats + 2, within=5, what="heartbeats")
        assert all(b.complete and b.request.endpoint_ids == [0, 1] for b in fake.heartbeats[beats:])
        for path in (NM_FT_STATUS_PATH, NM_FT_APPLY_PATH, NM_FT_GUARD_PATH, NM_FT_FINALIZE_PATH):
            response = httpx.post(
                base + path, json={"request_id": "r", "lease_sec": 5}, headers=AUTH, timeout=5, verify=client_tls()
            )
            assert response.status_code == 404, (path, response.text)
        assert httpx.get(base + NM_STATUS_PATH, timeout=5, verify=client_tls()).status_code == 401
        completion = httpx.post(
            f"http://127.0.0.1:{ports[1]}/v1/completions",
            json={"prompt": "hello", "max_tokens": 4},
            headers=AUTH,
            timeout=30,
            verify=client_tls(),
        )
        assert completion.status_code == 200
        assert fake.reports == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for pid in session_processes(engine_pids):  # engines run in sessions of their own: leave none behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        log.close()
    until(lambda: not session_processes([proc.pid, *engine_pids]), within=10, what="every process gone")
