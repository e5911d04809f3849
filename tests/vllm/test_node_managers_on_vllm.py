"""Two real vLLM ranks (external LB, FT on) supervised by two of our NodeManagers.

The NodeManagers are told no profile: they discover ``vllm-released`` and register it; the released
conformance checks (the same the simulator passes, ``tests/unit/engine_sim/test_released_profile.py``) run
against the real ranks; a killed worker is reported DEAD (time measured), the survivor UNHEALTHY after a
request, and a ``retry`` sent through the NodeManager fails on CPU — recognised from ``ft_error`` by the
round's own id within seconds. Figures go to ``$VLLM_TIER_FIGURES`` when set (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from heteroflow.contracts.serving import FaultEvidence, FtFlags, FtStatusRequest, GuardRequest, NmApplyRequest
from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import free_port
from heteroflow.engine_sim import released_conformance
from heteroflow.http.tls import client_tls
from heteroflow.local import vllm
from heteroflow.serving.node_manager.daemon import NodeManager, PodIdentity
from heteroflow.serving.node_manager.engines import HttpEngineClient
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.spec import InstanceSpec, endpoint_url
from heteroflow.serving.node_manager.supervisor import PopenLauncher, descendants_of
from heteroflow.serving.node_manager.testing import FakeController

pytestmark = pytest.mark.vllm

TOKEN = "vllm-tier-key"
START_WITHIN = 420.0
"""Two real ranks start in 50-120 s on a loaded 2-core machine; the bound leaves room for a busier one."""


def spec_for(rank: int, *, python: Path, model: Path, ports: dict[int, int], rpc: int, store: int) -> InstanceSpec:
    return InstanceSpec.model_validate(
        {
            "instance_id": "vllm-0.32",
            "backend": "vllm",
            "dp_size": 2,
            "dp_master_ip": "127.0.0.1",
            "dp_rpc_port": rpc,
            "dp_store_port": store,
            "num_logical_experts": 4,
            "num_redundant_experts": 0,
            "enable_eplb": False,
            "cpu_distributed_timeout_sec": 15,
            "engine_recovery_timeout_sec": 120,
            "endpoints": [{"id": rank, "port": ports[rank]}],
            "vllm": vllm.vllm_options(python, model),
        }
    )


class RealRanks:
    """:class:`released_conformance.ReleasedHarness` over the real ranks, plus their NodeManagers."""

    def __init__(self, nms: dict[int, NodeManager], ports: dict[int, int]) -> None:
        self.nms = nms
        self.ports = ports
        self.dp_size = 2
        self._clients = {
            r: httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{p}",
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=60.0,
                verify=client_tls(),
            )
            for r, p in ports.items()
        }

    def client(self, rank: int) -> httpx.AsyncClient:
        return self._clients[rank]

    async def eventually(self, check: Callable[[], Awaitable[bool]], *, within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while not await check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {within} s: {what}")
            await asyncio.sleep(0.1)

    def worker_pid(self, rank: int) -> int:
        api = self.nms[rank].supervisor.pids()[rank]
        for pid in sorted(descendants_of(api)):
            try:
                if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::Worker"):
                    return pid
            except OSError:
                continue
        raise AssertionError(f"no VLLM::Worker process under rank {rank}'s API server {api}")

    async def kill_worker(self, rank: int) -> None:
        os.kill(self.worker_pid(rank), signal.SIGKILL)

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()


def record(figures: dict[str, float]) -> None:
    out = os.environ.get("VLLM_TIER_FIGURES")
    if out:
        with Path(out).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"tier": "vllm-node-managers", **figures}) + "\n")


def node_managers(vllm_python: Path, tiny_model: Path, tmp_path: Path) -> tuple[RealRanks, FakeController]:
    ports = {0: free_port(), 1: free_port()}
    rpc, store = free_port(), free_port()
    controller = FakeController(flags=FtFlags(enable_dp_scale_down_proxy=True, enable_fast_recovery=True))
    nms: dict[int, NodeManager] = {}
    for rank in (0, 1):
        spec = spec_for(rank, python=vllm_python, model=tiny_model, ports=ports, rpc=rpc, store=store)
        nms[rank] = NodeManager(
            spec=spec,
            settings=NodeManagerSettings.load(
                cluster_token=TOKEN, engine_death_suicide=False, engine_ft_poll_interval_sec=0.5
            ),
            pod=PodIdentity(pod_id=f"pod-{rank}", pod_ip="127.0.0.1", node_manager_url=f"http://nm-{rank}"),
            controller=controller,
            engines=HttpEngineClient.for_urls(
                {rank: endpoint_url("127.0.0.1", ports[rank])}, cluster_token=TOKEN, model=vllm.SERVED_MODEL
            ),
            launcher=PopenLauncher(log_dir=tmp_path / f"pod-{rank}"),
            clock=SystemClock(),
        )
    return RealRanks(nms, ports), controller


@pytest.mark.timeout(900)
def test_node_managers_discover_report_and_correlate_on_real_vllm(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    async def main() -> None:
        ranks, controller = node_managers(vllm_python, tiny_model, tmp_path)
        try:
            for nm in ranks.nms.values():
                await nm.start()
            await scenario(ranks, controller)
        finally:
            for nm in ranks.nms.values():
                await nm.close()  # SIGKILLs each engine's whole session: nothing outlives the test
            await ranks.aclose()

    asyncio.run(main())


async def scenario(ranks: RealRanks, controller: FakeController) -> None:
    started = time.monotonic()

    async def ready() -> bool:
        return all(nm.supervisor.ready(r) for r, nm in ranks.nms.items())

    await ranks.eventually(ready, within=START_WITHIN, what="both real ranks ready")
    start_sec = time.monotonic() - started

    # discovery: released vLLM found by its routes and instructions, registered as unable to scale down
    async def registered() -> bool:
        for nm in ranks.nms.values():
            await nm.controller_once()
        latest = {r.pod_id: r.ft_capability for r in controller.registrations}
        return all(c.protocol_profile == "vllm-0.32" for c in latest.values()) and len(latest) == 2

    await ranks.eventually(registered, within=30, what="both pods registered the discovered profile")
    capability = controller.registrations[-1].ft_capability
    assert (capability.scale_down_supported, capability.retry_supported) == (False, True)

    # no status poll of a real vLLM is a protocol error (the first poll may come after the registration on a
    # loaded machine: wait for it)
    async def polled() -> bool:
        return all(nm.status().endpoints[0].polls > 0 for nm in ranks.nms.values())

    await ranks.eventually(polled, within=30, what="each rank's status polled")
    for nm in ranks.nms.values():
        endpoint = nm.status().endpoints[0]
        assert endpoint.ft_status == "healthy", endpoint
    assert controller.reports == []

    # the simulator's released checks, against the real ranks
    await released_conformance.released_routes_and_errors(ranks, 0)
    await released_conformance.released_rejection_on_healthy(ranks, 1)
    # no completion before the kill: a request starts a DP wave of lockstep steps, and a survivor still in
    # one meets the dead peer at once; only an idle survivor shows the released "healthy until a request"

    # a killed worker: DEAD reported, time measured
    killed_at = time.monotonic()
    await ranks.kill_worker(1)

    async def dead_reported() -> bool:
        return any(r.endpoint_id == 1 and r.status == "dead" for r in controller.reports)

    await ranks.eventually(dead_reported, within=30, what="rank 1 reported DEAD")
    dead_sec = time.monotonic() - killed_at
    evidence = {r.evidence for r in controller.reports if r.endpoint_id == 1}
    assert evidence & {FaultEvidence.ENGINE_DEAD, FaultEvidence.FT_STATUS}, evidence
    assert not any(r.endpoint_id == 0 for r in controller.reports)  # an idle survivor stays healthy

    # the survivor's next request is aborted (200, finish_reason abort) and it is reported UNHEALTHY
    aborted = await released_conformance.released_completion(ranks, 0)
    assert (aborted["finish_reason"], aborted["text"]) == ("abort", "")

    async def unhealthy_reported() -> bool:
        return any(r.endpoint_id == 0 and r.status == "unhealthy" for r in controller.reports)

    await ranks.eventually(unhealthy_reported, within=60, what="rank 0 reported UNHEALTHY")

    # retry through the NodeManager: the engine's own id is tracked, its failure ends the wait at once
    nm = ranks.nms[0]
    nm.ft_guard(GuardRequest(request_id="round-retry", lease_sec=300))
    sent_at = time.monotonic()
    answer = await nm.ft_apply(NmApplyRequest(instruction="retry", request_id="round-retry", endpoint_ids=[0]))
    assert answer.accepted, answer

    async def retry_failed() -> bool:
        entry = (await nm.ft_status(FtStatusRequest(endpoint_ids=[0]))).entries[0]
        return entry.status is not None and entry.status.ft_state == "failed"

    await ranks.eventually(retry_failed, within=90, what="the retry's failure seen by the round's id")
    retry_sec = time.monotonic() - sent_at
    entry = (await nm.ft_status(FtStatusRequest(endpoint_ids=[0]))).entries[0]
    assert entry.status is not None
    assert entry.status.last_ft_request_id == "round-retry"
    assert entry.status.ft_error
    record({"start_sec": start_sec, "kill_to_dead_reported_sec": dead_sec, "retry_to_failure_seen_sec": retry_sec})
