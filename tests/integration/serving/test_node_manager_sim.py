"""NodeManagers supervising real engine-simulator processes.

One 4-rank instance, launched by two in-process NodeManagers (pod ``a``: ranks 0, 1; pod ``b``: 2, 3)
through the real launcher, walks every scenario in turn to keep the run short on two cores: the consumer
rule against a real engine (id mismatch), a whole scale-down round through the four FT routes with the
ENGINE_DEAD timing, a rank that stops answering (SIGSTOP: DEAD evidence after the status timeout) removed
by a second round that fences it first (F-51, cumulative removal set), and a killed API server. The
controller is the recording fake; nothing here sleeps for synchronisation (every wait polls with a deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.contracts.serving import (
    NM_FT_APPLY_PATH,
    NM_FT_FINALIZE_PATH,
    NM_FT_GUARD_PATH,
    NM_FT_STATUS_PATH,
    FaultEvidence,
    FtFlags,
)
from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.serving.node_manager.assembly import create_app
from heteroflow.serving.node_manager.daemon import NodeManager, PodIdentity
from heteroflow.serving.node_manager.engines import HttpEngineClient
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.spec import InstanceSpec, endpoint_url
from heteroflow.serving.node_manager.supervisor import PopenLauncher, session_processes
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN, FakeController, FakeLauncher
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

AUTH = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}
STATUS_TIMEOUT_SEC = 1.0
PROMPTS = ["the quick brown fox", "hello world"]


async def eventually(check: Callable[[], Awaitable[bool] | bool], *, within: float, what: str) -> float:
    """Poll ``check`` until true; the seconds it took. ``TimeoutError`` naming ``what`` at the deadline."""
    start = time.monotonic()
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > within:
            raise TimeoutError(f"not within {within} s: {what}")
        await asyncio.sleep(0.02)


def spec_for(ids: tuple[int, ...], *, ports: dict[int, int], rpc_port: int, store_port: int) -> InstanceSpec:
    return InstanceSpec.model_validate(
        {
            "instance_id": "sim-1",
            "backend": "sim",
            "dp_size": 4,
            "dp_master_ip": "127.0.0.1",
            "dp_rpc_port": rpc_port,
            "dp_store_port": store_port,
            "num_logical_experts": 4,
            "num_redundant_experts": 4,
            "cpu_distributed_timeout_sec": 3,
            "engine_recovery_timeout_sec": 60,
            "endpoints": [{"id": i, "port": ports[i]} for i in ids],
            "sim": {"python": sys.executable, "exit_linger_sec": 3, "rebuild_timeout_sec": 15},
        }
    )


class Pod:
    def __init__(self, name: str, nm: NodeManager) -> None:
        self.name = name
        self.nm = nm
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(nm, cluster_token=TEST_CLUSTER_TOKEN)),
            base_url=f"http://nm-{name}",
            headers=AUTH,
            timeout=30.0,
        )

    async def post(self, path: str, body: object) -> httpx.Response:
        return await self.http.post(path, json=body)


def node_manager(
    spec: InstanceSpec, controller: FakeController, name: str, log_dir: Path, **launcher: Any
) -> NodeManager:
    settings = NodeManagerSettings.load(
        cluster_token=TEST_CLUSTER_TOKEN,
        engine_ft_poll_interval_sec=0.2,
        engine_ft_status_timeout_sec=STATUS_TIMEOUT_SEC,
        node_manager_heartbeat_interval_sec=0.5,
        node_manager_supervisor_interval_sec=0.05,
        node_manager_engine_death_suicide_grace_sec=600,
    )
    return NodeManager(
        spec=spec,
        settings=settings,
        pod=PodIdentity(pod_id=f"pod-{name}", pod_ip="127.0.0.1", node_manager_url=f"http://nm-{name}"),
        controller=controller,
        engines=HttpEngineClient.for_urls(
            {e.id: endpoint_url("127.0.0.1", e.port) for e in spec.endpoints},
            cluster_token=TEST_CLUSTER_TOKEN,
            ft_path_prefix=spec.ft_path_prefix,
        ),
        launcher=launcher.get("launcher") or PopenLauncher(log_dir=log_dir),
        clock=SystemClock(),
    )


async def complete(engines: httpx.AsyncClient, port: int, prompt: str) -> httpx.Response:
    return await engines.post(
        f"http://127.0.0.1:{port}/v1/completions", json={"prompt": prompt, "max_tokens": 8}, timeout=30.0
    )


async def scale_down_round(
    pods: dict[str, Pod], request_id: str, *, removed: list[int], survivors: dict[str, list[int]]
) -> dict[str, dict[str, Any]]:
    """What the controller's DpScaleDownStrategy does, through the four routes; each pod's apply answer."""
    for pod in pods.values():
        response = await pod.post(NM_FT_GUARD_PATH, {"request_id": request_id, "lease_sec": 120})
        assert response.status_code == 200, response.text

    async def states() -> list[dict[str, Any]]:
        found = []
        for name, ids in survivors.items():
            response = await pods[name].post(NM_FT_STATUS_PATH, {"endpoint_ids": ids})
            assert response.status_code == 200, response.text
            found += [e["status"] for e in response.json()["entries"]]
        return found

    async def all_are(status: str) -> bool:
        return all(s["status"] == status and "ft_state" not in s for s in await states())

    await eventually(lambda: all_are("unhealthy"), within=10, what=f"{request_id}: survivors apply-ready")
    body = {
        "instruction": "scale_down",
        "request_id": request_id,
        "params": {"removed_dp_ranks": removed, "dp_master_ip": "127.0.0.1"},
    }
    answers = {}
    for name, pod in pods.items():
        response = await pod.post(NM_FT_APPLY_PATH, body)
        assert response.status_code == 202, response.text
        answers[name] = response.json()
    await eventually(lambda: all_are("healthy"), within=30, what=f"{request_id}: survivors healthy")
    for pod in pods.values():
        commit = {"request_id": request_id, "commit": True, "retired_endpoint_ids": removed}
        response = await pod.post(NM_FT_FINALIZE_PATH, commit)
        assert response.status_code == 200, response.text
    return answers


async def scenario(tmp_path: Path, pods: dict[str, Pod], controller: FakeController, ports: dict[int, int]) -> None:
    engines = httpx.AsyncClient(headers=AUTH, timeout=10.0, verify=client_tls())
    try:
        await run_scenarios(tmp_path, pods, controller, ports, engines)
    finally:
        await engines.aclose()


async def run_scenarios(
    tmp_path: Path, pods: dict[str, Pod], controller: FakeController, ports: dict[int, int], engines: httpx.AsyncClient
) -> None:
    everyone = [pod.nm for pod in pods.values()]

    def all_ready() -> bool:
        return all(e.ready for nm in everyone for e in nm.status().endpoints)

    await eventually(all_ready, within=120, what="every engine ready")
    beats = len(controller.heartbeats)
    await eventually(lambda: len(controller.heartbeats) >= beats + 2, within=5, what="heartbeats")
    assert all(beat.complete for beat in controller.heartbeats[beats:])
    assert controller.reports == []
    baseline = [(await complete(engines, ports[0], p)).json()["choices"][0]["text"] for p in PROMPTS]

    # -- the consumer rule against a real engine: endpoint 1 pointed at engine 2 ------------------------
    wrong = spec_for((1,), ports={1: ports[2]}, rpc_port=1, store_port=1)
    probe_nm = node_manager(wrong, controller, "x", tmp_path, launcher=FakeLauncher())
    probe_nm.launch_engines()
    assert await probe_nm.check_ready(1)
    finding = await probe_nm.poll_once(1)
    assert finding is not None
    assert finding.status == "protocol_error"
    assert "exactly engine 1" in finding.detail
    await probe_nm.close()
    controller.reports.clear()

    # -- kill rank 1's worker: ENGINE_DEAD within 1 s, then a whole round through the four routes -------
    injected = await engines.post(f"http://127.0.0.1:{ports[1]}/sim/faults", json={"kind": "kill_worker"})
    assert injected.status_code == 202, injected.text
    took = await eventually(
        lambda: bool(controller.reports_for(1, FaultEvidence.ENGINE_DEAD)), within=1.0, what="ENGINE_DEAD of rank 1"
    )
    assert took < 1.0
    await asyncio.gather(*(complete(engines, ports[r], "traffic") for r in (0, 2, 3)))
    await eventually(
        lambda: all(any(x.status == "unhealthy" for x in controller.reports_for(r)) for r in (0, 2, 3)),
        within=10,
        what="survivors reported unhealthy",
    )
    for r in (0, 2, 3):
        # vLLM 0.34: a fault may first read diagnosing (never dead, never a protocol error), then unhealthy
        assert [x.status for x in controller.reports_for(r)] in (["unhealthy"], ["diagnosing", "unhealthy"])

    await scale_down_round(pods, "round-1", removed=[1], survivors={"a": [0], "b": [2, 3]})
    after = [(await complete(engines, ports[2], p)).json()["choices"][0]["text"] for p in PROMPTS]
    assert after == baseline
    beats = len(controller.heartbeats)
    await eventually(lambda: len(controller.heartbeats) >= beats + 2, within=5, what="heartbeats after commit")
    last_a = next(b for b in reversed(controller.heartbeats) if b.request.pod_id == "pod-a")
    assert last_a.request.endpoint_ids == [0]
    assert last_a.request.retired_endpoint_ids == [1]
    assert last_a.complete

    # -- rank 2 stops answering (SIGSTOP of its session): DEAD evidence after the status timeout ---------
    api_pid = pods["b"].nm.supervisor.pids()[2]
    os.killpg(api_pid, signal.SIGSTOP)
    took = await eventually(
        lambda: bool(controller.reports_for(2, FaultEvidence.FT_UNREACHABLE)), within=5, what="rank 2 DEAD"
    )
    assert took >= STATUS_TIMEOUT_SEC - 0.3  # detected by the timeout (a poll may be in flight at the stop)
    assert controller.reports_for(2, FaultEvidence.ENGINE_DEAD) == []  # its processes are alive
    assert pods["b"].nm.status().endpoints[0].dead_by_unreachability

    # -- round 2 removes it (cumulative {1, 2}); the NodeManager fences it first (F-51) ------------------
    # (a survivor may have been reported more than once around round 1: count the reports from here on)
    before = {r: len(controller.reports_for(r)) for r in (0, 3)}
    await asyncio.gather(*(complete(engines, ports[r], "traffic") for r in (0, 3)), return_exceptions=True)
    await eventually(
        lambda: all(
            len(reports := controller.reports_for(r)) > before[r] and reports[-1].status == "unhealthy" for r in (0, 3)
        ),
        within=15,
        what="survivors unhealthy again",
    )
    answers = await scale_down_round(pods, "round-2", removed=[1, 2], survivors={"a": [0], "b": [3]})
    assert answers["b"]["fenced_endpoint_ids"] == [2]
    assert answers["a"]["fenced_endpoint_ids"] == []
    assert session_processes([api_pid]) == {}
    after = [(await complete(engines, ports[3], p)).json()["choices"][0]["text"] for p in PROMPTS]
    assert after == baseline
    assert pods["b"].nm.status().retired == (1, 2)

    # -- kill rank 3's API server: ENGINE_DEAD within 1 s -------------------------------------------------
    os.kill(pods["b"].nm.supervisor.pids()[3], signal.SIGKILL)
    took = await eventually(
        lambda: bool(controller.reports_for(3, FaultEvidence.ENGINE_DEAD)), within=1.0, what="ENGINE_DEAD of rank 3"
    )
    report = controller.reports_for(3, FaultEvidence.ENGINE_DEAD)[0]
    assert report.exit_code == -9
    assert report.identity is not None
    assert report.identity.pid == pods["b"].nm.supervisor.pids()[3]


def test_node_managers_supervise_real_engine_processes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ports = {r: free_port() for r in range(4)}
    rpc_port, store_port = free_port(), free_port()
    controller = FakeController(flags=FtFlags(enable_dp_scale_down_proxy=True), heartbeat_interval_sec=0.5)
    log_dir = tmp_path / "logs"

    async def main() -> dict[int, int]:
        pods = {
            name: Pod(
                name,
                node_manager(
                    spec_for(ids, ports=ports, rpc_port=rpc_port, store_port=store_port), controller, name, log_dir
                ),
            )
            for name, ids in (("a", (0, 1)), ("b", (2, 3)))
        }
        pids: dict[int, int] = {}
        try:
            for pod in pods.values():
                await pod.nm.start()
                pids.update(pod.nm.supervisor.pids())
            await scenario(tmp_path, pods, controller, ports)
        finally:
            for pod in pods.values():
                await pod.http.aclose()
                with contextlib.suppress(Exception):
                    await pod.nm.close()
        return pids

    pids = asyncio.run(main())
    assert len(pids) == 4
    # a session's last SIGKILL is not waited for by stop(): a killed worker still exiting is listed for a moment
    until(lambda: not session_processes(list(pids.values())), within=10, what="every engine session empty")
