"""A live platform server whose serving proxy points at a real controller that has really scaled down.

The controller side is the in-process serving plane of ``tests/integration/serving/controller_harness.py``: the
real controller, two real NodeManagers (pod ``a``: ranks 0-1, pod ``b``: ranks 2-3) and the simulator's fake
engines, all in one event loop in a background thread, with the real Coordinator in front of the engines. Rank
1's worker is killed while clients send completions through the Coordinator, and that traffic makes the survivors
meet the fault, so the controller runs one real DP scale-down round: SCALED_DOWN_RUNNING with
``dead_committed == [1]`` and a committed round in its history. The controller's app is then served on a real
loopback port, and the platform server (with the web router) forwards ``/api/v1/serving/…`` to it.

With ``profile_name="vllm-0.32"`` the fake engines speak released vLLM's protocol instead: the NodeManagers
discover it, and the same kill makes the gate refuse the scale-down with ENGINE_SCALE_DOWN_UNSUPPORTED (the
whole-instance fallback runs instead; the in-process fakes do not come back from its relaunch).

No JSON file stands in for the controller: every byte the page shows came from the controller's own routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from heteroflow.contracts.engine_protocol import ProfileName
from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import free_port
from heteroflow.engine_sim import conformance
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.assembly import build_context
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.serving.controller.assembly import create_app as controller_app
from heteroflow.serving.coordinator.testing import TEST_API_KEY
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.token_store import SqlTokenStore
from tests.integration.serving.controller_harness import Plane, run_plane
from tests.web.seed import build_app, serve

RANK_CARDS = {0: [{"device_id": "GPU-rank-0", "index": 0}], 1: [{"device_id": "GPU-rank-1", "index": 1}]}


@dataclass(frozen=True)
class ServingSeeded:
    base_url: str
    """The platform server (web pages and the serving proxy)."""
    controller_url: str
    """The controller on its real port (the tests read it directly to compare)."""
    admin: str
    """admin scope, no tenant: sees the serving dashboard"""
    tenant_reader: str
    """tenant acme, nodes:read: signs in, but the serving routes answer 403"""
    serving_reader: str
    """nodes:read and serving:read, no tenant: a read-only operator who watches serving"""
    request_id: str
    """the committed round that removed rank 1 (released engines: the newest round, the fallback's)"""
    node_a_id: str
    """pod a's node, gpu-node-a, registered as a simulated node (its ranks' card links carry that source)"""


async def scaled_down(plane: Plane) -> str:
    """Rank 1 killed under client traffic through the real Coordinator until the scale-down is committed and the
    Coordinator was asked what the clients saw; the round's request id."""
    assert plane.real_coordinator is not None
    answered: list[int] = []
    stop = asyncio.Event()
    transport = httpx.ASGITransport(app=plane.real_coordinator)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://coordinator", headers={"Authorization": f"Bearer {TEST_API_KEY}"}
    ) as client:

        async def load() -> None:
            while not stop.is_set():
                body = {"model": "heteroflow-sim-moe", "prompt": "load", "max_tokens": 4}
                response = await client.post("/v1/completions", json=body, timeout=30)
                answered.append(response.status_code)
                if response.status_code != 200:
                    await asyncio.sleep(0.05)  # a client's own back-off, as Retry-After asks

        workers = [asyncio.create_task(load()) for _ in range(4)]
        await plane.until(lambda s: answered.count(200) >= 10, within=15, what="traffic flows")
        plane.cluster.kill_worker(1)  # the load itself makes the survivors meet the fault
        status = await plane.until(
            lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["dead_committed"] == [1] and s["can_serve"],
            within=30,
            what="rank 1 committed dead",
        )
        before = answered.count(200)
        await plane.until(lambda s: answered.count(200) >= before + 10, within=15, what="answers again")
        stop.set()
        await asyncio.gather(*workers)
    request_id = str(status["request_id"])
    await plane.until(
        lambda s: (r := plane.controller.history.get(request_id)) is not None and r.clients is not None,
        within=15,
        what="the round knows what its clients saw",
    )
    return request_id


