"""The Coordinator process is SIGKILLed under streaming and non-streaming load, then started again.

The Coordinator is ``heteroflow coordinator`` as a real process. Behind it: the real controller and two real
NodeManagers in the test's event loop over the simulator's in-process engines, each engine served on a loopback
port (its generation paced, so that requests are in flight when the Coordinator dies). Before the outage a
scale-down round retires rank 1 (the Coordinator then publishes [0, 2, 3]).

The Coordinator keeps its views in memory only: a restarted one knows no instance until the controller's periodic
SET (``serving_view_refresh_sec``) hands it the current projection, which never contains a committed dead rank.
Expected: requests in flight fail at the client at once (a broken connection or stream, never a hang and never a
truncated answer taken for a whole one); requests while it is down are refused; after the restart the requests
made before the first SET get 404 (unknown model), every request after the first success succeeds, and the
retired rank receives nothing, ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.contracts.serving import COORDINATOR_INSTANCES_PATH
from heteroflow.core.testing import free_port
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.assembly import create_app as engine_app
from heteroflow.engine_sim.testing import FakeEngineCluster
from heteroflow.http.tls import client_tls
from heteroflow.serving.controller.clients import CoordinatorClient
from heteroflow.serving.coordinator.testing import TEST_API_KEY, TEST_API_KEY_SHA256
from heteroflow.serving.node_manager.assembly import create_app as node_manager_app
from heteroflow.serving.node_manager.client import HttpControllerClient
from heteroflow.serving.node_manager.daemon import NodeManager, PodIdentity
from heteroflow.serving.node_manager.engines import HttpEngineClient
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.spec import InstanceSpec
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN, fake_cluster_launcher
from tests.integration.outages.serving import Served, controller_plane, pump_fake_clock, serve
from tests.integration.serving.controller_harness import PODS
from tests.support.polling import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MODEL = "heteroflow-sim-moe"
KEY = {"Authorization": f"Bearer {TEST_API_KEY}"}
MANAGE = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}
VIEW_REFRESH_SEC = 1.0
FIRST_BYTE_SEC = 0.3
"""Paced generation: the time to an engine's response headers, then ``TOKEN_SEC`` per streamed chunk."""
TOKEN_SEC = 0.04
CLIENTS = 4
BROKEN = frozenset({"RemoteProtocolError", "ReadError", "WriteError"})
"""How a request whose connection the dying Coordinator closed fails at an httpx client."""


