"""The transport every service answers through: a response's head and body in one write, nothing held past the
event loop's turn, the bytes in the order they were written; and the open-file limit every service raises at start
(``cli/http_server.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import socket
import struct
import weakref
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from structlog.testing import capture_logs
from uvicorn.server import ServerState

from heteroflow.cli.http_server import (
    JOINED_AT_MOST,
    BoundedHttpToolsProtocol,
    HeadWithBody,
    raise_open_file_limit,
    server_config,
)
from heteroflow.core.testing import free_port


class RecordingTransport(asyncio.Transport):
    """What a connection's socket would send, one entry per ``write`` (as one ``send``)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.lines: list[list[bytes]] = []
        self.closed = False
        self.wrote = asyncio.Event()

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self.wrote.set()

    def writelines(self, list_of_data: Any) -> None:
        self.lines.append([bytes(data) for data in list_of_data])

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 0  # every write sent at once

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    async def next_write(self) -> bytes:
        """The next write, waited for (the transport's own signal, bounded)."""
        seen = len(self.writes)
        while len(self.writes) == seen:
            self.wrote.clear()
            await asyncio.wait_for(self.wrote.wait(), timeout=5)
        return self.writes[seen]


def _connection(app: Starlette) -> tuple[BoundedHttpToolsProtocol, RecordingTransport]:
    config: uvicorn.Config = server_config(app, host="127.0.0.1", port=0)
    protocol = BoundedHttpToolsProtocol(config=config, server_state=ServerState(), app_state={})
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport


def _post(path: str, body: bytes = b"{}") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (path.encode(), len(body), body)


def test_a_response_goes_out_in_one_write_head_and_body() -> None:
    asyncio.run(_one_write_each())


async def _one_write_each() -> None:
    async def answer(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "got": len(await request.body())})

    protocol, transport = _connection(Starlette(routes=[Route("/beat", answer, methods=["POST"])]))
    for _ in range(3):  # keep-alive: every response of the connection, not only the first
        protocol.data_received(_post("/beat", b'{"a": 1}'))
        written = await transport.next_write()
        head, _, body = written.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert b"content-length: 23" in head
        assert body == b'{"status":"ok","got":8}'
    assert len(transport.writes) == 3, transport.writes


def test_a_streams_head_leaves_before_its_first_chunk_is_made() -> None:
    asyncio.run(_stream_head_first())


