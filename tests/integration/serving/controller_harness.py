"""A whole serving control plane in one event loop: the real controller, two real NodeManagers, a recording
Coordinator and the engine simulator's in-process fake engines (or, with ``open_plane(sim_processes=...)``, real
``heteroflow engine-sim`` processes that the NodeManagers launch, on real time).

Everything talks through the real HTTP routes (httpx over ASGI transports, no sockets): the controller's
app for the NodeManagers, the NodeManagers' apps for the controller, the engines' apps for the NodeManagers.
The NodeManagers' and the controller's loops run with short intervals on virtual time
(:class:`heteroflow.core.testing.VirtualTimeLoop`: when every task waits, the loop's clock jumps to the next
timer), so a scenario takes as long as its work, not its waits, and runs in the same order every time; the
fake engines' clock is pumped in step with the loop's clock so that their timeouts mean what they say. Tests
read time through :func:`loop_now`, never ``time.monotonic``.

Pod ``a`` runs ranks 0 and 1, pod ``b`` ranks 2 and 3 (4 logical experts + 4 redundant, 2 slots per rank).
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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from heteroflow.contracts.engine_protocol import ProfileName
from heteroflow.contracts.serving import (
    COORDINATOR_ADD_PATH,
    COORDINATOR_CLIENT_OUTCOMES_PATH,
    COORDINATOR_DEL_PATH,
    COORDINATOR_SET_PATH,
    PublishedInstance,
    ViewAddRequest,
    ViewDelRequest,
    ViewResponse,
)
from heteroflow.core.clock import SystemClock
from heteroflow.core.errors import StoreUnavailableError
from heteroflow.core.testing import LoopClock, free_port, run_virtual
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.testing import FakeEngineCluster
from heteroflow.http.tls import client_tls
from heteroflow.serving.controller.assembly import create_app as controller_app
from heteroflow.serving.controller.clients import CoordinatorClient, NodeManagerClient
from heteroflow.serving.controller.config import (
    ControllerConfig,
    ControllerSettings,
    FaultToleranceConfig,
    InstanceConfig,
)
from heteroflow.serving.controller.core.runtime import FallbackStrategy
from heteroflow.serving.controller.service import Controller
from heteroflow.serving.controller.store import FtRuntimeStore, SqliteFtRuntimeStore
from heteroflow.serving.coordinator.assembly import create_app as coordinator_application
from heteroflow.serving.coordinator.service import Coordinator
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.coordinator.testing import TEST_API_KEY_SHA256
from heteroflow.serving.node_manager.assembly import create_app as node_manager_app
from heteroflow.serving.node_manager.client import HttpControllerClient
from heteroflow.serving.node_manager.daemon import NodeManager, PodIdentity
from heteroflow.serving.node_manager.engines import HttpEngineClient
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.spec import InstanceSpec, endpoint_url
from heteroflow.serving.node_manager.supervisor import PopenLauncher
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN, FakeLauncher, fake_cluster_launcher
from tests.support.polling import eventually

PODS = {"a": (0, 1), "b": (2, 3)}
POD_IPS = {"a": "127.0.0.1", "b": "127.0.0.2"}
CONTROLLER_URL = "http://controller"
COORDINATOR_URL = "http://coordinator"

FAST_FT: dict[str, Any] = {
    "enable_dp_scale_down": True,
    "poll_interval_sec": 0.05,
    "request_timeout_sec": 2.0,
    "execution_deadline_sec": 5.0,
    "strategy_center_check_interval": 0.2,
    "serving_view_refresh_sec": 0.2,
    "software_fault_collection_timeout_sec": 3.0,
    "probe_timeout_sec": 2.0,
    "commit_attempts": 3,
}


def instance_spec(
    endpoint_ids: tuple[int, ...],
    *,
    device_infos: dict[int, list[dict[str, Any]]] | None = None,
    ports: SimPorts | None = None,
    **extra: Any,
) -> InstanceSpec:
    """``device_infos``: endpoint id → its devices (``{"device_id": ..., "index": ...}``); default none.
    ``ports``: the real engine processes' ports (default the fake engines' fixed ones)."""
    devices = device_infos or {}
    return InstanceSpec.model_validate(
        {
            "instance_id": "inst-1",
            "dp_size": 4,
            "dp_master_ip": "127.0.0.1",
            "dp_rpc_port": ports.rpc if ports else 29500,
            "dp_store_port": ports.store if ports else 29600,
            "num_logical_experts": 4,
            "num_redundant_experts": 4,
            "endpoints": [
                {
                    "id": eid,
                    "port": ports.engines[eid] if ports else 8100 + eid,
                    **({"device_infos": devices[eid]} if eid in devices else {}),
                }
                for eid in endpoint_ids
            ],
            **extra,
        }
    )


@dataclass(frozen=True)
class SimPorts:
    """Free loopback ports for a plane whose NodeManagers launch real ``heteroflow engine-sim`` processes."""

    engines: dict[int, int]
    rpc: int
    store: int

    @classmethod
    def free(cls) -> SimPorts:
        return cls({r: free_port() for r in range(4)}, free_port(), free_port())

    def url(self, rank: int) -> str:
        pod = next(name for name, ids in PODS.items() if rank in ids)
        return endpoint_url(POD_IPS[pod], self.engines[rank])


def loop_now() -> float:
    """The running loop's clock: the controller's and the plane's time (virtual under :func:`run_plane`)."""
    return asyncio.get_running_loop().time()


