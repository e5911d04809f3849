"""The platform server's serving proxy (``/api/v1/serving/…``) against a real controller on a real loopback port.

The controller is the real ``Controller`` behind its real app (as in ``serving/test_controller_api.py``), served by
uvicorn in a thread of its own; the platform server is the real app in-process. Between them the proxy's real
httpx path: the cluster token stays on the server, every controller failure becomes a 503 or a 404, never a 500,
and only a cluster-wide admin token gets through.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from sqlalchemy.engine import Engine

from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.platform_server.errors import ServiceUnavailable
from heteroflow.platform_server.routes.serving import ControllerProxy
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.serving.controller.assembly import create_app
from heteroflow.serving.controller.clients import NodeManagerClient
from heteroflow.serving.controller.config import ControllerConfig, ControllerSettings, FaultToleranceConfig
from heteroflow.serving.controller.service import Controller
from heteroflow.serving.controller.store import SqliteFtRuntimeStore
from heteroflow.storage.db import create_db_engine, upgrade_database
from tests.integration.serving.test_controller_api import registration
from tests.support.harness import Harness, running_server

CLUSTER_TOKEN = "serving-proxy-test-cluster-token"
ROUTES = ["/api/v1/serving/status", "/api/v1/serving/rounds", "/api/v1/serving/rounds/sd-x"]
T = TypeVar("T")


@dataclass
class LiveController:
    url: str
    controller: Controller
    loop: asyncio.AbstractEventLoop

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the controller's event loop (its state belongs to that thread)."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def register(self, pod: str, ids: list[int]) -> None:
        response = httpx.post(
            f"{self.url}/controller/node_manager/register",
            json=registration(pod, ids),
            headers={"Authorization": f"Bearer {CLUSTER_TOKEN}"},
            verify=client_tls(),
        )
        assert response.status_code == 200, response.text

    def direct(self, path: str, **params: Any) -> Any:
        response = httpx.get(
            self.url + path, params=params, headers={"Authorization": f"Bearer {CLUSTER_TOKEN}"}, verify=client_tls()
        )
        assert response.status_code == 200, response.text
        return response.json()


@contextlib.contextmanager
def live_controller(tmp_path: Path) -> Iterator[LiveController]:
    """The real controller app on a free loopback port, its loop in a thread of its own."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        controller = Controller(
            config=ControllerConfig(
                settings=ControllerSettings.load(cluster_token=CLUSTER_TOKEN),
                ft=FaultToleranceConfig.load(enable_dp_scale_down=True),
            ),
            store=SqliteFtRuntimeStore(tmp_path / "ft.db"),
            node_managers=NodeManagerClient(cluster_token=CLUSTER_TOKEN),
            coordinator=None,
            clock=SystemClock(),
        )
        await controller.start(loops=False)
        port = free_port()
        app = create_app(controller, cluster_token=CLUSTER_TOKEN)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the controller did not start")
                await asyncio.sleep(0.02)
            box["live"] = LiveController(f"http://127.0.0.1:{port}", controller, asyncio.get_running_loop())
            stop = asyncio.Event()
            box["stop"] = stop
            ready.set()
            await stop.wait()  # set from the test thread when it is done
        finally:
            server.should_exit = True
            await task
            await controller.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced in the test thread
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, name="live-controller", daemon=True)
    thread.start()
    assert ready.wait(timeout=30), "the controller did not start within 30 s"
    if "error" in box:
        raise box["error"]
    try:
        yield box["live"]
    finally:
        box["live"].loop.call_soon_threadsafe(box["stop"].set)
        thread.join(timeout=15)
    if "error" in box:
        raise box["error"]


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    """The proxy stores nothing: one SQLite database for the tokens is enough."""
    engine = create_db_engine(f"sqlite:///{tmp_path / 'platform.db'}")
    upgrade_database(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[LiveController]:
    """A controller with instance ``inst-1`` assembled from two pods and one finished round in its history."""
    with live_controller(tmp_path) as live:
        live.register("a", [0, 1])
        live.register("b", [2, 3])

        def seed_round() -> None:
            history = live.controller.history
            history.begin("sd-proxy-1", instance_id="inst-1", kind="scale_down")
            history.add("sd-proxy-1", "decided", candidates=[1], survivors=[0, 2, 3], fallback="EngineRelaunch")
            history.add("sd-proxy-1", "apply", pod_id="pod-a", body={"instruction": "scale_down"}, http_status=202)
            history.finish("sd-proxy-1", "committed")

        live.call(seed_round)
        yield live


@contextlib.contextmanager
def platform(engine: Engine, **server: Any) -> Iterator[Harness]:
    with running_server(engine, server=server) as harness:
        yield harness


def steady(status: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The status without what moves between two reads (how long each pod has been silent)."""
    return [{**e, "pods": [{k: v for k, v in p.items() if k != "silent_sec"} for p in e["pods"]]} for e in status]


def test_admin_reads_are_forwarded_verbatim(sqlite_engine: Engine, controller: LiveController) -> None:
    with platform(sqlite_engine, controller_url=controller.url + "/", cluster_token=CLUSTER_TOKEN) as h:
        admin = h.token("admin")
        status = h.get(admin, "/api/v1/serving/status")
        assert status.status_code == 200, status.text
        assert steady(status.json()) == steady(controller.direct("/controller/fault_tolerance/status"))
        [entry] = status.json()
        assert entry["instance_id"] == "inst-1"
        assert entry["original_dp_ranks"] == [0, 1, 2, 3]
        assert {p["pod_id"] for p in entry["pods"]} == {"a", "b"}

        rounds = h.get(admin, "/api/v1/serving/rounds", instance_id="inst-1")
        assert rounds.status_code == 200
        assert [r["request_id"] for r in rounds.json()] == ["sd-proxy-1"]
        assert rounds.json()[0]["outcome"] == "committed"
        assert "events" not in rounds.json()[0]  # summaries only
        assert h.get(admin, "/api/v1/serving/rounds").json() == rounds.json()
        assert h.get(admin, "/api/v1/serving/rounds", instance_id="nobody").json() == []

        record = h.get(admin, "/api/v1/serving/rounds/sd-proxy-1")
        assert record.status_code == 200
        assert record.json() == controller.direct("/controller/fault_tolerance/rounds/sd-proxy-1")
        assert [e["kind"] for e in record.json()["events"]] == ["decided", "apply", "outcome"]
        assert CLUSTER_TOKEN not in status.text + rounds.text + record.text


def test_only_a_cluster_wide_serving_reader_or_admin_gets_through(
    sqlite_engine: Engine, controller: LiveController
) -> None:
    with platform(sqlite_engine, controller_url=controller.url, cluster_token=CLUSTER_TOKEN) as h:
        tokens = {
            "tenant reader": h.token("nodes:read", tenant="acme"),
            "tenant admin": h.token("admin", tenant="acme"),
            "tenant serving reader": h.token("serving:read", tenant="acme"),
            "cluster reader": h.token("nodes:read,nodes:write,alerts:write,metrics:read"),
        }
        admin = h.token("admin")
        serving_reader = h.token("serving:read")
        for path in ROUTES:
            for headers in (
                {},
                {"Authorization": "Bearer hf_not-a-token"},
                {"Authorization": f"Bearer {CLUSTER_TOKEN}"},
            ):
                response = h.client.get(path, headers=headers)
                assert response.status_code == 401, (path, headers, response.text)
            for name, token in tokens.items():
                response = h.get(token, path)
                assert response.status_code == 403, (path, name, response.text)
                assert response.json()["error"] == "forbidden"
            for token in (admin, serving_reader):
                assert h.get(token, path).status_code in (200, 404)  # sd-x is not a round: 404 from the controller


def test_an_unknown_round_is_404(sqlite_engine: Engine, controller: LiveController) -> None:
    with platform(sqlite_engine, controller_url=controller.url, cluster_token=CLUSTER_TOKEN) as h:
        admin = h.token("admin")
        missing = h.get(admin, "/api/v1/serving/rounds/sd-never-ran")
        assert missing.status_code == 404
        assert "sd-never-ran" in missing.json()["detail"]  # the controller's own sentence
        # An id that cannot name a round never reaches the controller's URL path.
        for bad in ["..", "a b", "x%2F..%2Fstatus", "-leading-dash"]:
            response = h.get(admin, f"/api/v1/serving/rounds/{bad}")
            assert response.status_code == 404, (bad, response.text)


def test_controller_down_is_503_never_500(sqlite_engine: Engine) -> None:
    port = free_port()  # nothing listens there
    with platform(sqlite_engine, controller_url=f"http://127.0.0.1:{port}", cluster_token=CLUSTER_TOKEN) as h:
        admin = h.token("admin")
        for path in ROUTES:
            response = h.get(admin, path)
            assert response.status_code == 503, (path, response.text)
            assert response.json()["error"] == "unavailable"
            assert "unreachable" in response.json()["detail"]


def test_a_controller_that_goes_away_is_503(sqlite_engine: Engine, tmp_path: Path) -> None:
    with contextlib.ExitStack() as running:
        live = running.enter_context(live_controller(tmp_path))
        with platform(sqlite_engine, controller_url=live.url, cluster_token=CLUSTER_TOKEN) as h:
            admin = h.token("admin")
            assert h.get(admin, "/api/v1/serving/status").status_code == 200
            running.close()  # the controller stops; the platform server keeps running
            response = h.get(admin, "/api/v1/serving/status")
            assert response.status_code == 503, response.text
            assert live.url in response.json()["detail"]


def test_no_controller_configured_is_503_on_every_route(sqlite_engine: Engine) -> None:
    with platform(sqlite_engine) as h:
        admin = h.token("admin")
        for path in [*ROUTES, "/api/v1/serving/rounds/not a round id"]:
            response = h.get(admin, path)
            assert response.status_code == 503, (path, response.text)
            assert "no controller configured" in response.json()["detail"]
        assert h.get(h.token("nodes:read", tenant="acme"), ROUTES[0]).status_code == 403  # auth comes first


def test_a_wrong_cluster_token_is_503_not_401(sqlite_engine: Engine, controller: LiveController) -> None:
    # A 401 would tell the page that the user's own token was revoked and sign them out.
    for token in ("not-the-cluster-token", None):
        with platform(sqlite_engine, controller_url=controller.url, cluster_token=token) as h:
            response = h.get(h.token("admin"), "/api/v1/serving/status")
            assert response.status_code == 503, response.text
            assert "cluster token" in response.json()["detail"]


def run_apart(coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine on a loop of its own in a thread of its own: in a session that also drives Playwright's
    sync API, the main thread already has a running loop."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coroutine())
        except BaseException as exc:  # re-raised in the test thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="proxy-call")
    thread.start()
    thread.join(timeout=30)
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def test_a_stalled_controller_times_out_as_503() -> None:
    with socket.socket() as listener:  # accepts connections (backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        proxy = ControllerProxy(f"http://127.0.0.1:{listener.getsockname()[1]}", cluster_token="t", timeout_sec=0.3)
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable, match=r"did not answer within 0\.3 s"):
            run_apart(lambda: proxy.get("/controller/fault_tolerance/status"))
        assert time.monotonic() - started < 5


def test_controller_errors_and_non_json_answers_are_503() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/boom"):
            return httpx.Response(500, json={"error": "internal", "detail": "it broke"})
        if request.url.path.endswith("/html"):
            return httpx.Response(200, text="<html>a proxy page</html>")
        assert request.headers["authorization"] == "Bearer secret"
        return httpx.Response(200, json=[])

    proxy = ControllerProxy("http://controller", cluster_token="secret", transport=httpx.MockTransport(answer))
    assert run_apart(lambda: proxy.get("/fine")) == []
    with pytest.raises(ServiceUnavailable, match="HTTP 500: it broke"):
        run_apart(lambda: proxy.get("/boom"))
    with pytest.raises(ServiceUnavailable, match="not JSON"):
        run_apart(lambda: proxy.get("/html"))


class _CountingTransport(httpx.AsyncBaseTransport):
    """Answers ``[]`` and counts how often a client closed it (once per client that owned it)."""

    def __init__(self) -> None:
        self.requests = 0
        self.closed = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return httpx.Response(200, json=[])

    async def aclose(self) -> None:
        self.closed += 1


def test_the_proxy_keeps_one_pooled_client_until_closed() -> None:
    transport = _CountingTransport()
    proxy = ControllerProxy("http://controller", cluster_token="secret", transport=transport)

    async def polls() -> None:
        for _ in range(3):
            assert await proxy.get("/controller/fault_tolerance/status") == []
        assert transport.closed == 0  # no client opened and closed per call
        await proxy.aclose()

    asyncio.run(polls())
    assert (transport.requests, transport.closed) == (3, 1)


def test_the_controller_url_setting_is_checked() -> None:
    assert ServerSettings.load().controller_url is None
    assert ServerSettings.load().cluster_token is None
    for bad in ["", "controller:8500", "ftp://controller", "http://"]:
        loaded = ServerSettings.load(controller_url=bad)
        assert loaded.controller_url is None, bad
        assert "HETEROFLOW_SERVER_CONTROLLER_URL" in loaded.config_warnings[0]
    assert ServerSettings.load(controller_url="https://ctl.internal:8500").controller_url == "https://ctl.internal:8500"


def test_the_dashboard_shell_is_public_and_linked(sqlite_engine: Engine) -> None:
    with platform(sqlite_engine) as h:
        page = h.client.get("/serving")  # no token: the shell loads before sign-in and holds no data
        assert page.status_code == 200
        assert '<body data-page="serving">' in page.text
        assert '<a href="/serving" data-i18n="nav.serving">' in page.text
        for asset in ("/ui/pages/serving.js", "/ui/logic/serving.js"):
            assert h.client.get(asset).headers["content-type"].startswith("text/javascript")
        assert not any(path.startswith("/serving") for path in h.openapi()["paths"])
