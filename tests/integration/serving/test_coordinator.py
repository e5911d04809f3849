"""``heteroflow coordinator`` as a real process in front of real HTTP engines on loopback (F-40, F-41).

The engines are tiny FastAPI apps that behave like the engine simulator's OpenAI surface (answers, SSE
streams, 503 while recovering), served by uvicorn on real ports from one event-loop thread of the test, plus
raw-socket engines that break the connection before the headers or in the middle of a stream. One Coordinator
subprocess serves every test of this module; each test publishes its own instance and model.

"No new request reaches a withdrawn endpoint" is measured without a race: every client request carries its
sequence number; the client notes when it started each one and the engine when it arrived (one process, one
monotonic clock). A request started after a DEL (or a SET without the endpoint) had returned and arriving
at the withdrawn engine before the call that re-published it was sent was routed there while it was
withdrawn: that must never happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from heteroflow.contracts.serving import (
    COORDINATOR_ADD_PATH,
    COORDINATOR_CLIENT_OUTCOMES_PATH,
    COORDINATOR_DEL_PATH,
    COORDINATOR_INSTANCES_PATH,
    COORDINATOR_SET_PATH,
)
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.serving.coordinator.testing import TEST_API_KEY, TEST_API_KEY_SHA256, TEST_CLUSTER_TOKEN
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

MANAGE = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}
KEY = {"Authorization": f"Bearer {TEST_API_KEY}"}
UNAVAILABLE_WAIT_SEC = 0.5


# == engines ===================================================================================================
class Engine:
    """One HTTP engine on a real port; records what it received (thread-safe)."""

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port
        self.mode = "ok"  # "ok" | "unavailable"
        self.delay = 0.0
        self.stream_gap = 0.0
        self.events = 3
        self._lock = threading.Lock()
        self._seqs: list[int | None] = []
        self._arrivals: dict[int, float] = {}

    def record(self, seq: str | None) -> None:
        with self._lock:
            number = int(seq) if seq is not None and seq.isdigit() else None
            self._seqs.append(number)
            if number is not None:
                self._arrivals[number] = time.monotonic()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._seqs)

    def arrivals(self) -> dict[int, float]:
        """When each numbered request arrived (monotonic seconds)."""
        with self._lock:
            return dict(self._arrivals)

    def endpoint(self, endpoint_id: int) -> dict[str, Any]:
        return {"id": endpoint_id, "ip": "127.0.0.1", "port": self.port}


def engine_app(engine: Engine) -> FastAPI:
    app = FastAPI()

    async def answer(request: Request) -> Response:
        body = await request.json()
        engine.record(request.headers.get("x-client-seq"))
        if request.headers.get("authorization") != f"Bearer {TEST_CLUSTER_TOKEN}":
            return JSONResponse({"error": {"message": "cluster token required", "code": 401}}, status_code=401)
        if engine.delay:
            await asyncio.sleep(engine.delay)  # generation time, so that requests overlap
        if engine.mode == "unavailable":
            error = {"message": "engine is unhealthy; retry elsewhere", "type": "ServiceUnavailableError", "code": 503}
            return JSONResponse({"error": error}, status_code=503)
        if body.get("prompt") == "reject":
            return JSONResponse({"error": {"message": f"rejected by {engine.name}", "code": 400}}, status_code=400)
        if body.get("stream"):

            async def events() -> Any:
                for i in range(engine.events):
                    if i and engine.stream_gap:
                        await asyncio.sleep(engine.stream_gap)  # token time
                    yield f"data: {json.dumps({'choices': [_choice(engine, i)]})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse({"object": "text_completion", "choices": [{"index": 0, "text": engine.name}]})

    app.post("/v1/completions")(answer)
    app.post("/v1/chat/completions")(answer)
    return app


def _choice(engine: Engine, i: int) -> dict[str, Any]:
    """Event ``i`` of a stream's one choice; the last carries its finish_reason, as OpenAI's API and vLLM send
    it (a stream that ends without one was cut: the Coordinator resumes it)."""
    choice: dict[str, Any] = {"index": 0, "text": f"{engine.name}#{i}"}
    if i == engine.events - 1:
        choice["finish_reason"] = "stop"
    return choice


class Fleet:
    """uvicorn servers on one event-loop thread; each can be stopped (its port then refuses connections)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._servers: dict[str, tuple[uvicorn.Server, Future[None]]] = {}

    def start(self, name: str) -> Engine:
        engine = Engine(name, free_port())
        config = uvicorn.Config(
            engine_app(engine), host="127.0.0.1", port=engine.port, log_config=None, access_log=False, lifespan="off"
        )
        server = uvicorn.Server(config)
        future = asyncio.run_coroutine_threadsafe(server.serve(), self._loop)
        self._servers[name] = (server, future)
        until(lambda: server.started or future.done(), within=10, what=f"engine {name} up")
        assert server.started, f"engine {name} did not start"
        return engine

    def stop(self, engine: Engine) -> None:
        server, future = self._servers.pop(engine.name)
        server.should_exit = True
        future.result(timeout=10)

    def close(self) -> None:
        for server, _ in self._servers.values():
            server.should_exit = True
        for _, future in self._servers.values():
            with contextlib.suppress(Exception):
                future.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class BrokenEngine:
    """A raw-socket engine that reads the request, then closes before the headers or after one SSE event."""

    def __init__(self, *, mid_stream: bool) -> None:
        self.count = 0
        lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = content_length(head)
                while len(body) < length:
                    body += sock.recv(65536)
                with lock:
                    outer.count += 1
                if mid_stream:
                    event = b'data: {"choices": [{"index": 0, "text": "partial"}]}\n\n'
                    sock.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                        + f"{len(event):x}\r\n".encode() + event + b"\r\n"
                    )  # fmt: skip
                sock.shutdown(socket.SHUT_RDWR)  # no terminating chunk: the stream breaks here

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.port = free_port()
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def endpoint(self, endpoint_id: int) -> dict[str, Any]:
        return {"id": endpoint_id, "ip": "127.0.0.1", "port": self.port}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# == the Coordinator process ===================================================================================