NmHook = Callable[[str, httpx.Request], Awaitable[httpx.Response | None]]
"""Called with (pod name, request) before the controller's request reaches a NodeManager; a response
returned here replaces the NodeManager's answer (an injected failure)."""


class _HookedTransport(httpx.AsyncBaseTransport):
    def __init__(self, name: str, app: FastAPI, hooks: list[NmHook]) -> None:
        self._name, self._inner, self._hooks = name, httpx.ASGITransport(app=app), hooks

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        for hook in list(self._hooks):
            replaced = await hook(self._name, request)
            if replaced is not None:
                return replaced
        return await self._inner.handle_async_request(request)


@dataclass
class RecordingCoordinator:
    """The Coordinator's management side, recording every operation (the real one has its own tests)."""

    ops: list[tuple[str, list[int]]] = field(default_factory=list)
    faulted: list[tuple[list[int], int | None]] = field(default_factory=list)
    """The DELs that named faulted ranks (the controller's first-report withdrawals), with their generation."""
    views: dict[str, PublishedInstance] = field(default_factory=dict)
    down: bool = False
    outcome_queries: list[dict[str, str]] = field(default_factory=list)
    """Each ``GET /coordinator/client_outcomes`` the controller sent (its query)."""
    outcomes: dict[str, Any] = field(
        default_factory=lambda: {
            "held": 3, "rerouted": 2, "resumed": 1, "failed": 0, "longest_wait_sec": 7.5, "complete": True
        }
    )  # fmt: skip
    """What that route answers."""

    def app(self) -> FastAPI:
        app = FastAPI()

        def answer() -> JSONResponse:
            return JSONResponse(ViewResponse(instances=list(self.views.values())).model_dump(mode="json"))

        @app.post(COORDINATOR_DEL_PATH)
        async def delete(request: Request) -> JSONResponse:
            if self.down:
                return JSONResponse({"detail": "down"}, status_code=503)
            body = ViewDelRequest.model_validate_json(await request.body())
            self.ops.append(("DEL", body.endpoint_ids))
            if body.faulted:
                self.faulted.append((body.endpoint_ids, body.generation))
            view = self.views.get(body.instance_id)
            if view is not None:
                kept = [e for e in view.endpoints if e.id not in body.endpoint_ids]
                self.views[body.instance_id] = view.model_copy(update={"endpoints": kept})
            return answer()

        @app.post(COORDINATOR_ADD_PATH)
        async def add(request: Request) -> JSONResponse:
            if self.down:
                return JSONResponse({"detail": "down"}, status_code=503)
            body = ViewAddRequest.model_validate_json(await request.body())
            self.ops.append(("ADD", [e.id for e in body.endpoints]))
            old = self.views.get(body.instance_id)
            merged = {e.id: e for e in (old.endpoints if old else [])} | {e.id: e for e in body.endpoints}
            self.views[body.instance_id] = PublishedInstance(
                instance_id=body.instance_id,
                model=body.model,
                endpoints=[merged[k] for k in sorted(merged)],
                generation=body.generation,
            )
            return answer()

        @app.get(COORDINATOR_CLIENT_OUTCOMES_PATH)
        async def client_outcomes(request: Request) -> JSONResponse:
            if self.down:
                return JSONResponse({"detail": "down"}, status_code=503)
            self.outcome_queries.append(dict(request.query_params))
            return JSONResponse(self.outcomes)

        @app.post(COORDINATOR_SET_PATH)
        async def set_(request: Request) -> JSONResponse:
            if self.down:
                return JSONResponse({"detail": "down"}, status_code=503)
            body = ViewAddRequest.model_validate_json(await request.body())
            self.ops.append(("SET", [e.id for e in body.endpoints]))
            self.views[body.instance_id] = PublishedInstance(
                instance_id=body.instance_id, model=body.model, endpoints=body.endpoints, generation=body.generation
            )
            return answer()

        return app

    def published(self, instance_id: str = "inst-1") -> list[int]:
        view = self.views.get(instance_id)
        return [] if view is None else [e.id for e in view.endpoints]


