"""Test doubles of the Coordinator's outside systems, shipped for its tests and for its consumers'.

- :class:`FakeUpstreams` — an ``httpx`` transport in memory that plays any number of OpenAI engines, each
  scripted (:class:`EngineMode`): answer, 503 while recovering, refuse connections, drop the connection
  before the headers or in the middle of a stream, reject with 400, or hold requests until released. Like
  httpcore, it calls the ``trace`` request extension around writing the request headers, so the
  Coordinator's last-moment withdrawal check runs exactly as over real sockets, and a request only counts
  as received once that check let it through.
- :class:`FakePlatform` — the platform server's ``/healthz`` key check, in memory.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx

from heteroflow.serving.coordinator.auth import PlatformUnavailableError

TEST_CLUSTER_TOKEN = "coordinator-test-cluster-token"  # noqa: S105 - a fixture value, not a secret
TEST_API_KEY = "coordinator-test-api-key"
TEST_API_KEY_SHA256 = "05e92674c81c2b93b2afabcd7dc8eae98cf66761cb0d5be18d019b80e71bdff8"
"""sha256 of :data:`TEST_API_KEY`, as ``HETEROFLOW_COORDINATOR_API_KEY_HASHES`` lists keys."""


class EngineMode(StrEnum):
    OK = "ok"
    UNAVAILABLE = "unavailable"
    """HTTP 503, as an engine answers while it recovers."""
    INTERNAL_ERROR = "internal_error"
    """HTTP 500 with an OpenAI error body, as vLLM answers when its engine core died under the request."""
    REFUSE = "refuse"
    """Connection refused: the process is gone."""
    DISCONNECT = "disconnect"
    """The connection closes after the request, before any response byte."""
    FAIL_MID_STREAM = "fail_mid_stream"
    """A streamed answer sends one event, then the connection breaks."""
    REJECT = "reject"
    """HTTP 400 with an OpenAI error body (must be passed through, never retried)."""
    ABORT = "abort"
    """A released vLLM's answer to a request its fault aborted: 200 with ``finish_reason: "abort"`` and no
    text (a stream: one such event, then ``[DONE]``)."""
    ABORT_MID_STREAM = "abort_mid_stream"
    """A streamed answer sends one event with text, then ``finish_reason: "abort"`` and ``[DONE]``; an answer
    that is not streamed is 200 with the text made so far and ``finish_reason: "abort"`` (real vLLM 0.32)."""
    DONE_MID_STREAM = "done_mid_stream"
    """A streamed answer sends one event with text, then ``[DONE]`` without any ``finish_reason``."""
    ERROR_MID_STREAM = "error_mid_stream"
    """A streamed answer sends one event with text, then an error event (the simulator's aborted stream)."""
    HANG = "hang"
    """The request is received and never answered (a released vLLM's new requests while it is faulted)."""


@dataclass
class ReceivedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeEngine:
    """One scripted engine at ``ip:port``."""

    name: str
    mode: EngineMode = EngineMode.OK
    received: list[ReceivedRequest] = field(default_factory=list)
    hold: asyncio.Event | None = None
    """When set to an event, every request waits for it after being received (to build up in-flight load)."""
    events: int = 3
    """Content events of a streamed answer (before ``[DONE]``)."""
    chunk_size: int | None = None
    """Cut a streamed answer into pieces of this many bytes (events then straddle chunks, as on a real socket)."""
    before_headers: Callable[[], Awaitable[None]] | None = None
    """Runs after the connection is "open" and before the request headers go out (to race a withdrawal)."""
    headers_gate: asyncio.Event | None = None
    """When set, writing the request headers waits for it (a slow socket write)."""

    def release(self) -> None:
        if self.hold is not None:
            self.hold.set()

    def answer_text(self) -> str:
        return f"answer from {self.name}"


class _Stream(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes], *, fail_after: int | None = None) -> None:
        self._chunks = chunks
        self._fail_after = fail_after

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for index, chunk in enumerate(self._chunks):
            if self._fail_after is not None and index >= self._fail_after:
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
            yield chunk
            await asyncio.sleep(0)


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


