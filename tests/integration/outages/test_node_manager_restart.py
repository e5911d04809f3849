"""A NodeManager process is SIGKILLed while the controller holds its guard mid-round, then started again.

The cheapest setup with a real process kill: the two NodeManagers are ``heteroflow node-manager`` processes with
their real engine-simulator processes (DP 2, one rank per pod, torch workers), and the controller runs in the
test's event loop, served on loopback. The in-process harness cannot do it (its NodeManagers are objects, not
processes) and the local cluster would add a platform server, agents and a Coordinator process that play no part
here. The controller's requests to the NodeManagers go over real sockets through a transport that lets the test
act at the exact step: right after pod ``a`` granted the round's guard, before the controller sees that answer.

Expected (RFC §5, serving-ft.md F-23/F-27, docs/controller.md): the round fails before apply (the survivor's
status cannot be read), every reachable NodeManager is aborted, the instance falls back to a whole-instance
reconfiguration; the restarted NodeManager registers again with the same endpoints (a re-registration of an
assembled instance), no apply is ever sent, and the instance ends NORMAL with both ranks published and serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.contracts.serving import NM_FT_GUARD_PATH, NM_STATUS_PATH
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.local.processes import CLUSTER_ID_ENV, kill_marked, marked_processes
from heteroflow.serving.controller.clients import CoordinatorClient
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN
from tests.integration.outages.serving import ControllerPlane, HookedTransport, controller_plane, serve
from tests.integration.serving.controller_harness import RecordingCoordinator
from tests.support.polling import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

AUTH = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}
PODS = {"a": 0, "b": 1}
"""Pod name → its one DP rank."""
COORDINATOR_URL = "http://coordinator"


@dataclass
class NodeManagerProcess:
    """``heteroflow node-manager`` for one pod; each start is a new process with a log of its own."""

    name: str
    port: int
    config: Path
    controller_url: str
    log_dir: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        log = self.log_dir / f"node-manager-{self.name}-{self.starts}.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "heteroflow.cli.main", "node-manager",
                    "--controller", self.controller_url, "--pod-id", f"pod-{self.name}", "--pod-ip", "127.0.0.1",
                    "--port", str(self.port), "--config", str(self.config), "--log-dir", str(self.log_dir),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )  # fmt: skip

    def kill(self) -> None:
        """SIGKILL the NodeManager process alone (as a crash or the OOM killer would)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # it stops its engines first
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.log_dir.glob(f"node-manager-{self.name}-*"))
        )

    async def status(self) -> dict[str, Any] | None:
        try:
            async with httpx.AsyncClient(timeout=2.0, verify=client_tls()) as http:
                response = await http.get(self.url + NM_STATUS_PATH, headers=AUTH)
        except httpx.TransportError:
            return None
        return dict(response.json()) if response.status_code == 200 else None


def spec(rank: int, *, ports: dict[int, int], rpc_port: int, store_port: int) -> dict[str, Any]:
    return {
        "instance_id": "inst-1",
        "backend": "sim",
        "dp_size": len(PODS),
        "dp_master_ip": "127.0.0.1",
        "dp_rpc_port": rpc_port,
        "dp_store_port": store_port,
        "num_logical_experts": 4,
        "num_redundant_experts": 4,
        "cpu_distributed_timeout_sec": 3,
        "engine_recovery_timeout_sec": 60,
        "endpoints": [{"id": rank, "port": ports[rank]}],
        "sim": {"python": sys.executable, "exit_linger_sec": 3, "rebuild_timeout_sec": 15, "startup_timeout_sec": 60},
    }


async def completion(port: int) -> int | None:
    """One completion straight to an engine; its HTTP status (``None``: unreachable)."""
    try:
        async with httpx.AsyncClient(timeout=30.0, verify=client_tls()) as http:
            response = await http.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={"prompt": "traffic", "max_tokens": 4},
                headers=AUTH,
            )
    except httpx.TransportError:
        return None
    return response.status_code


async def engine_status(port: int, expected: str) -> bool:
    """Whether the engine on ``port`` reports ``expected`` on its FT status route."""
    with contextlib.suppress(httpx.HTTPError):
        async with httpx.AsyncClient(timeout=5.0, verify=client_tls()) as http:
            body = (await http.get(f"http://127.0.0.1:{port}/v1/fault_tolerance/status", headers=AUTH)).json()
        return any(engine["status"] == expected for engine in body["engines"])
    return False


async def _failed(answer: Awaitable[int | None]) -> bool:
    return await answer != 200