@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet()
    try:
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("HETEROFLOW_")}
    env.update(
        {
            "HETEROFLOW_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN,
            "HETEROFLOW_COORDINATOR_API_KEY_HASHES": TEST_API_KEY_SHA256,
            "HETEROFLOW_COORDINATOR_UNAVAILABLE_WAIT_SEC": str(UNAVAILABLE_WAIT_SEC),
            "HETEROFLOW_COORDINATOR_LOG_LEVEL": "warning",
            "PYTHONUNBUFFERED": "1",
        }
    )
    log = tmp_path_factory.mktemp("coordinator") / "coordinator.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "heteroflow.cli.main", "coordinator", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, f"the coordinator exited: {log.read_text()}"
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/health", timeout=1, verify=client_tls()).status_code == 200
        return False

    try:
        until(healthy, within=60, what="coordinator up")  # 20 s and more on two busy shared cores
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
            raise
        assert code in (0, -signal.SIGTERM), log.read_text()
        assert TEST_API_KEY not in log.read_text()
        assert TEST_CLUSTER_TOKEN not in log.read_text()


def manage(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(f"{url}{path}", headers=MANAGE, json=body, timeout=10, verify=client_tls())
    assert response.status_code == 200, response.text
    return response


def publish(url: str, instance: str, model: str, endpoints: list[dict[str, Any]], *, generation: int = 0) -> None:
    manage(
        url,
        COORDINATOR_SET_PATH,
        {"instance_id": instance, "model": model, "endpoints": endpoints, "generation": generation},
    )


def complete(url: str, model: str, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions",
        headers=KEY,
        json={"model": model, "prompt": "hi", **extra},
        timeout=15,
        verify=client_tls(),
    )


def metric(url: str, sample: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=MANAGE, timeout=5, verify=client_tls()).text
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# == tests =====================================================================================================
def test_routing_and_balancing_across_published_endpoints(coordinator: str, fleet: Fleet) -> None:
    engines = [fleet.start(f"bal-{i}") for i in range(3)]
    other = fleet.start("bal-other")
    publish(coordinator, "bal", "model-bal", [e.endpoint(i) for i, e in enumerate(engines)])
    publish(coordinator, "bal-2", "model-other", [other.endpoint(0)])
    answers = [complete(coordinator, "model-bal").json()["choices"][0]["text"] for _ in range(30)]
    assert sorted(answers) == sorted(["bal-0", "bal-1", "bal-2"] * 10)
    assert [e.count for e in engines] == [10, 10, 10]
    assert other.count == 0
    models = httpx.get(f"{coordinator}/v1/models", headers=KEY, timeout=5, verify=client_tls()).json()["data"]
    assert {"model-bal", "model-other"} <= {m["id"] for m in models}
    listed = httpx.get(
        f"{coordinator}{COORDINATOR_INSTANCES_PATH}", headers=MANAGE, timeout=5, verify=client_tls()
    ).json()
    assert {i["instance_id"] for i in listed["instances"]} >= {"bal", "bal-2"}


@pytest.mark.timeout(120)  # about 30 s of load, after the Coordinator's start when this test runs first
def test_no_new_request_reaches_a_withdrawn_endpoint_under_concurrent_load(coordinator: str, fleet: Fleet) -> None:
    engines = [fleet.start(f"load-{i}") for i in range(3)]
    for engine in engines:
        engine.delay = 0.005
    endpoints = {i: e.endpoint(i) for i, e in enumerate(engines)}
    publish(coordinator, "load", "model-load", list(endpoints.values()))
    started: dict[int, float] = {}
    statuses: list[int] = []
    windows: list[tuple[int, float, float]] = []  # (endpoint, withdrawal returned, re-publication sent)

    async def scenario() -> None:
        stop = asyncio.Event()
        counter = iter(range(1_000_000))

        async def client_loop(client: httpx.AsyncClient) -> None:
            while not stop.is_set():
                seq = next(counter)
                started[seq] = time.monotonic()
                response = await client.post(
                    "/v1/completions",
                    headers={**KEY, "x-client-seq": str(seq)},
                    json={"model": "model-load", "prompt": "hi"},
                )
                statuses.append(response.status_code)

        async def progress(requests: int) -> None:
            target = len(statuses) + requests
            deadline = time.monotonic() + 10
            while len(statuses) < target:
                assert time.monotonic() < deadline, "the load stalled"
                await asyncio.sleep(0.01)  # polling with a deadline

        async def op(manager: httpx.AsyncClient, path: str, body: dict[str, Any]) -> float:
            response = await manager.post(path, headers=MANAGE, json=body)
            assert response.status_code == 200, response.text
            return time.monotonic()

        open_since: dict[int, float] = {}

        async def withdraw_with(manager: httpx.AsyncClient, path: str, body: dict[str, Any], ids: set[int]) -> None:
            returned = await op(manager, path, body)
            for eid in ids:
                open_since[eid] = returned

        async def republish_with(manager: httpx.AsyncClient, path: str, body: dict[str, Any], ids: set[int]) -> None:
            sent = time.monotonic()
            for eid in ids:
                windows.append((eid, open_since.pop(eid), sent))
            await op(manager, path, body)

        def view(ids: list[int], generation: int) -> dict[str, Any]:
            return {
                "instance_id": "load",
                "model": "model-load",
                "endpoints": [endpoints[i] for i in ids],
                "generation": generation,
            }

        limits = httpx.Limits(max_connections=40)
        async with (
            httpx.AsyncClient(base_url=coordinator, timeout=15, limits=limits, verify=client_tls()) as client,
            httpx.AsyncClient(base_url=coordinator, timeout=15, verify=client_tls()) as manager,
        ):
            workers = [asyncio.create_task(client_loop(client)) for _ in range(20)]
            await progress(60)
            # published {0, 1, 2} → DEL 0 → {1, 2} → SET {2} → ADD {0, 1} → DEL 1, 2 → stale SET → SET {0, 1, 2}
            await withdraw_with(manager, COORDINATOR_DEL_PATH, {"instance_id": "load", "endpoint_ids": [0]}, {0})
            await progress(80)
            await withdraw_with(manager, COORDINATOR_SET_PATH, view([2], 1), {1})
            await progress(80)
            await republish_with(manager, COORDINATOR_ADD_PATH, view([0, 1], 1), {0, 1})
            await progress(80)
            await withdraw_with(manager, COORDINATOR_DEL_PATH, {"instance_id": "load", "endpoint_ids": [1, 2]}, {1, 2})
            await progress(40)
            stale = await manager.post(COORDINATOR_SET_PATH, headers=MANAGE, json=view([0, 1, 2], 0))
            assert stale.headers["x-heteroflow-view-outcome"] == "stale_generation"  # 1 and 2 stay withdrawn
            await progress(40)
            await republish_with(manager, COORDINATOR_SET_PATH, view([0, 1, 2], 2), {1, 2})
            for _ in range(3):  # quick DEL / ADD flips: more withdrawals, more chances to catch a late one
                await progress(30)
                await withdraw_with(manager, COORDINATOR_DEL_PATH, {"instance_id": "load", "endpoint_ids": [2]}, {2})
                await progress(30)
                await republish_with(manager, COORDINATOR_ADD_PATH, view([2], 2), {2})
            await progress(30)
            stop.set()
            await asyncio.gather(*workers)

    asyncio.run(scenario())
    assert statuses
    assert set(statuses) == {200}, f"non-200 answers: {sorted(set(statuses))}"
    assert sorted(eid for eid, _, _ in windows) == [0, 1, 1, 2, 2, 2, 2]
    for eid, opened, closed in windows:
        inside = {seq for seq, at in started.items() if opened <= at < closed}
        assert len(inside) >= 10, f"too little traffic while endpoint {eid} was withdrawn: the check proves nothing"
        # started after the withdrawal returned and arrived before the re-publication was sent: it was routed to
        # the endpoint while withdrawn (one started in the window but arriving later may have been routed later)
        leaked = {seq for seq, at in engines[eid].arrivals().items() if seq in inside and at < closed}
        assert not leaked, f"endpoint {eid} received {len(leaked)} request(s) routed while it was withdrawn"
    assert all(engine.count > 0 for engine in engines)


def test_a_refused_connection_is_sent_elsewhere(coordinator: str, fleet: Fleet) -> None:
    doomed, alive = fleet.start("refused-0"), fleet.start("refused-1")
    publish(coordinator, "refused", "model-refused", [doomed.endpoint(0), alive.endpoint(1)])
    fleet.stop(doomed)  # the process is gone: its port refuses connections
    before = metric(coordinator, 'heteroflow_coordinator_retries_total{reason="connect"}')
    for _ in range(6):
        response = complete(coordinator, "model-refused")
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == "refused-1"
    # after its fault answer the endpoint is skipped for the fault pause: at least one request met it
    assert metric(coordinator, 'heteroflow_coordinator_retries_total{reason="connect"}') >= before + 1


def test_a_503_is_sent_elsewhere_and_a_clear_503_comes_past_the_client_deadline(coordinator: str, fleet: Fleet) -> None:
    busy, alive = fleet.start("busy-0"), fleet.start("busy-1")
    busy.mode = "unavailable"
    window_start = time.time()
    publish(coordinator, "busy", "model-busy", [busy.endpoint(0), alive.endpoint(1)])
    for _ in range(6):
        assert complete(coordinator, "model-busy").json()["choices"][0]["text"] == "busy-1"
    assert busy.count >= 1
    alive.mode = "unavailable"
    before = (busy.count, alive.count)
    started = time.monotonic()
    response = complete(coordinator, "model-busy")
    assert time.monotonic() - started >= UNAVAILABLE_WAIT_SEC  # held until the client deadline
    assert response.status_code == 503
    assert response.headers["retry-after"]
    assert "answered 503" in response.json()["error"]["message"]
    # the fault pause (1 s) outlasts the deadline: each endpoint at most once, the one not paused once
    assert alive.count - before[1] == 1
    assert busy.count - before[0] in (0, 1)
    # what clients saw: the re-routed requests, the one failed past the deadline, and its wait
    seen = outcomes(coordinator, model="model-busy", since=window_start)
    assert seen["failed"] == 1
    assert seen["rerouted"] >= 1
    assert seen["longest_wait_sec"] >= UNAVAILABLE_WAIT_SEC
    assert seen["complete"] is True


def outcomes(url: str, *, model: str, since: float) -> dict[str, Any]:
    params = {"since": f"{since:.3f}", "until": f"{time.time() + 1:.3f}", "model": model}
    response = httpx.get(
        f"{url}{COORDINATOR_CLIENT_OUTCOMES_PATH}", headers=MANAGE, params=params, timeout=5, verify=client_tls()
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_request_held_while_nothing_is_published_is_counted_with_its_wait(coordinator: str, fleet: Fleet) -> None:
    engine = fleet.start("held-0")
    publish(coordinator, "held", "model-held", [engine.endpoint(0)])
    since = time.time()
    manage(coordinator, COORDINATOR_DEL_PATH, {"instance_id": "held", "endpoint_ids": [0], "request_id": "sd-held"})
    started = time.monotonic()
    response = complete(coordinator, "model-held")  # held for a publication until the client deadline
    assert response.status_code == 503, response.text
    assert time.monotonic() - started >= UNAVAILABLE_WAIT_SEC
    seen = outcomes(coordinator, model="model-held", since=since)
    assert (seen["held"], seen["rerouted"], seen["failed"]) == (1, 0, 1)
    assert seen["longest_wait_sec"] >= UNAVAILABLE_WAIT_SEC
    publish(coordinator, "held", "model-held", [engine.endpoint(0)], generation=1)
    assert complete(coordinator, "model-held").status_code == 200  # an undisturbed request is not counted
    assert outcomes(coordinator, model="model-held", since=since)["held"] == 1
    assert outcomes(coordinator, model="model-nobody", since=since)["longest_wait_sec"] is None
    # the cluster token guards it, and a window that is no window is a 400
    url = f"{coordinator}{COORDINATOR_CLIENT_OUTCOMES_PATH}"
    assert httpx.get(url, params={"since": 1, "until": 2}, timeout=5, verify=client_tls()).status_code == 401
    queries: list[dict[str, str]] = [{"since": "5", "until": "2"}, {"until": "2"}, {"since": "nan", "until": "2"}]
    for query in queries:
        bad = httpx.get(url, headers=MANAGE, params=query, timeout=5, verify=client_tls())
        assert bad.status_code == 400, (query, bad.text)


def test_a_connection_closed_before_the_headers_is_sent_elsewhere(coordinator: str, fleet: Fleet) -> None:
    closer = BrokenEngine(mid_stream=False)
    alive = fleet.start("closer-1")
    try:
        publish(coordinator, "closer", "model-closer", [closer.endpoint(0), alive.endpoint(1)])
        for _ in range(4):
            response = complete(coordinator, "model-closer")
            assert response.status_code == 200, response.text
        assert closer.count >= 1
    finally:
        closer.close()


def test_streaming_pass_through_and_a_mid_stream_failure(coordinator: str, fleet: Fleet) -> None:
    streamer = fleet.start("stream-0")
    broken = BrokenEngine(mid_stream=True)
    try:
        publish(coordinator, "stream", "model-stream", [streamer.endpoint(0)])
        publish(coordinator, "midstream", "model-midstream", [broken.endpoint(0)])
        with httpx.stream(
            "POST",
            f"{coordinator}/v1/chat/completions",
            headers=KEY,
            json={"model": "model-stream", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            timeout=10,
            verify=client_tls(),
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in response.iter_lines() if line]
        assert lines == [
            *(f"data: {json.dumps({'choices': [_choice(streamer, i)]})}" for i in range(3)),
            "data: [DONE]",
        ]
        started = time.monotonic()
        response = complete(coordinator, "model-midstream", stream=True)
        assert time.monotonic() - started < 5  # ends, never hangs
        events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
        assert json.loads(events[0])["choices"][0]["text"] == "partial"
        assert "could not be resumed" in json.loads(events[1])["error"]["message"]  # no survivor to resume on
        assert events[2:] == ["[DONE]"]
        assert broken.count == 1
    finally:
        broken.close()


def test_a_client_that_leaves_mid_stream_frees_its_endpoint(coordinator: str, fleet: Fleet) -> None:
    slow = fleet.start("leave-0")
    slow.events, slow.stream_gap = 50, 0.05
    publish(coordinator, "leave", "model-leave", [slow.endpoint(0)])
    gone = 'heteroflow_coordinator_requests_total{outcome="client_gone",route="completions"}'
    before = metric(coordinator, gone)
    with httpx.stream(
        "POST",
        f"{coordinator}/v1/completions",
        headers=KEY,
        json={"model": "model-leave", "stream": True},
        timeout=10,
        verify=client_tls(),
    ) as response:
        first = next(line for line in response.iter_lines() if line)
        assert first.startswith("data: ")
    # the client hung up after one event of fifty: the relay ends and the endpoint is no longer busy
    in_flight = 'heteroflow_coordinator_in_flight_requests{instance="leave"}'
    until(lambda: metric(coordinator, gone) == before + 1, within=10, what="the relay noticed the client left")
    assert metric(coordinator, in_flight) == 0


def test_upstream_4xx_is_passed_through_unchanged(coordinator: str, fleet: Fleet) -> None:
    engines = [fleet.start(f"reject-{i}") for i in range(2)]
    publish(coordinator, "reject", "model-reject", [e.endpoint(i) for i, e in enumerate(engines)])
    response = httpx.post(
        f"{coordinator}/v1/completions",
        headers=KEY,
        json={"model": "model-reject", "prompt": "reject"},
        timeout=10,
        verify=client_tls(),
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("rejected by reject-")
    assert sum(e.count for e in engines) == 1


def test_unknown_model_empty_view_and_auth(coordinator: str, fleet: Fleet) -> None:
    unknown = complete(coordinator, "no-such-model")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "NotFoundError"
    publish(coordinator, "empty", "model-empty", [])
    started = time.monotonic()
    empty = complete(coordinator, "model-empty")
    assert time.monotonic() - started >= UNAVAILABLE_WAIT_SEC
    assert empty.status_code == 503
    assert empty.headers["retry-after"]
    body = {"model": "model-empty", "prompt": "x"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, MANAGE):
        assert (
            httpx.post(
                f"{coordinator}/v1/completions", headers=headers, json=body, timeout=5, verify=client_tls()
            ).status_code
            == 401
        )
    for headers in ({}, {"Authorization": "Bearer wrong"}, KEY):
        refused = httpx.get(
            f"{coordinator}{COORDINATOR_INSTANCES_PATH}", headers=headers, timeout=5, verify=client_tls()
        )
        assert refused.status_code == 401
        assert httpx.get(f"{coordinator}/metrics", headers=headers, timeout=5, verify=client_tls()).status_code == 401
    assert httpx.get(f"{coordinator}/health", timeout=5, verify=client_tls()).status_code == 200


def test_oversized_deep_and_malformed_bodies_are_4xx(coordinator: str, fleet: Fleet) -> None:
    engine = fleet.start("bodies-0")
    publish(coordinator, "bodies", "model-bodies", [engine.endpoint(0)])
    url = f"{coordinator}/v1/completions"
    huge = json.dumps({"model": "model-bodies", "prompt": "x" * (2 * 1024 * 1024)}).encode()
    deep = b'{"model": "model-bodies", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    cases = [(huge, 413), (deep, 400), (b'{"model": ', 400), (b'{"prompt": "x"}', 400), (b"\xff\xfe", 400)]
    for content, status in cases:
        response = httpx.post(
            url, headers={**KEY, "content-type": "application/json"}, content=content, timeout=10, verify=client_tls()
        )
        assert response.status_code == status, (content[:40], response.text)
        assert response.json()["error"]["message"]
    assert engine.count == 0


def test_the_management_listener_serves_the_views_and_a_taken_port_stops_the_start(fleet: Fleet) -> None:
    port, management = free_port(), free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("HETEROFLOW_")}
    env.update(
        {
            "HETEROFLOW_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN,
            "HETEROFLOW_COORDINATOR_API_KEY_HASHES": TEST_API_KEY_SHA256,
            "HETEROFLOW_COORDINATOR_MANAGEMENT_PORT": str(management),
            "HETEROFLOW_COORDINATOR_LOG_LEVEL": "warning",
        }
    )
    command = [sys.executable, "-m", "heteroflow.cli.main", "coordinator", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url, manage_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{management}"
    try:

        def up() -> bool:
            assert process.poll() is None
            with contextlib.suppress(httpx.HTTPError):
                return all(
                    httpx.get(f"{u}/health", timeout=1, verify=client_tls()).status_code == 200
                    for u in (url, manage_url)
                )
            return False

        until(up, within=30, what="both listeners up")
        engine = fleet.start("managed-0")
        publish(manage_url, "managed", "model-managed", [engine.endpoint(0)])
        assert complete(url, "model-managed").json()["choices"][0]["text"] == "managed-0"
        assert (
            httpx.get(f"{manage_url}/metrics", headers=MANAGE, timeout=5, verify=client_tls()).status_code == 404
        )  # views only
        assert (
            httpx.post(f"{manage_url}{COORDINATOR_SET_PATH}", json={}, timeout=5, verify=client_tls()).status_code
            == 401
        )
        # a second Coordinator whose management port is taken says so and exits instead of running without it
        taken = subprocess.run(
            [sys.executable, "-m", "heteroflow.cli.main", "coordinator", "--port", str(free_port())],
            env=env,
            capture_output=True,
            timeout=60,
        )
        assert taken.returncode == 1
        assert b"coordinator.management_listener_failed" in taken.stdout + taken.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