async def _stream_head_first() -> None:
    release = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        await release.wait()
        yield b"data: 1\n\n"

    async def stream(request: Request) -> StreamingResponse:
        return StreamingResponse(chunks(), media_type="text/event-stream")

    protocol, transport = _connection(Starlette(routes=[Route("/stream", stream, methods=["POST"])]))
    protocol.data_received(_post("/stream"))
    head = await transport.next_write()  # the chunk is not made yet: the head went out alone
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert head.endswith(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    release.set()
    assert (await transport.next_write()).startswith(b"9\r\ndata: 1")


def _held_on_this_loop() -> tuple[RecordingTransport, HeadWithBody]:
    transport = RecordingTransport()
    return transport, HeadWithBody(transport, asyncio.get_running_loop())


def test_closing_or_writing_lines_sends_what_is_held_first() -> None:
    asyncio.run(_held_first())


async def _held_first() -> None:
    transport, held = _held_on_this_loop()
    held.write(b"head")
    held.writelines([b"a", b"b"])
    assert transport.writes == [b"head"]
    assert transport.lines == [[b"a", b"b"]]
    held.write(b"more")  # after the turn's held bytes left, a write of the same turn goes straight out
    assert transport.writes == [b"head", b"more"]
    await asyncio.sleep(0)  # the turn ends: nothing left to send twice
    assert transport.writes == [b"head", b"more"]

    held.write(b"last")
    held.close()
    assert transport.writes[-1] == b"last"
    assert transport.closed
    await asyncio.sleep(0)
    assert transport.writes.count(b"last") == 1


def test_a_large_body_is_written_as_it_is_after_its_head() -> None:
    asyncio.run(_large_body())


async def _large_body() -> None:
    """A scrape's tens of megabytes are not copied to save one system call."""
    transport, held = _held_on_this_loop()
    body = b"x" * (JOINED_AT_MOST + 1)
    held.write(b"head")
    held.write(body)
    assert transport.writes == [b"head", body]
    assert transport.writes[1] is body  # not a copy
    small = b"y" * JOINED_AT_MOST
    await asyncio.sleep(0)
    held.write(b"head")
    held.write(small)
    assert transport.writes[2:] == [b"head" + small]


def test_held_bytes_are_a_copy_and_a_closed_connection_is_not_written() -> None:
    asyncio.run(_copy_and_closed())


async def _copy_and_closed() -> None:
    transport, held = _held_on_this_loop()
    buffer = bytearray(b"head")
    held.write(buffer)
    buffer[:] = b"XXXX"  # the caller reuses its buffer within the turn
    assert held.get_write_buffer_size() == 4
    await asyncio.sleep(0)
    assert transport.writes == [b"head"]

    held.write(b"late")
    transport.close()  # the connection went away in the same turn (the transport closed under it)
    await asyncio.sleep(0)
    assert transport.writes == [b"head"]


@pytest.mark.parametrize("name", ["get_extra_info", "pause_reading", "is_closing"])
def test_everything_else_is_the_transports_own(name: str) -> None:
    transport = RecordingTransport()
    held = HeadWithBody(transport, cast(asyncio.AbstractEventLoop, None))
    assert getattr(held, name) == getattr(transport, name)


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[int]:
    """``app`` served by a real uvicorn server with :func:`server_config`, on this loop; yields its port."""
    port = free_port()
    server = uvicorn.Server(server_config(app, host="127.0.0.1", port=port, lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:  # the server's own flag, bounded by the test timeout
            assert not task.done(), task
            await asyncio.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        await task


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """One answer's status line and body (a JSON body with a content-length)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    return head.split(b"\r\n", 1)[0] + b" " + await asyncio.wait_for(reader.readexactly(length), timeout=5)


def test_a_client_that_resets_its_connection_costs_only_its_own_answer(caplog: pytest.LogCaptureFixture) -> None:
    """The real failure: clients reset their connections (RST) before their answers are written; the server
    writes nothing after, raises nothing, and answers the next client in one piece."""
    asyncio.run(_resets())
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def _resets() -> None:
    answering = asyncio.Event()
    answered = 0

    async def slow(request: Request) -> JSONResponse:
        nonlocal answered
        await answering.wait()  # the client has gone by now
        answered += 1
        return JSONResponse({"status": "ok"})

    async with serving(Starlette(routes=[Route("/beat", slow, methods=["POST"])])) as port:
        for _ in range(5):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post("/beat"))
            await writer.drain()
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            writer.transport.abort()
        answering.set()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/beat"))
        assert await _answer(reader) == b'HTTP/1.1 200 OK {"status":"ok"}'
        writer.close()
        assert answered == 6  # every reset client's handler ran to its end


class Marker:
    """Put into a request's scope by the application: whether anything still holds the scope (a weak reference)."""


def test_an_idle_connection_keeps_nothing_of_the_request_it_answered() -> None:
    """Every agent keeps its connection open between beats: what the connection holds while it waits is held once
    per node. The answered request's scope (and so whatever the application kept in it) is let go."""
    asyncio.run(_idle_keeps_nothing())


async def _idle_keeps_nothing() -> None:
    kept: list[weakref.ref[Marker]] = []

    async def beat(request: Request) -> JSONResponse:
        marker = Marker()
        request.scope["marker"] = marker
        kept.append(weakref.ref(marker))
        return JSONResponse({"status": "ok"})

    async with serving(Starlette(routes=[Route("/beat", beat, methods=["POST"])])) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(_post("/beat"))
            assert await _answer(reader) == b'HTTP/1.1 200 OK {"status":"ok"}'
        gc.collect()
        assert [ref() for ref in kept] == [None, None]  # the connection is open and idle
        writer.close()


def test_requests_queued_or_begun_while_one_is_answered_are_answered_in_order() -> None:
    """Letting go of an answered request's scope must not touch the next one: a whole request queued behind it
    (pipelined), or the first bytes of the next head, arriving before the answer is complete."""
    asyncio.run(_queued_and_begun())


async def _queued_and_begun() -> None:
    entered, answering = asyncio.Event(), asyncio.Event()

    async def slow(request: Request) -> JSONResponse:
        entered.set()
        await answering.wait()
        return JSONResponse({"path": "slow"})

    async def fast(request: Request) -> JSONResponse:
        return JSONResponse({"path": request.url.path, "header": request.headers.get("x-next", "")})

    routes = [Route("/slow", slow, methods=["POST"]), Route("/fast", fast, methods=["POST"])]
    async with serving(Starlette(routes=routes)) as port:
        for split in (None, 20):  # the next request whole, or only its first 20 bytes, before the answer
            entered.clear()
            answering.clear()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            following = b"POST /fast HTTP/1.1\r\nhost: x\r\nx-next: yes\r\ncontent-length: 0\r\n\r\n"
            writer.write(_post("/slow") + following[:split])
            await asyncio.wait_for(entered.wait(), timeout=5)
            answering.set()
            assert await _answer(reader) == b'HTTP/1.1 200 OK {"path":"slow"}'
            writer.write(following[split:] if split else b"")
            assert await _answer(reader) == b'HTTP/1.1 200 OK {"path":"/fast","header":"yes"}'
            writer.close()


class Limits:
    """The process's open-file limits as ``resource`` shows them, kept here (``fail``: setting them is refused)."""

    def __init__(self, soft: int, hard: int, *, fail: bool = False) -> None:
        self.soft, self.hard, self.fail = soft, hard, fail

    def get(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def set(self, which: int, limits: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        if self.fail:
            raise ValueError("not allowed")
        self.soft, self.hard = limits


@pytest.mark.parametrize(
    ("soft", "hard", "fail", "expected", "events"),
    [
        (1024, 65536, False, 65536, []),  # systemd's soft limit under its hard one: raised, nothing to say
        (65536, 65536, False, 65536, []),
        (256, 4096, False, 4096, ["http.open_files_low"]),  # raised, and still short of a fleet
        (256, 65536, True, 256, ["http.open_files_not_raised", "http.open_files_low"]),
    ],
)
def test_the_open_file_limit_is_raised_to_the_hard_one_and_a_short_one_is_said(
    monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, fail: bool, expected: int, events: list[str]
) -> None:
    limits = Limits(soft, hard, fail=fail)
    monkeypatch.setattr(resource, "getrlimit", limits.get)
    monkeypatch.setattr(resource, "setrlimit", limits.set)
    with capture_logs() as logged:
        assert raise_open_file_limit() == expected
    assert (limits.soft, limits.hard) == (soft if fail else expected, hard)
    assert [entry["event"] for entry in logged] == events
    assert all(entry["log_level"] == "warning" for entry in logged)