class EngineRouter(httpx.AsyncBaseTransport):
    """The real Coordinator's upstream side in memory: ``http://<pod ip>:<810r>`` → fake engine ``r``.

    Like httpcore it calls the ``trace`` extension around writing the request headers (where the Coordinator
    re-checks the view), and it records when each request really reached an engine."""

    def __init__(self, cluster: FakeEngineCluster) -> None:
        self._cluster = cluster
        self.received: list[tuple[int, float]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        rank = (request.url.port or 0) - 8100
        if rank not in self._cluster.cores or self._cluster.is_gone(rank):
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        trace = request.extensions.get("trace")
        if trace is not None:
            await trace("http11.send_request_headers.started", {"request": request})
            await trace("http11.send_request_headers.complete", {"return_value": None})
        self.received.append((rank, loop_now()))
        inner = self._cluster.client(rank)
        forwarded = inner.build_request(request.method, request.url.path, content=await request.aread())
        forwarded.headers.update({k: v for k, v in request.headers.items() if k.lower() == "content-type"})
        response = await inner.send(forwarded)
        data = await response.aread()
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return httpx.Response(response.status_code, headers=headers, stream=httpx.ByteStream(data))


@dataclass(frozen=True)
class ViewCall:
    """One view operation the controller sent: when it left, when its answer came back, and the endpoints of
    ``inst-1`` the Coordinator's answer says are published once it applied (``None``: not a view answer)."""

    op: str
    sent: float
    done: float
    published: frozenset[int] | None


class TimedTransport(httpx.AsyncBaseTransport):
    """Records each view operation: when it left the controller, when its answer came back, and what it left
    published (a DEL withdraws only the ranks it names: a rank's first fault report withdraws that rank alone)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, instance_id: str = "inst-1") -> None:
        self._inner = inner
        self._instance_id = instance_id
        self.calls: list[ViewCall] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sent = loop_now()
        response = await self._inner.handle_async_request(request)
        if not request.url.path.startswith("/coordinator/manage/"):
            return response  # not a view operation (the rounds' client outcomes, say)
        data = await response.aread()
        op = request.url.path.rsplit("/", 1)[-1].upper()
        self.calls.append(ViewCall(op, sent, loop_now(), self._published(response.status_code, data)))
        return response

    def _published(self, status: int, data: bytes) -> frozenset[int] | None:
        if status != 200:
            return None
        view = ViewResponse.model_validate_json(data)
        found = [i for i in view.instances if i.instance_id == self._instance_id]
        return frozenset(e.id for i in found for e in i.endpoints)

    def withdrawn_windows(self, rank: int) -> list[tuple[float, float]]:
        """When ``rank`` was withdrawn: from the return of each operation whose answer left it out, to the send
        of the first operation answered after that one which published it again (``inf``: never again). A
        request that reaches ``rank`` inside a window broke "nothing reaches a withdrawn endpoint after its
        DEL returned" (``docs/coordinator.md``); operations that overlap in time only shorten a window."""
        windows: list[tuple[float, float]] = []
        for out in self.calls:
            if out.published is None or rank in out.published:
                continue
            back = [c.sent for c in self.calls if c.published and rank in c.published and c.done > out.done]
            windows.append((out.done, min(back, default=float("inf"))))
        return windows


class ControllerLink:
    """One controller incarnation's reach: cut when the test kills it (its crash hook fired), after which
    everything it sends, to the NodeManagers, the Coordinator or the store, fails as from a dead process."""

    def __init__(self) -> None:
        self.alive = True
        self.exit_codes: list[int] = []

    def kill(self, code: int) -> None:
        self.alive = False
        self.exit_codes.append(code)

    def check(self, request: httpx.Request | None = None) -> None:
        if not self.alive:
            raise httpx.ConnectError("the controller process is gone", request=request)


class _LinkedStore:
    """The runtime store as one controller incarnation sees it: unreachable once its link is cut."""

    def __init__(self, inner: FtRuntimeStore, link: ControllerLink) -> None:
        self._inner, self._link = inner, link

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name == "close" or not callable(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            if not self._link.alive:
                raise StoreUnavailableError("the controller process is gone")
            return await attr(*args, **kwargs)

        return call


class _LinkedTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport, link: ControllerLink) -> None:
        self._inner, self._link = inner, link

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self._link.check(request)
        return await self._inner.handle_async_request(request)


class _ControllerApp:
    """The controller's address: the NodeManagers and the test reach whichever incarnation runs now, and get
    connection errors while none does."""

    def __init__(self) -> None:
        self.app: FastAPI | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.app is None:
            raise httpx.ConnectError("no controller is running")
        await self.app(scope, receive, send)


@dataclass
class Plane:
    cluster: FakeEngineCluster
    controller: Controller
    coordinator: RecordingCoordinator
    node_managers: dict[str, NodeManager]
    launchers: dict[str, FakeLauncher]
    http: httpx.AsyncClient
    """The controller's API, with the cluster token."""
    hooks: list[NmHook] = field(default_factory=list)
    nm_apps: dict[str, FastAPI] = field(default_factory=dict)
    real_coordinator: FastAPI | None = None
    """The real Coordinator's app when the plane runs with one (``run_plane(real_coordinator=True)``)."""
    engine_router: EngineRouter | None = None
    view_calls: TimedTransport | None = None
    link: ControllerLink = field(default_factory=ControllerLink)
    """The running controller's reach (:meth:`restart_controller` makes a new one)."""
    restart: Callable[[str | None], Awaitable[Controller]] | None = None

    async def killed(self, *, within: float) -> int:
        """Wait until the controller's crash hook fired; its exit code."""
        return await eventually(
            lambda: self.link.exit_codes[0] if self.link.exit_codes else None,
            within=within,
            what="the controller's crash hook fires",
        )

    async def restart_controller(self, *, crash_at: str | None = None) -> Controller:
        """Stop what is left of the controller (its tasks; its link is cut already when its crash hook fired) and
        start a new one on the same store, as a supervisor restarts a killed process. ``crash_at``: the new
        one's crash hook fires at that step of a round."""
        assert self.restart is not None
        self.controller = await self.restart(crash_at)
        return self.controller

    async def status(self) -> dict[str, Any]:
        response = await self.http.get("/controller/fault_tolerance/status")
        assert response.status_code == 200, response.text
        entries = response.json()
        assert len(entries) <= 1, entries
        return dict(entries[0]) if entries else {"phase": None, "can_serve": False, "published_endpoints": []}

    async def round(self, request_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/controller/fault_tolerance/rounds/{request_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def until(self, check: Callable[[dict[str, Any]], bool], *, within: float, what: str) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            status = await self.status()
            return status if check(status) else None

        return await eventually(probe, within=within, what=what, period=0.02)

    async def kill_and_traffic(self, *victims: int) -> None:
        """The A1 injection: the victims' workers die; one request per survivor meets the broken collective."""
        for victim in victims:
            self.cluster.kill_worker(victim)
        alive = [r for r in range(4) if r not in victims and r not in self.controller_dead()]
        await conformance.traffic(self.cluster, alive)

    def controller_dead(self) -> set[int]:
        inst = self.controller.instances.get("inst-1")  # type: ignore[call-overload]
        return set() if inst is None else set(inst.runtime.dead_committed)

    def in_round(self) -> bool:
        """A scale-down round is in flight (hooks that inject into a round's own polls check this: the
        controller also queries the NodeManagers' status route while it collects evidence)."""
        return self.controller.in_round("inst-1")

    async def nm_post(self, name: str, path: str, body: object) -> httpx.Response:
        """A request to a NodeManager's own route, as the controller would send it."""
        transport = httpx.ASGITransport(app=self.nm_apps[name])
        async with httpx.AsyncClient(transport=transport, base_url=f"http://nm-{name}") as client:
            return await client.post(path, json=body, headers={"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"})

    async def completion(self, rank: int, prompt: str = "hello") -> str:
        response = await conformance.complete(self.cluster, rank, prompt)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["text"])


async def _pump(cluster: FakeEngineCluster) -> None:
    """Move the fake engines' clock with the loop's (their timers and the NodeManagers' run on it): the process
    plane, on real time."""
    last = loop_now()
    while True:
        await asyncio.sleep(0.01)  # the pump's own period
        now = loop_now()
        cluster.clock.advance(now - last)
        last = now
        cluster.tick()


#: The in-process plane's NodeManagers: how often each polls a ready engine's FT status and how often it beats
#: (the controller's registration answer sets the same period). On virtual time a wait costs nothing but every
#: poll and beat is a request through the real routes: these two were most of the plane's CPU at 0.05 s and
#: 0.1 s, and are still far inside every window the fast FT settings give a round (collection 3 s, deadline 5 s).
#: (The process plane keeps 0.05 s and 0.1 s: there the time goes to the controller process, not to these.)
NODE_MANAGER_POLL_SEC = 0.2
HEARTBEAT_SEC = 0.25

#: How often the in-process plane fires the fake engines' timeouts (their clock is the loop's own, so nothing
#: else needs moving): a timeout fires at most this late, in virtual time. Each tick is a wake-up of the whole
#: loop, and at 0.01 s the ticks were most of the plane's CPU.
ENGINE_TICK_SEC = 0.05


async def _tick(cluster: FakeEngineCluster) -> None:
    while True:
        await asyncio.sleep(ENGINE_TICK_SEC)  # the engines' timeouts are checked at a tick, as in the simulator
        cluster.tick()


@contextlib.asynccontextmanager
async def open_plane(
    tmp_path: Path,
    *,
    ft: dict[str, Any] | None = None,
    store: Callable[[], FtRuntimeStore] | None = None,
    slots_per_rank: int | None = None,
    cluster_token: str = TEST_CLUSTER_TOKEN,
    spec_extra: dict[str, Any] | None = None,
    assembled: Callable[[dict[str, Any]], bool] | None = None,
    real_coordinator: bool = False,
    node_names: dict[str, str] | None = None,
    device_infos: dict[int, list[dict[str, Any]]] | None = None,
    node_manager_poll_sec: float = NODE_MANAGER_POLL_SEC,
    profile_name: ProfileName | None = None,
    crash_at: str | None = None,
    fallback: FallbackStrategy | None = None,
    diagnosing_sec: float = 0.0,
    sim_processes: SimPorts | None = None,
    ready_within: float = 10.0,
    elastic_ep: bool = False,
) -> AsyncIterator[Plane]:
    """The plane started in the running loop, assembled and published; stopped on exit.

    ``node_names``: pod name (``a``, ``b``) → the Kubernetes node it registers; ``device_infos``: endpoint id
    → its devices. Both default to none (pods without node names or devices: hardware faults are unmappable).
    ``profile_name``: the engines speak it and the NodeManagers discover it (default: ``scale-down`` at a
    known prefix). ``fallback``: the instance's configured (original) fallback; ``diagnosing_sec``: how long a
    faulted engine reads ``diagnosing`` (vLLM 0.34; 0 skips it). ``crash_at``: the first controller's crash hook
    fires at that step of a round (the test-only
    ``crash_at_step``): its link is cut there, and :meth:`Plane.restart_controller` starts the next one.
    ``sim_processes``: the NodeManagers launch real ``heteroflow engine-sim`` processes on these ports (through
    their real launcher, logs under ``tmp_path``) instead of the fake engines, whose cluster is then unused; run
    such a plane on real time (``run_plane(virtual_time=False)``) and give it ``ready_within`` to start.
    ``elastic_ep``: the fake engines serve vLLM 0.34's elastic EP routes (a resize to another size fails there).
    """

    cluster = FakeEngineCluster(
        dp_size=4,
        slots_per_rank=slots_per_rank,
        profile_name=profile_name or "vllm-0.34",
        engine_clock=LoopClock(start=datetime.now(UTC)),
        diagnosing_sec=diagnosing_sec,
        enable_elastic_ep=elastic_ep,
    )
    await cluster.start()
    coordinator = RecordingCoordinator()
    coordinator_app = coordinator.app()
    router: EngineRouter | None = None
    timed: TimedTransport | None = None
    real: Coordinator | None = None
    if real_coordinator:
        router = EngineRouter(cluster)
        real = Coordinator(
            settings=CoordinatorSettings.load(
                cluster_token=cluster_token, api_key_hashes=TEST_API_KEY_SHA256, unavailable_wait_sec=5.0
            ),
            upstream_transport=router,
        )
        coordinator_app = coordinator_application(real)
        timed = TimedTransport(httpx.ASGITransport(app=coordinator_app))
    nm_apps: dict[str, FastAPI] = {}
    hooks: list[NmHook] = []

    def transport_for(url: str) -> httpx.AsyncBaseTransport | None:
        if url == COORDINATOR_URL:
            return timed or httpx.ASGITransport(app=coordinator_app)
        name = url.removeprefix("http://nm-")
        return _HookedTransport(name, nm_apps[name], hooks)

    address = _ControllerApp()

    def incarnation(link: ControllerLink, crash: str | None) -> Controller:
        config = ControllerConfig(
            settings=ControllerSettings.load(
                cluster_token=cluster_token, heartbeat_interval_sec=HEARTBEAT_SEC, crash_at_step=crash
            ),
            ft=FaultToleranceConfig.load(**{**FAST_FT, **(ft or {})}),
            instances={} if fallback is None else {"inst-1": InstanceConfig(fallback=fallback)},
        )

        def linked(url: str) -> httpx.AsyncBaseTransport | None:
            inner = transport_for(url)
            return None if inner is None else _LinkedTransport(inner, link)

        made = Controller(
            config=config,
            store=cast(
                FtRuntimeStore,
                _LinkedStore(store() if store is not None else SqliteFtRuntimeStore(tmp_path / "ft.db"), link),
            ),
            node_managers=NodeManagerClient(cluster_token=cluster_token, timeout_sec=2.0, transport_for=linked),
            coordinator=CoordinatorClient(
                COORDINATOR_URL, cluster_token=cluster_token, timeout_sec=2.0, transport_for=linked
            ),
            clock=LoopClock(start=datetime.now(UTC)),
            exit_process=link.kill if crash is not None else _refuse_exit,
        )
        address.app = controller_app(made, cluster_token=cluster_token)
        return made

    first_link = ControllerLink()
    controller = incarnation(first_link, crash_at)
    current = [controller]  # the incarnation running now, closed at the end
    capp = address
    node_managers: dict[str, NodeManager] = {}
    launchers: dict[str, FakeLauncher] = {}
    pump = asyncio.create_task(_tick(cluster))
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=capp),
        base_url=CONTROLLER_URL,
        headers={"Authorization": f"Bearer {cluster_token}"},
    )
    try:
        await controller.start()
        for name, ids in PODS.items():
            launcher = fake_cluster_launcher(cluster)
            spec = instance_spec(ids, device_infos=device_infos, ports=sim_processes, **(spec_extra or {}))
            engines = HttpEngineClient(cluster.client, ft_path_prefix=None if profile_name else cluster.prefix)
            if sim_processes is not None:
                engines = HttpEngineClient.for_urls(
                    {e.id: sim_processes.url(e.id) for e in spec.endpoints}, cluster_token=cluster_token
                )
            nm = NodeManager(
                spec=spec,
                settings=NodeManagerSettings.load(
                    cluster_token=cluster_token,
                    engine_ft_poll_interval_sec=node_manager_poll_sec,
                    engine_ft_status_timeout_sec=1.0,
                    engine_death_suicide_grace_sec=60.0,
                    heartbeat_interval_sec=HEARTBEAT_SEC,
                ),
                pod=PodIdentity(
                    pod_id=f"pod-{name}",
                    pod_ip=POD_IPS[name],
                    node_manager_url=f"http://nm-{name}",
                    node_name=(node_names or {}).get(name, ""),
                ),
                controller=HttpControllerClient(
                    CONTROLLER_URL,
                    cluster_token=cluster_token,
                    timeout_sec=2.0,
                    transport=httpx.ASGITransport(app=capp),
                ),
                engines=engines,
                launcher=launcher if sim_processes is None else PopenLauncher(log_dir=tmp_path / f"engines-{name}"),
                clock=cluster.engine_clock if sim_processes is None else SystemClock(),
            )
            nm_apps[name] = node_manager_app(nm, cluster_token=cluster_token)
            node_managers[name] = nm
            if sim_processes is None:
                launchers[name] = launcher  # (the real launcher records nothing to read back)
            await nm.start()
        plane = Plane(cluster, controller, coordinator, node_managers, launchers, http, hooks, nm_apps)
        plane.link = first_link

        async def restart(crash: str | None) -> Controller:
            plane.link.alive = False
            address.app = None
            await plane.controller.close()
            plane.link = ControllerLink()
            made = incarnation(plane.link, crash)
            current[0] = made
            await made.start()
            return made

        plane.restart = restart
        if real is not None:
            plane.real_coordinator, plane.engine_router, plane.view_calls = coordinator_app, router, timed
        await plane.until(
            assembled or (lambda s: s["can_serve"] and len(s["published_endpoints"]) == 4),
            within=ready_within,
            what="the instance is assembled and published",
        )
        yield plane
    finally:
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump
        await http.aclose()
        await current[0].close()
        if real is not None:
            await real.aclose()
        for nm in node_managers.values():
            await nm.close()
        await cluster.close()


