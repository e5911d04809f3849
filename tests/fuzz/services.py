"""Every HTTP service of HeteroFlow, built in process with its fakes, for the fuzz tests.

Each builder is an async context manager that starts the service in the running event loop and yields a
:class:`Service`: its ASGI application, the headers a legitimate caller sends, and the routes that take a
JSON body. Nothing opens a socket: outside systems are the packages' own fakes (the engine simulator's
in-process engines, the NodeManager's recording controller) or an in-memory transport.

:class:`Hosted` wraps a builder into one ASGI application whose lifespan starts and stops the service, so that
schemathesis drives it in the event loop it runs requests in, and which serves the service's OpenAPI
document at ``/openapi.json`` whatever the service itself publishes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from heteroflow.contracts.serving import (
    COORDINATOR_ADD_PATH,
    COORDINATOR_DEL_PATH,
    COORDINATOR_SET_PATH,
    HEARTBEAT_PATH,
    NM_ENGINES_RESTART_PATH,
    NM_ENGINES_START_PATH,
    NM_ENGINES_STOP_PATH,
    NM_FT_APPLY_PATH,
    NM_FT_FINALIZE_PATH,
    NM_FT_GUARD_PATH,
    NM_FT_NUDGE_PATH,
    NM_FT_PROBE_PATH,
    NM_FT_STATUS_PATH,
    REGISTER_PATH,
    REPORT_HARDWARE_FAULT_PATH,
    REPORT_SOFTWARE_FAULT_PATH,
    FtFlags,
)
from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import FakeClock
from heteroflow.engine_sim import assembly as engine_server
from heteroflow.engine_sim.testing import TEST_CLUSTER_TOKEN as ENGINE_TOKEN
from heteroflow.engine_sim.testing import FakeEngineCluster
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform_server import assembly as platform_app
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.routes import serving as serving_routes
from heteroflow.platform_server.routes.serving import ControllerProxy
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.serving.controller import assembly as controller_app
from heteroflow.serving.controller.clients import NodeManagerClient
from heteroflow.serving.controller.config import ControllerConfig, ControllerSettings, FaultToleranceConfig
from heteroflow.serving.controller.service import Controller
from heteroflow.serving.controller.store import SqliteFtRuntimeStore
from heteroflow.serving.coordinator import assembly as coordinator_app
from heteroflow.serving.coordinator.service import Coordinator
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.coordinator.testing import TEST_API_KEY, TEST_API_KEY_SHA256
from heteroflow.serving.node_manager import assembly as node_manager_app
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN as NODE_MANAGER_TOKEN
from heteroflow.serving.node_manager.testing import FakeController
from heteroflow.storage.db import create_db_engine
from heteroflow.storage.token_store import SqlTokenStore
from tests.unit.serving.harness import make_node_manager

CONTROLLER_TOKEN = "fuzz-controller-cluster-token"


@dataclass
class Service:
    name: str
    app: FastAPI
    headers: dict[str, str]
    """What a legitimate caller sends on every route (the service's token or key)."""
    json_routes: tuple[str, ...]
    """Every route that takes a JSON body (all are POSTs), as path templates."""
    path_values: dict[str, str] = field(default_factory=dict)
    """Path parameters that must name something that exists for the route to read a body at all (a heartbeat
    is refused on its head unless its node exists)."""


Builder = Callable[[Path], AbstractAsyncContextManager[Service]]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused (no such process in the fuzz tests)", request=request)


# == the serving controller =================================================================================
@asynccontextmanager
async def controller(tmp: Path) -> AsyncIterator[Service]:
    """The real controller on a SQLite runtime store; its NodeManagers are unreachable, its loops not started."""
    config = ControllerConfig(
        settings=ControllerSettings.load(cluster_token=CONTROLLER_TOKEN),
        ft=FaultToleranceConfig.load(enable_dp_scale_down=True),
    )
    ctl = Controller(
        config=config,
        store=SqliteFtRuntimeStore(tmp / "ft.db"),
        node_managers=NodeManagerClient(
            cluster_token=CONTROLLER_TOKEN, transport_for=lambda _: httpx.MockTransport(_unreachable)
        ),
        coordinator=None,
        clock=SystemClock(),
    )
    await ctl.start(loops=False)
    try:
        yield Service(
            name="controller",
            app=controller_app.create_app(ctl, cluster_token=CONTROLLER_TOKEN),
            headers=bearer(CONTROLLER_TOKEN),
            json_routes=(REGISTER_PATH, HEARTBEAT_PATH, REPORT_SOFTWARE_FAULT_PATH, REPORT_HARDWARE_FAULT_PATH),
        )
    finally:
        await ctl.close()


# == the platform server ====================================================================================
@asynccontextmanager
async def platform_server(tmp: Path) -> AsyncIterator[Service]:
    """The platform server on a new SQLite database, one node registered and beating; its serving routes reach
    the real controller in memory (through the proxy's transport seam)."""
    engine = create_db_engine(f"sqlite:///{tmp / 'heteroflow.db'}")
    settings = ServerSettings.load(
        database_url=str(engine.url), liveness_flush_seconds=3600.0, cluster_token=CONTROLLER_TOKEN
    )
    ctx = platform_app.build_context(
        settings=settings,
        health_settings=HealthStorageSettings.load(),
        prediction_settings=PredictionSettings.load(),
        delivery_settings=AlertDeliverySettings.load(),
        metrics_settings=GpuMetricsSettings.load(flush_seconds=3600.0),
        clock=FakeClock(),
        engine=engine,
    )
    app = platform_app.create_app(ctx, run_worker=False)
    async with AsyncExitStack() as stack:
        ctl = await stack.enter_async_context(controller(tmp))
        transport = httpx.ASGITransport(app=ctl.app)
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        patch.setattr(
            serving_routes,
            "proxy_of",
            lambda _: ControllerProxy("http://controller", cluster_token=CONTROLLER_TOKEN, transport=transport),
        )
        await stack.enter_async_context(app.router.lifespan_context(app))
        stack.callback(engine.dispose)
        tokens = SqlTokenStore(engine)
        admin = tokens.create_token(name="fuzz", scopes=parse_scopes("admin"), tenant_id=None, now=ctx.clock.now())[1]
        node_id = await _seed_platform(app, bearer(admin))
        yield Service(
            name="platform",
            app=app,
            headers=bearer(admin),
            json_routes=(
                "/api/v1/nodes/register",
                "/api/v1/nodes/{node_id}/heartbeat",
                "/api/v1/nodes/{node_id}/release",
                "/api/v1/alerts/{alert_id}/resolve",
                "/api/v1/alerts/{alert_id}/acknowledge",
            ),
            path_values={"node_id": node_id},
        )


async def _seed_platform(app: FastAPI, headers: dict[str, str]) -> str:
    """One node with one beat, so that the list routes answer items and their response schemas are exercised."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://platform") as client:
        body = {"hostname": "fuzz-node", "vendor": "nvidia", "model": "H100", "gpu_count": 1}
        response = await client.post("/api/v1/nodes/register", json=body, headers=headers)
        assert response.status_code == 200, response.text
        node_id = response.json()["node_id"]
        stats = [{"index": 0, "uuid": "GPU-0", "ecc_uncorrected_total": 0, "temperature_c": 40}]
        response = await client.post(f"/api/v1/nodes/{node_id}/heartbeat", json={"gpu_stats": stats}, headers=headers)
        assert response.status_code == 200, response.text
        return str(node_id)


# == the NodeManager ========================================================================================
@asynccontextmanager
async def node_manager(_: Path) -> AsyncIterator[Service]:
    """A NodeManager for ranks 0 and 1 of a 4-rank in-process instance, registered with FT routes on."""
    cluster = FakeEngineCluster(dp_size=4)
    await cluster.start()
    fake_controller = FakeController(flags=FtFlags(enable_dp_scale_down_proxy=True, enable_fast_recovery=True))
    nm, _launcher = make_node_manager(cluster, fake_controller, (0, 1), name="a")
    try:
        await nm.start(loops=False)
        await nm.controller_once()
        yield Service(
            name="node_manager",
            app=node_manager_app.create_app(nm, cluster_token=NODE_MANAGER_TOKEN),
            headers=bearer(NODE_MANAGER_TOKEN),
            json_routes=(
                NM_FT_STATUS_PATH,
                NM_FT_GUARD_PATH,
                NM_FT_APPLY_PATH,
                NM_FT_FINALIZE_PATH,
                NM_FT_PROBE_PATH,
                NM_FT_NUDGE_PATH,
                NM_ENGINES_STOP_PATH,
                NM_ENGINES_START_PATH,
                NM_ENGINES_RESTART_PATH,
            ),
        )
    finally:
        await nm.close()
        await cluster.close()


# == the Coordinator ========================================================================================
class AnyEngine(httpx.AsyncBaseTransport):
    """Every published endpoint answers a completion: the Coordinator's own answers are what is fuzzed."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread() or b"{}")
        answer = {"id": "cmpl-fuzz", "object": "text_completion", "model": body.get("model"), "choices": []}
        # a stream, as a real transport returns (a response built from bytes counts as already read)
        payload = json.dumps(answer).encode()
        return httpx.Response(200, headers={"content-type": "application/json"}, stream=httpx.ByteStream(payload))


@asynccontextmanager
async def coordinator(_: Path) -> AsyncIterator[Service]:
    # the test API key doubles as the cluster token, so that one header passes both kinds of route
    settings = CoordinatorSettings.load(
        cluster_token=TEST_API_KEY, api_key_hashes=TEST_API_KEY_SHA256, unavailable_wait_sec=0.0
    )
    coord = Coordinator(settings=settings, upstream_transport=AnyEngine())
    app = coordinator_app.create_app(coord)
    async with app.router.lifespan_context(app):
        yield Service(
            name="coordinator",
            app=app,
            headers=bearer(TEST_API_KEY),
            json_routes=(
                COORDINATOR_DEL_PATH,
                COORDINATOR_ADD_PATH,
                COORDINATOR_SET_PATH,
                "/v1/completions",
                "/v1/chat/completions",
            ),
        )


# == the engine simulator ===================================================================================
@asynccontextmanager
async def engine_sim(_: Path) -> AsyncIterator[Service]:
    """Rank 0 of a 2-rank in-process instance (the real engine core and app over the fake worker backend)."""
    cluster = FakeEngineCluster(dp_size=2)
    await cluster.start()
    app = engine_server.create_app(
        cluster.cores[0],
        model_name="heteroflow-sim-moe",
        ft_path_prefix=cluster.prefix,
        cluster_token=ENGINE_TOKEN,
        max_tokens_limit=256,
    )
    try:
        yield Service(
            name="engine_sim",
            app=app,
            headers=bearer(ENGINE_TOKEN),
            json_routes=("/v1/completions", "/v1/chat/completions", "/v1/fault_tolerance/apply", "/sim/faults"),
        )
    finally:
        await cluster.close()


BUILDERS: dict[str, Builder] = {
    "platform": platform_server,
    "controller": controller,
    "node_manager": node_manager,
    "coordinator": coordinator,
    "engine_sim": engine_sim,
}


class Hosted:
    """One ASGI application: the lifespan builds the service, ``/openapi.json`` is its schema, the rest is it."""

    def __init__(self, build: Builder, tmp: Path) -> None:
        self._build = build
        self._tmp = tmp
        self.service: Service | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        service = self.service
        assert service is not None, "the service is started by the lifespan"
        if scope["type"] == "http" and scope["path"] == "/openapi.json":
            body = json.dumps(service.app.openapi()).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await service.app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        async with AsyncExitStack() as stack:
            message = await receive()
            assert message["type"] == "lifespan.startup"
            try:
                self.service = await stack.enter_async_context(self._build(self._tmp))
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                return
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
            assert message["type"] == "lifespan.shutdown"
            self.service = None
            await stack.aclose()
        await send({"type": "lifespan.shutdown.complete"})


def operations_of(app: FastAPI) -> list[tuple[str, str]]:
    """``(METHOD, path)`` of every operation in the service's OpenAPI document."""
    methods = {"get", "post", "put", "patch", "delete"}
    schema: dict[str, Any] = app.openapi()
    return sorted(
        (method.upper(), path) for path, item in schema["paths"].items() for method in item if method in methods
    )