class FakeUpstreams(httpx.AsyncBaseTransport):
    """Every fake engine, addressed by ``ip:port`` as the Coordinator's published views name them."""

    def __init__(self) -> None:
        self.engines: dict[tuple[str, int], FakeEngine] = {}

    def add(self, ip: str, port: int, *, name: str | None = None) -> FakeEngine:
        engine = FakeEngine(name=name or f"{ip}:{port}")
        self.engines[(ip, port)] = engine
        return engine

    def total_received(self) -> int:
        return sum(len(engine.received) for engine in self.engines.values())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        engine = self.engines.get((request.url.host, request.url.port or 80))
        if engine is None or engine.mode is EngineMode.REFUSE:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        trace = request.extensions.get("trace")
        info = {"request": request}
        if engine.before_headers is not None:
            await engine.before_headers()
        if trace is not None:
            await trace("http11.send_request_headers.started", info)
        await asyncio.sleep(0)  # a real socket write yields here too
        if engine.headers_gate is not None:
            await engine.headers_gate.wait()
        if trace is not None:
            await trace("http11.send_request_headers.complete", {"return_value": None})
        body = json.loads(await request.aread() or b"{}")
        engine.received.append(ReceivedRequest(request.url.path, dict(request.headers), body))
        if engine.hold is not None:
            await engine.hold.wait()
        if engine.mode is EngineMode.HANG:
            await asyncio.Event().wait()
        if engine.mode is EngineMode.DISCONNECT:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        if engine.mode is EngineMode.UNAVAILABLE:
            return _json(503, _error(503, "ServiceUnavailableError", "engine is unhealthy; retry elsewhere"))
        if engine.mode is EngineMode.INTERNAL_ERROR:
            return _json(500, _error(500, "EngineDeadError", "EngineCore encountered an issue"))
        if engine.mode is EngineMode.REJECT:
            return _json(400, _error(400, "BadRequestError", f"rejected by {engine.name}"))
        if body.get("stream"):
            chunks = [
                sse(
                    {
                        "id": f"cmpl-{engine.name}",
                        "object": "text_completion",
                        "choices": [{"index": 0, "text": f"{engine.name}#{i}", "finish_reason": None}],
                    }
                )
                for i in range(engine.events)
            ]
            final = {"id": f"cmpl-{engine.name}", "object": "text_completion"}
            if engine.mode is EngineMode.ABORT:
                chunks = [sse({**final, "choices": [{"index": 0, "text": "", "finish_reason": "abort"}]})]
            elif engine.mode is EngineMode.ABORT_MID_STREAM:
                chunks = [chunks[0], sse({**final, "choices": [{"index": 0, "text": "", "finish_reason": "abort"}]})]
            elif engine.mode is EngineMode.DONE_MID_STREAM:
                chunks = [chunks[0]]
            elif engine.mode is EngineMode.ERROR_MID_STREAM:
                chunks = [chunks[0], sse(_error(503, "ServiceUnavailableError", "request aborted: engine unhealthy"))]
            else:
                chunks.append(sse({**final, "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}))
            chunks.append(sse("[DONE]"))
            if request.url.path.endswith("/chat/completions"):
                chunks = [_as_chat(chunk) for chunk in chunks]
            fail_after = 1 if engine.mode is EngineMode.FAIL_MID_STREAM else None
            if engine.chunk_size is not None:
                data = b"".join(chunks)
                size = engine.chunk_size
                chunks = [data[i : i + size] for i in range(0, len(data), size)]
                if fail_after is not None:  # break inside the second event: one whole event and a piece went out
                    cut = data.index(b"\n\n") + 2 + 10
                    fail_after = -(-cut // size)
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, stream=_Stream(chunks, fail_after=fail_after)
            )
        aborted = engine.mode in (EngineMode.ABORT, EngineMode.ABORT_MID_STREAM)
        partial = engine.answer_text() if engine.mode is EngineMode.ABORT_MID_STREAM else ""
        return _json(
            200,
            {
                "id": "cmpl-fake",
                "object": "text_completion",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "text": partial if aborted else engine.answer_text(),
                        "finish_reason": "abort" if aborted else "length",
                    }
                ],
            },
        )


def _as_chat(chunk: bytes) -> bytes:
    """A completions stream event as a chat one (``delta.content``); the first content event gets the role event
    a chat stream opens with before it."""
    payload = chunk.decode().removeprefix("data: ").strip()
    if payload == "[DONE]" or '"error"' in payload:
        return chunk
    event = json.loads(payload)
    event["object"] = "chat.completion.chunk"
    event["choices"] = [
        {"index": c["index"], "delta": {"content": c["text"]} if c["text"] else {}, "finish_reason": c["finish_reason"]}
        for c in event["choices"]
    ]
    opening = ""
    if event["choices"][0]["delta"].get("content", "").endswith("#0"):
        role = {
            **event,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
        opening = f"data: {json.dumps(role)}\n\n"
    return (opening + f"data: {json.dumps(event)}\n\n").encode()


def _error(code: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _json(status: int, body: dict[str, Any]) -> httpx.Response:
    # a stream, as a real transport returns: a response built from bytes counts as already read
    return httpx.Response(
        status, headers={"content-type": "application/json"}, stream=_Stream([json.dumps(body).encode()])
    )


class FakePlatform:
    """The platform's key check in memory: ``valid`` keys are accepted; ``down`` makes it unreachable."""

    def __init__(self, valid: set[str] | None = None) -> None:
        self.valid = set(valid or ())
        self.down = False
        self.calls = 0

    async def accepts(self, key: str) -> bool:
        self.calls += 1
        if self.down:
            raise PlatformUnavailableError("the platform could not be reached: ConnectError")
        return key in self.valid

    async def aclose(self) -> None:
        return None