def run_plane(
    scenario: Callable[[Plane], Awaitable[None]], tmp_path: Path, *, virtual_time: bool = True, **options: Any
) -> None:
    """Run ``scenario`` on a plane made by :func:`open_plane` with ``options``. ``virtual_time``: on a
    :class:`~heteroflow.core.testing.VirtualTimeLoop` (the default; ``False``: on asyncio's loop, in real time,
    for a plane that waits on a socket, a thread or a clock of its own)."""

    async def main() -> None:
        async with open_plane(tmp_path, **options) as plane:
            await scenario(plane)

    if virtual_time:
        run_virtual(main())
    else:
        asyncio.run(main())


def _refuse_exit(code: int) -> None:
    raise AssertionError(f"the crash hook fired in-process (exit {code})")


# == the controller as a real process (crash injection, store outages) =========================================
@dataclass
class ProcessPlane:
    """The controller runs as ``heteroflow controller`` in a subprocess (several, active/standby, when
    ``controllers > 1``: controller *i* listens on ``ports[i]``); NodeManagers and fake engines run in the test's
    loop, served by uvicorn on real loopback ports, and are given every controller's URL."""

    cluster: FakeEngineCluster
    node_managers: dict[str, NodeManager]
    launchers: dict[str, FakeLauncher]
    config_path: Path
    ports: list[int]
    log_dir: Path
    applies: list[tuple[str, str]] = field(default_factory=list)
    """(pod, request_id) of every apply that reached a NodeManager."""
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[int, Path] = field(default_factory=dict)
    starts: int = 0

    def url_of(self, index: int = 0) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"

    def start_controller(
        self, *, crash_at: str | None = None, extra_env: dict[str, str] | None = None, index: int = 0
    ) -> None:
        env = {**os.environ, "HETEROFLOW_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN, **(extra_env or {})}
        env.pop("HETEROFLOW_CONTROLLER_CRASH_AT_STEP", None)
        if crash_at is not None:
            env["HETEROFLOW_CONTROLLER_CRASH_AT_STEP"] = crash_at
        env["HETEROFLOW_CONTROLLER_PORT"] = str(self.ports[index])
        env["HETEROFLOW_CONTROLLER_ID"] = f"controller-{index}"
        env["HETEROFLOW_CONTROLLER_ADVERTISE_URL"] = self.url_of(index)
        self.starts += 1
        self.logs[index] = self.log_dir / f"controller-{self.starts}.log"
        with self.logs[index].open("wb") as log:  # the child keeps its own fd
            self.processes[index] = subprocess.Popen(
                [sys.executable, "-m", "heteroflow.cli.main", "controller", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def stop_controller(self, index: int | None = None) -> None:
        """SIGKILL controller ``index`` (every one when ``None``)."""
        for i, process in self.processes.items():
            if (index is None or i == index) and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)

    def controller_log(self, index: int = 0) -> str:
        return self.logs[index].read_text(errors="replace")

    async def get(self, path: str, *, index: int = 0) -> httpx.Response | None:
        async with httpx.AsyncClient(
            headers={"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}, verify=client_tls()
        ) as http:
            try:
                return await http.get(self.url_of(index) + path, timeout=2.0)
            except httpx.TransportError:
                return None

    async def status(self, index: int = 0) -> dict[str, Any] | None:
        response = await self.get("/controller/fault_tolerance/status", index=index)
        if response is None or response.status_code != 200:
            return None
        entries = response.json()
        return dict(entries[0]) if entries else None

    async def until(
        self, check: Callable[[dict[str, Any]], bool], *, within: float, what: str, index: int = 0
    ) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            status = await self.status(index)
            return status if status is not None and check(status) else None

        return await eventually(probe, within=within, what=what, period=0.05)

    async def exited(self, *, within: float, index: int = 0) -> int:
        process = self.processes[index]
        start = time.monotonic()
        while process.poll() is None:
            if time.monotonic() - start > within:
                raise TimeoutError(f"controller {index} did not exit within {within} s")
            await asyncio.sleep(0.05)
        return int(process.returncode)

    async def kill_and_traffic(self, *victims: int) -> None:
        for victim in victims:
            self.cluster.kill_worker(victim)
        await conformance.traffic(self.cluster, [r for r in range(4) if r not in victims])


def run_process_plane(
    scenario: Callable[[ProcessPlane], Awaitable[None]],
    tmp_path: Path,
    *,
    store_url: str | None = None,
    ft: dict[str, Any] | None = None,
    controllers: int = 1,
    controller_settings: dict[str, Any] | None = None,
) -> None:
    import uvicorn
    import yaml

    async def main() -> None:
        cluster = FakeEngineCluster(dp_size=4)
        await cluster.start()
        ports = [free_port() for _ in range(controllers)]
        log_dir = tmp_path / "logs"
        log_dir.mkdir()
        config_path = tmp_path / "controller.yaml"
        config_path.write_text(
            yaml.safe_dump(
                {
                    "controller": {
                        "store_url": store_url or f"sqlite:///{tmp_path / 'ft.db'}",
                        "heartbeat_interval_sec": 0.1,
                        "store_timeout_sec": 1.0,
                        **(controller_settings or {}),
                    },
                    "fault_tolerance_config": {**FAST_FT, **(ft or {})},
                }
            )
        )
        plane = ProcessPlane(cluster, {}, {}, config_path, ports, log_dir)
        servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []
        pump = asyncio.create_task(_pump(cluster))
        try:
            for name, ids in PODS.items():
                nm_port = free_port()
                launcher = fake_cluster_launcher(cluster)
                nm = NodeManager(
                    spec=instance_spec(ids),
                    settings=NodeManagerSettings.load(
                        cluster_token=TEST_CLUSTER_TOKEN,
                        engine_ft_poll_interval_sec=0.05,
                        engine_ft_status_timeout_sec=1.0,
                        engine_death_suicide_grace_sec=60.0,
                        heartbeat_interval_sec=0.1,
                    ),
                    pod=PodIdentity(
                        pod_id=f"pod-{name}", pod_ip=POD_IPS[name], node_manager_url=f"http://127.0.0.1:{nm_port}"
                    ),
                    controller=HttpControllerClient(
                        ",".join(plane.url_of(i) for i in range(controllers)),
                        cluster_token=TEST_CLUSTER_TOKEN,
                        timeout_sec=2.0,
                    ),
                    engines=HttpEngineClient(cluster.client, ft_path_prefix=cluster.prefix),
                    launcher=launcher,
                    clock=cluster.clock,
                )
                app = node_manager_app(nm, cluster_token=TEST_CLUSTER_TOKEN)

                @app.middleware("http")
                async def count_applies(request: Request, call_next: Any, pod: str = name) -> Any:
                    if request.url.path == "/node-manager/fault-tolerance/apply":
                        body = await request.body()
                        plane.applies.append((pod, str(json.loads(body).get("request_id"))))
                    return await call_next(request)

                server = uvicorn.Server(
                    uvicorn.Config(app, host="127.0.0.1", port=nm_port, log_config=None, lifespan="off")
                )
                servers.append((server, asyncio.create_task(server.serve())))
                plane.node_managers[name] = nm
                plane.launchers[name] = launcher
                await nm.start()
            await scenario(plane)
        finally:
            plane.stop_controller()
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            for server, task in servers:
                server.should_exit = True
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for nm in plane.node_managers.values():
                await nm.close()
            await cluster.close()

    asyncio.run(main())