async def scale_down_refused(plane: Plane) -> str:
    """Rank 1 killed under traffic on released engines until the gate refuses; the newest round's request id."""
    plane.cluster.kill_worker(1)
    # a released survivor that already saw the fault lets a new request hang: the traffic is bounded
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(conformance.traffic(plane.cluster, [0, 2, 3]), 10)
    status = await plane.until(
        lambda s: "ENGINE_SCALE_DOWN_UNSUPPORTED" in s["gate"]["reason_codes"] and bool(s["rounds"]),
        within=30,
        what="the gate refuses scale-down on released engines",
    )
    return str(status["rounds"][-1])


@contextlib.contextmanager
def scaled_down_controller(tmp: Path, profile_name: ProfileName | None = None) -> Iterator[tuple[str, str]]:
    """(controller URL, request id of its round), the plane running in a background thread."""
    ready = threading.Event()
    box: dict[str, Any] = {}
    fault: Callable[[Plane], Awaitable[str]] = scale_down_refused if profile_name == "vllm-0.32" else scaled_down

    async def scenario(plane: Plane) -> None:
        request_id = await fault(plane)
        port = free_port()
        app = controller_app(plane.controller, cluster_token=TEST_CLUSTER_TOKEN)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the controller's port did not open")
                await asyncio.sleep(0.02)
            stop = asyncio.Event()
            box.update(
                url=f"http://127.0.0.1:{port}",
                request_id=request_id,
                stop=stop,
                loop=asyncio.get_running_loop(),
            )
            ready.set()
            await stop.wait()  # set from the test thread when the tests are done
        finally:
            server.should_exit = True
            await task

    def run() -> None:
        try:
            # pod a on a named node with one card behind each rank (the dashboard links those ranks to the card);
            # pod b registers neither (its ranks link nowhere: unknown, never a guess)
            # real time: the browser reaches the controller over a socket while the plane runs
            run_plane(
                scenario,
                tmp,
                node_names={"a": "gpu-node-a"},
                device_infos=RANK_CARDS,
                profile_name=profile_name,
                virtual_time=False,
                real_coordinator=profile_name != "vllm-0.32",
            )
        except BaseException as exc:  # surfaced in the test thread
            box["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="serving-plane", daemon=True)
    thread.start()
    if not ready.wait(timeout=90):
        raise RuntimeError("the serving plane did not reach its fault's outcome within 90 s")
    if "error" in box:
        raise box["error"]
    try:
        yield box["url"], box["request_id"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(timeout=30)


@contextlib.contextmanager
def serving_server(tmp: Path, profile_name: ProfileName | None = None) -> Iterator[ServingSeeded]:
    (tmp / "plane").mkdir(parents=True, exist_ok=True)
    with scaled_down_controller(tmp / "plane", profile_name) as (controller_url, request_id):
        engine = create_db_engine(f"sqlite:///{tmp / 'serving-web.db'}")
        upgrade_database(engine)
        settings = ServerSettings.load(
            database_url=str(engine.url), controller_url=controller_url, cluster_token=TEST_CLUSTER_TOKEN
        )
        ctx = build_context(
            settings=settings,
            health_settings=HealthStorageSettings.load(),
            prediction_settings=PredictionSettings.load(),
            delivery_settings=AlertDeliverySettings.load(),
            clock=SystemClock(),
            engine=engine,
        )
        now = SystemClock().now()
        tokens = SqlTokenStore(engine)
        acme = tokens.ensure_tenant("acme", now=now)[0]
        admin = tokens.create_token(name="serving-admin", scopes=parse_scopes("admin"), tenant_id=None, now=now)[1]
        reader = tokens.create_token(name="acme-reader", scopes=parse_scopes("nodes:read"), tenant_id=acme, now=now)[1]
        watcher = tokens.create_token(
            name="serving-reader", scopes=parse_scopes("nodes:read,serving:read"), tenant_id=None, now=now
        )[1]
        # pod a's node is a simulated node of the platform: the dashboard's card links carry its source
        node_a = ctx.nodes.register(
            name="gpu-node-a",
            vendor="nvidia",
            model="simulated",
            gpu_count=2,
            source="simulated",
            tenant_id=None,
            now=now,
        ).node
        try:
            with serve(build_app(ctx)) as base_url:
                yield ServingSeeded(
                    base_url=base_url,
                    controller_url=controller_url,
                    admin=admin,
                    tenant_reader=reader,
                    serving_reader=watcher,
                    request_id=request_id,
                    node_a_id=str(node_a.id),
                )
        finally:
            engine.dispose()
