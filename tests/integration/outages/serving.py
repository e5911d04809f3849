"""Pieces shared by the serving outage tests: the real controller in the test's event loop, served on loopback
so that real processes (NodeManagers, a Coordinator) reach it, uvicorn servers in the same loop, and a poll with
a deadline.

The controller's outgoing requests go through transports the test chooses: real sockets for peers that are
processes, ASGI for peers that run in the test, and :class:`HookedTransport` where the test must act at an exact
step of a round (a hook sees each request and its answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request

from heteroflow.contracts.serving import NM_FT_APPLY_PATH, REGISTER_PATH, RegisterRequest
from heteroflow.core.clock import SystemClock
from heteroflow.engine_sim.testing import FakeEngineCluster
from heteroflow.serving.controller.assembly import create_app as controller_app
from heteroflow.serving.controller.clients import CoordinatorClient, NodeManagerClient
from heteroflow.serving.controller.config import ControllerConfig, ControllerSettings, FaultToleranceConfig
from heteroflow.serving.controller.service import Controller
from heteroflow.serving.controller.store import SqliteFtRuntimeStore
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN
from tests.integration.serving.controller_harness import FAST_FT
from tests.support.polling import eventually

AfterHook = Callable[[httpx.Request, httpx.Response], Awaitable[None]]
"""Called with each request the controller sent to a NodeManager and its complete answer, before the controller
sees it."""


async def pump_fake_clock(cluster: FakeEngineCluster) -> None:
    """Move the in-process engines' fake clock with real time, so that their timeouts mean what they say."""
    last = time.monotonic()
    while True:
        await asyncio.sleep(0.01)  # the pump's own period
        now = time.monotonic()
        cluster.clock.advance(now - last)
        last = now
        cluster.tick()


@dataclass
class Served:
    """A uvicorn server running in the current event loop."""

    server: uvicorn.Server
    task: asyncio.Task[None]

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def serve(app: Any, port: int) -> Served:
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())

    async def started() -> bool:
        if task.done():
            task.result()  # raises what made it stop (a port already taken)
        return server.started

    await eventually(started, within=10, what=f"a server on port {port}")
    return Served(server, task)


class HookedTransport(httpx.AsyncBaseTransport):
    """Real sockets to a NodeManager; records every apply and lets ``hooks`` act on each answer."""

    def __init__(self, plane: ControllerPlane) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._plane = plane

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == NM_FT_APPLY_PATH:
            self._plane.applies.append(f"{request.url.host}:{request.url.port}")
        response = await self._inner.handle_async_request(request)
        await response.aread()  # the whole answer has arrived before a hook acts (kills the peer, say)
        for hook in list(self._plane.after_hooks):
            await hook(request, response)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class ControllerPlane:
    """The controller, its API client and what the test recorded around it."""

    controller: Controller
    app: FastAPI
    http: httpx.AsyncClient
    """The controller's API, with the cluster token."""
    applies: list[str] = field(default_factory=list)
    """``host:port`` of the NodeManager each apply was sent to."""
    registrations: list[RegisterRequest] = field(default_factory=list)
    after_hooks: list[AfterHook] = field(default_factory=list)

    async def status(self) -> dict[str, Any]:
        response = await self.http.get("/controller/fault_tolerance/status")
        assert response.status_code == 200, response.text
        entries = response.json()
        return dict(entries[0]) if entries else {"phase": None, "can_serve": False, "published_endpoints": []}

    async def until(self, check: Callable[[dict[str, Any]], bool], *, within: float, what: str) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            status = await self.status()
            return status if check(status) else None

        return await eventually(probe, within=within, what=what)

    async def round(self, request_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/controller/fault_tolerance/rounds/{request_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())


@contextlib.asynccontextmanager
async def controller_plane(
    tmp_path: Path,
    *,
    coordinator: CoordinatorClient | None,
    node_manager_transport: Callable[[ControllerPlane], Callable[[str], httpx.AsyncBaseTransport | None]],
    ft: dict[str, Any] | None = None,
) -> Any:
    """A started controller on a SQLite store in ``tmp_path``; ``node_manager_transport(plane)`` gives the
    transport per NodeManager base URL (``None``: plain sockets)."""
    holder: list[ControllerPlane] = []

    def transport_for(base: str) -> httpx.AsyncBaseTransport | None:
        return node_manager_transport(holder[0])(base)

    config = ControllerConfig(
        settings=ControllerSettings.load(cluster_token=TEST_CLUSTER_TOKEN, heartbeat_interval_sec=0.1),
        ft=FaultToleranceConfig.load(**{**FAST_FT, **(ft or {})}),
    )
    controller = Controller(
        config=config,
        store=SqliteFtRuntimeStore(tmp_path / "ft.db"),
        node_managers=NodeManagerClient(cluster_token=TEST_CLUSTER_TOKEN, timeout_sec=2.0, transport_for=transport_for),
        coordinator=coordinator,
        clock=SystemClock(),
        exit_process=_refuse_exit,
    )
    app = controller_app(controller, cluster_token=TEST_CLUSTER_TOKEN)
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://controller",
        headers={"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"},
    )
    plane = ControllerPlane(controller, app, http)
    holder.append(plane)

    @app.middleware("http")
    async def record_registrations(request: Request, call_next: Any) -> Any:
        if request.url.path == REGISTER_PATH:
            plane.registrations.append(RegisterRequest.model_validate_json(await request.body()))
        return await call_next(request)

    try:
        await controller.start()
        yield plane
    finally:
        await http.aclose()
        await controller.close()


def _refuse_exit(code: int) -> None:
    raise AssertionError(f"the controller asked to exit the test process (code {code})")