def test_a_node_manager_killed_while_guarded_and_restarted_ends_in_a_clean_reconfiguration(tmp_path: Path) -> None:
    marker = f"outage-{uuid.uuid4().hex}"
    engine_ports = {rank: free_port() for rank in PODS.values()}
    rpc_port, store_port, controller_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")}
    env.update(
        {
            CLUSTER_ID_ENV: marker,  # inherited by the engines: "no process left behind" is checkable
            "HETEROFLOW_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN,
            "HETEROFLOW_ENGINE_FT_POLL_INTERVAL_SEC": "0.2",
            "HETEROFLOW_ENGINE_FT_STATUS_TIMEOUT_SEC": "1",
            "HETEROFLOW_NODE_MANAGER_ENGINE_STOP_GRACE_SEC": "1",
            "HETEROFLOW_NODE_MANAGER_ENGINE_DEATH_SUICIDE_GRACE_SEC": "120",
            "PYTHONUNBUFFERED": "1",
        }
    )
    node_managers: dict[str, NodeManagerProcess] = {}
    for name, rank in PODS.items():
        config = tmp_path / f"pod-{name}.json"
        config.write_text(json.dumps(spec(rank, ports=engine_ports, rpc_port=rpc_port, store_port=store_port)))
        log_dir = tmp_path / f"logs-{name}"
        log_dir.mkdir()
        node_managers[name] = NodeManagerProcess(
            name, free_port(), config, f"http://127.0.0.1:{controller_port}", log_dir, env
        )
    pod_of_port = {nm.port: name for name, nm in node_managers.items()}
    coordinator = RecordingCoordinator()

    async def scenario() -> None:
        def transports(plane: ControllerPlane) -> Any:
            return lambda base: HookedTransport(plane)

        async with controller_plane(
            tmp_path,
            coordinator=CoordinatorClient(
                COORDINATOR_URL,
                cluster_token=TEST_CLUSTER_TOKEN,
                timeout_sec=2.0,
                transport_for=lambda _: httpx.ASGITransport(app=coordinator.app()),
            ),
            node_manager_transport=transports,
            ft={"execution_deadline_sec": 20.0, "software_fault_collection_timeout_sec": 20.0},
        ) as plane:
            served = await serve(plane.app, controller_port)
            try:
                for nm in node_managers.values():
                    nm.start()
                await plane.until(
                    lambda s: s["phase"] == "NORMAL" and s["can_serve"] and len(s["published_endpoints"]) == 2,
                    within=90,
                    what="the instance assembled and published",
                )
                old_engine = (await node_managers["a"].status() or {})["endpoints"][0]["pid"]
                assert coordinator.published() == [0, 1]

                killed: dict[str, float] = {}

                async def kill_a_once_guarded(request: httpx.Request, response: httpx.Response) -> None:
                    if (
                        request.url.path == NM_FT_GUARD_PATH
                        and pod_of_port.get(request.url.port or 0) == "a"
                        and response.status_code == 200
                        and not killed
                    ):
                        await asyncio.to_thread(node_managers["a"].kill)  # the guard is granted: NM a dies
                        killed["at"] = time.monotonic()

                plane.after_hooks.append(kill_a_once_guarded)
                # the fault: rank 1's worker dies; traffic on rank 0 meets the broken collective
                async with httpx.AsyncClient(timeout=10.0, verify=client_tls()) as http:
                    injected = await http.post(
                        f"http://127.0.0.1:{engine_ports[1]}/sim/faults", json={"kind": "kill_worker"}, headers=AUTH
                    )
                assert injected.status_code == 202, injected.text
                await eventually(lambda: engine_status(engine_ports[1], "dead"), within=20, what="rank 1 dead")
                await eventually(
                    lambda: _failed(completion(engine_ports[0])), within=20, what="rank 0 meets the broken collective"
                )

                status = await plane.until(
                    lambda s: s["phase"] == "RECONFIGURING", within=60, what="the round fails safe"
                )
                assert killed, "the round never guarded pod a"
                timeline = await plane.round(status["rounds"][-1])
                kinds = [event["kind"] for event in timeline["events"]]
                assert "guard" in kinds
                assert "apply" not in kinds  # the round stopped before apply
                aborted = {e["pod_id"] for e in timeline["events"] if e["kind"] == "finalize" and not e["commit"]}
                assert "pod-b" in aborted
                assert status["fallback_strategy"] == "InstanceReconfiguration"
                assert status["dead_committed"] == []

                node_managers["a"].start()  # same pod, port and spec: a restarted container
                restarted = time.monotonic()
                status = await plane.until(
                    lambda s: s["phase"] == "NORMAL" and s["can_serve"] and sorted(s["published_endpoints"]) == [0, 1],
                    within=120,
                    what="the reconfiguration completes with the restarted NodeManager",
                )
                recovered = time.monotonic() - restarted

                # the restarted NodeManager registered again with the same endpoints
                again = [r for r in plane.registrations if r.pod_id == "pod-a"]
                assert len(again) >= 2
                assert {(tuple(e.id for e in r.endpoints), r.node_manager_url) for r in again} == {
                    ((0,), node_managers["a"].url)
                }
                # nothing applied, ever: neither the interrupted round nor anything after it
                assert plane.applies == []
                assert "ft.apply" not in node_managers["a"].logs() + node_managers["b"].logs()
                assert status["dead_committed"] == []
                assert coordinator.published() == [0, 1]
                for name in PODS:
                    nm_status = await node_managers[name].status()
                    assert nm_status is not None
                    assert nm_status["retired"] == []
                    assert nm_status["guard_request_id"] is None
                # the killed NodeManager's engine did not outlive it
                assert old_engine not in marked_processes(marker)
                assert await completion(engine_ports[0]) == 200
                assert await completion(engine_ports[1]) == 200
                assert recovered < 90
            finally:
                for nm in node_managers.values():
                    await asyncio.to_thread(nm.stop)
                await served.stop()

    try:
        asyncio.run(scenario())
    finally:
        left = kill_marked(marker)
        for nm in node_managers.values():
            with contextlib.suppress(Exception):
                nm.stop()
    assert left == [], f"processes left behind: {left}"
