"""A 4-rank in-process instance (the engine simulator's fake) served by two NodeManagers, no sockets.

Pod ``a`` runs ranks 0 and 1, pod ``b`` ranks 2 and 3. Engines are the simulator's in-process fakes; the
NodeManagers' processes are :class:`FakeProcess` objects bound to them; the controller is the recording
:class:`FakeController`; time is the cluster's :class:`FakeClock`, and the NodeManagers' loops are not
started: tests call each loop's step (``poll_once``, ``supervise_once``, ``controller_once``) themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from heteroflow.contracts.engine_protocol import ProfileName
from heteroflow.contracts.serving import FtFlags
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.testing import FakeEngineCluster
from heteroflow.serving.node_manager.assembly import create_app
from heteroflow.serving.node_manager.daemon import NodeManager, PodIdentity
from heteroflow.serving.node_manager.engines import HttpEngineClient
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.spec import InstanceSpec
from heteroflow.serving.node_manager.testing import (
    TEST_CLUSTER_TOKEN,
    FakeController,
    FakeLauncher,
    fake_cluster_launcher,
)

PODS = {"a": (0, 1), "b": (2, 3)}
STORE_PORT = 29600


def instance_spec(endpoint_ids: tuple[int, ...], **extra: Any) -> InstanceSpec:
    return InstanceSpec.model_validate(
        {
            "instance_id": "inst-1",
            "dp_size": 4,
            "dp_master_ip": "127.0.0.1",
            "dp_rpc_port": 29500,
            "dp_store_port": STORE_PORT,
            "num_logical_experts": 4,
            "num_redundant_experts": 4,
            "endpoints": [{"id": eid, "port": 8100 + eid} for eid in endpoint_ids],
            **extra,
        }
    )


@dataclass
class Pod:
    name: str
    nm: NodeManager
    http: httpx.AsyncClient
    launcher: FakeLauncher

    async def post(self, path: str, body: object, *, token: str | None = TEST_CLUSTER_TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return await self.http.post(path, json=body, headers=headers)


@dataclass
class Harness:
    cluster: FakeEngineCluster
    controller: FakeController
    pods: dict[str, Pod]

    async def settle(self) -> None:
        await self.cluster.settle()

    async def poll_all(self) -> None:
        await self.settle()
        for pod in self.pods.values():
            for eid in sorted(pod.nm.spec.endpoint_ids):
                if await pod.nm.check_ready(eid):
                    await pod.nm.poll_once(eid)

    async def traffic(self, ranks: list[int]) -> None:
        await conformance.traffic(self.cluster, ranks)
        await self.settle()


def make_node_manager(
    cluster: FakeEngineCluster,
    controller: FakeController,
    endpoint_ids: tuple[int, ...],
    *,
    name: str,
    launcher: FakeLauncher | None = None,
    client_for: Callable[[int], httpx.AsyncClient] | None = None,
    settings: dict[str, Any] | None = None,
    spec_extra: dict[str, Any] | None = None,
    discover: bool = False,
) -> tuple[NodeManager, FakeLauncher]:
    """``discover``: the engine client knows no route prefix; the NodeManager finds the engines' profile."""
    launcher = launcher or fake_cluster_launcher(cluster)
    nm = NodeManager(
        spec=instance_spec(endpoint_ids, **(spec_extra or {})),
        settings=NodeManagerSettings.load(
            cluster_token=TEST_CLUSTER_TOKEN, engine_death_suicide_grace_sec=60.0, **(settings or {})
        ),
        pod=PodIdentity(pod_id=f"pod-{name}", pod_ip="127.0.0.1", node_manager_url=f"http://nm-{name}"),
        controller=controller,
        engines=HttpEngineClient(client_for or cluster.client, ft_path_prefix=None if discover else cluster.prefix),
        launcher=launcher,
        clock=cluster.clock,
    )
    return nm, launcher


def run_instance(
    scenario: Callable[[Harness], Awaitable[None]],
    *,
    flags: FtFlags | None = None,
    settings: dict[str, Any] | None = None,
    register: bool = True,
    profile_name: ProfileName | None = None,
    elastic_ep: bool = False,
) -> None:
    """Start the fake instance and both NodeManagers, run ``scenario``, tear everything down.

    ``profile_name``: the engines speak it and the NodeManagers discover it (default: the scale-down
    profile at a known prefix, no discovery)."""

    async def main() -> None:
        cluster = FakeEngineCluster(dp_size=4, profile_name=profile_name or "vllm-0.34", enable_elastic_ep=elastic_ep)
        await cluster.start()
        controller = FakeController(flags=flags or FtFlags(enable_dp_scale_down_proxy=True))
        pods: dict[str, Pod] = {}
        try:
            for name, ids in PODS.items():
                nm, launcher = make_node_manager(
                    cluster, controller, ids, name=name, settings=settings, discover=profile_name is not None
                )
                await nm.start(loops=False)
                app = create_app(nm, cluster_token=TEST_CLUSTER_TOKEN)
                http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://nm-{name}")
                pods[name] = Pod(name=name, nm=nm, http=http, launcher=launcher)
                if register:
                    await nm.controller_once()
            harness = Harness(cluster=cluster, controller=controller, pods=pods)
            await harness.poll_all()
            await scenario(harness)
        finally:
            for pod in pods.values():
                await pod.http.aclose()
                await pod.nm.close()
            await cluster.close()

    asyncio.run(main())