class Paced:
    """An engine's ASGI app whose completions take time (as generation does); records what reaches it."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self.arrivals = 0
        self.active = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in ("/v1/completions", "/v1/chat/completions"):
            await self._app(scope, receive, send)
            return
        self.arrivals += 1
        self.active += 1

        async def paced(message: Any) -> None:
            if message["type"] == "http.response.start":
                await asyncio.sleep(FIRST_BYTE_SEC)  # generation time, not a synchronisation
            elif message["type"] == "http.response.body" and message.get("body"):
                await asyncio.sleep(TOKEN_SEC)
            await send(message)

        try:
            await self._app(scope, receive, paced)
        finally:
            self.active -= 1


@dataclass
class CoordinatorProcess:
    port: int
    log_dir: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")}
        env.update(
            HETEROFLOW_CLUSTER_TOKEN=TEST_CLUSTER_TOKEN,
            HETEROFLOW_COORDINATOR_API_KEY_HASHES=TEST_API_KEY_SHA256,
            HETEROFLOW_COORDINATOR_UNAVAILABLE_WAIT_SEC="1",
            PYTHONUNBUFFERED="1",
        )
        self.starts += 1
        with (self.log_dir / f"coordinator-{self.starts}.log").open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "heteroflow.cli.main", "coordinator", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    async def healthy(self) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, "the coordinator exited"
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=1.0, verify=client_tls()) as http:
                return (await http.get(f"{self.url}/health")).status_code == 200
        return False

    async def published(self) -> list[int] | None:
        async with httpx.AsyncClient(timeout=2.0, verify=client_tls()) as http:
            body = (await http.get(self.url + COORDINATOR_INSTANCES_PATH, headers=MANAGE)).json()
        views = {view["instance_id"]: view for view in body["instances"]}
        return sorted(e["id"] for e in views["inst-1"]["endpoints"]) if "inst-1" in views else None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@dataclass(frozen=True)
class Outcome:
    seq: int
    stream: bool
    started: float
    ended: float
    ok: bool
    detail: str


@dataclass
class Load:
    """``CLIENTS`` clients in a loop, streaming and non-streaming in turn, through the Coordinator."""

    url: str
    outcomes: list[Outcome] = field(default_factory=list)
    in_flight: dict[int, float] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _seqs: itertools.count[int] = field(default_factory=itertools.count)

    async def run(self) -> None:
        await asyncio.gather(*(self._client() for _ in range(CLIENTS)))

    def ok_count(self, *, after: float = 0.0) -> int:
        return sum(1 for o in self.outcomes if o.ok and o.started >= after)

    async def _client(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, headers=KEY, timeout=10.0, verify=client_tls()) as http:
            while not self.stop.is_set():
                seq = next(self._seqs)
                stream = seq % 2 == 0
                started = time.monotonic()
                self.in_flight[seq] = started
                try:
                    ok, detail = await (self._streamed(http, seq) if stream else self._plain(http, seq))
                except httpx.HTTPError as exc:
                    ok, detail = False, type(exc).__name__
                finally:
                    del self.in_flight[seq]
                self.outcomes.append(Outcome(seq, stream, started, time.monotonic(), ok, detail))
                if not ok:
                    await asyncio.sleep(0.02)  # the client's pause before its next attempt

    @staticmethod
    def _body(seq: int, *, stream: bool) -> dict[str, Any]:
        return {"model": MODEL, "prompt": f"request {seq}", "max_tokens": 8, "stream": stream}

    async def _plain(self, http: httpx.AsyncClient, seq: int) -> tuple[bool, str]:
        response = await http.post("/v1/completions", json=self._body(seq, stream=False))
        if response.status_code != 200:
            return False, f"HTTP {response.status_code}"
        return isinstance(response.json()["choices"][0]["text"], str), "ok"

    async def _streamed(self, http: httpx.AsyncClient, seq: int) -> tuple[bool, str]:
        async with http.stream("POST", "/v1/completions", json=self._body(seq, stream=True)) as response:
            if response.status_code != 200:
                await response.aread()
                return False, f"HTTP {response.status_code}"
            done = False
            async for line in response.aiter_lines():
                if line.startswith("data:") and '"error"' in line:
                    return False, "error event"
                done = done or line == "data: [DONE]"
            return done, "ok" if done else "incomplete stream"


def instance_spec(ids: tuple[int, ...], ports: dict[int, int]) -> InstanceSpec:
    return InstanceSpec.model_validate(
        {
            "instance_id": "inst-1",
            "dp_size": 4,
            "dp_master_ip": "127.0.0.1",
            "dp_rpc_port": 29500,
            "dp_store_port": 29600,
            "num_logical_experts": 4,
            "num_redundant_experts": 4,
            "endpoints": [{"id": rank, "port": ports[rank]} for rank in ids],
        }
    )


def test_a_coordinator_killed_under_load_fails_in_flight_requests_cleanly_and_serves_again(tmp_path: Path) -> None:
    coordinator = CoordinatorProcess(free_port(), tmp_path)

    async def scenario() -> None:
        cluster = FakeEngineCluster(dp_size=4, cluster_token=TEST_CLUSTER_TOKEN)
        await cluster.start()
        pump = asyncio.create_task(pump_fake_clock(cluster))
        ports = {rank: free_port() for rank in range(4)}
        engines = {
            rank: Paced(
                engine_app(
                    core, model_name=MODEL, ft_path_prefix=cluster.prefix, cluster_token=TEST_CLUSTER_TOKEN,
                    max_tokens_limit=256,
                )
            )
            for rank, core in cluster.cores.items()
        }  # fmt: skip
        servers: list[Served] = []
        node_managers: list[NodeManager] = []
        nm_apps: dict[str, Any] = {}
        try:
            for rank in range(4):
                servers.append(await serve(engines[rank], ports[rank]))
            coordinator.start()
            await eventually(coordinator.healthy, within=30, what="the Coordinator up")
            async with controller_plane(
                tmp_path,
                coordinator=CoordinatorClient(coordinator.url, cluster_token=TEST_CLUSTER_TOKEN, timeout_sec=2.0),
                node_manager_transport=lambda _: lambda base: httpx.ASGITransport(app=nm_apps[base]),
                ft={"serving_view_refresh_sec": VIEW_REFRESH_SEC},
            ) as plane:
                for name, ids in PODS.items():
                    nm = NodeManager(
                        spec=instance_spec(ids, ports),
                        settings=NodeManagerSettings.load(
                            cluster_token=TEST_CLUSTER_TOKEN,
                            engine_ft_poll_interval_sec=0.05,
                            engine_ft_status_timeout_sec=1.0,
                            engine_death_suicide_grace_sec=60.0,
                            heartbeat_interval_sec=0.1,
                        ),
                        pod=PodIdentity(pod_id=f"pod-{name}", pod_ip="127.0.0.1", node_manager_url=f"http://nm-{name}"),
                        controller=HttpControllerClient(
                            "http://controller",
                            cluster_token=TEST_CLUSTER_TOKEN,
                            timeout_sec=2.0,
                            transport=httpx.ASGITransport(app=plane.app),
                        ),
                        engines=HttpEngineClient(cluster.client, ft_path_prefix=cluster.prefix),
                        launcher=fake_cluster_launcher(cluster),
                        clock=cluster.clock,
                    )
                    nm_apps[f"http://nm-{name}"] = node_manager_app(nm, cluster_token=TEST_CLUSTER_TOKEN)
                    node_managers.append(nm)
                    await nm.start()
                await plane.until(
                    lambda s: s["can_serve"] and len(s["published_endpoints"]) == 4, within=15, what="published"
                )

                # before the outage: a committed scale-down round retires rank 1
                cluster.kill_worker(1)
                await conformance.traffic(cluster, [0, 2, 3])
                await plane.until(
                    lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["dead_committed"] == [1] and s["can_serve"],
                    within=20,
                    what="rank 1 retired",
                )
                assert await coordinator.published() == [0, 2, 3]
                reached_retired = engines[1].arrivals

                load = Load(coordinator.url)
                clients = asyncio.create_task(load.run())
                try:
                    await eventually(
                        lambda: _true(load.ok_count() >= 8), within=30, what="the load flowing through the Coordinator"
                    )
                    await eventually(
                        lambda: _true(sum(e.active for e in engines.values()) >= 2 and len(load.in_flight) >= 2),
                        within=10,
                        what="requests in flight at the engines",
                    )
                    in_flight = set(load.in_flight)
                    ok_before = load.ok_count()
                    await asyncio.to_thread(coordinator.kill)
                    killed = time.monotonic()

                    await eventually(
                        lambda: _true(
                            all(seq not in load.in_flight for seq in in_flight)
                            and sum(1 for o in load.outcomes if o.started > killed and o.detail == "ConnectError") >= 3
                        ),
                        within=10,
                        what="the requests in flight ended and new ones refused",
                    )
                    coordinator.start()
                    await eventually(coordinator.healthy, within=30, what="the Coordinator up again")
                    restarted = time.monotonic()
                    await eventually(
                        lambda: _true(load.ok_count(after=killed) >= 1),
                        within=VIEW_REFRESH_SEC + 15,
                        what="a request served after the restart",
                    )
                    await eventually(lambda: _true(load.ok_count(after=killed) >= 12), within=30, what="serving again")
                finally:
                    load.stop.set()
                    await clients

                outcomes = {o.seq: o for o in load.outcomes}
                first_ok = min((o for o in load.outcomes if o.ok and o.started > killed), key=lambda o: o.started)
                # in flight at the kill: each ended at once, whole (it had just been answered) or as a broken
                # connection or stream, never as a truncated answer taken for a whole one (streams need [DONE])
                for seq in in_flight:
                    outcome = outcomes[seq]
                    assert outcome.ended - killed < 5, outcome
                    assert outcome.ok or outcome.detail in BROKEN, outcome
                cut = [outcomes[seq] for seq in in_flight if not outcomes[seq].ok]
                assert cut, "no request was cut by the kill"
                # between the kill and the first success: refused, then 404 until the first SET
                between = [o for o in load.outcomes if killed < o.started < first_ok.started and o.seq not in in_flight]
                assert between
                assert {o.detail for o in between} <= {"ConnectError", "HTTP 404", *BROKEN}, between
                # after the first success, everything succeeds
                after = [o for o in load.outcomes if o.started >= first_ok.started]
                assert [o for o in after if not o.ok] == []
                assert {o.stream for o in after} == {True, False}
                assert first_ok.ended - restarted < VIEW_REFRESH_SEC + 5
                # the retired rank never got a request, before or after the restart
                assert engines[1].arrivals == reached_retired
                assert await coordinator.published() == [0, 2, 3]
                status = await plane.status()
                assert status["phase"] == "SCALED_DOWN_RUNNING"
                assert status["dead_committed"] == [1]
                assert status["can_serve"]
                assert ok_before >= 8
        finally:
            for nm in node_managers:
                await nm.close()
            for server in servers:
                await server.stop()
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            await cluster.close()

    try:
        asyncio.run(scenario())
    finally:
        coordinator.stop()


async def _true(value: bool) -> bool:
    return value
