"""How every HeteroFlow service is served over HTTP: uvicorn, with a bound on the request head.

uvicorn's httptools protocol sets no limit on the size of a request line and headers: the parser keeps what it
receives until the head ends, so four clients sending 128 MiB headers cost the server half a gigabyte before any
middleware (the token check included) sees the request. :class:`BoundedHttpToolsProtocol` counts the bytes of
each request head as they arrive and answers 431 and closes the connection once a head passes
:data:`MAX_HEADER_BYTES`. It also sends a response's head and body in one write (:class:`HeadWithBody`). Every
service's command builds its server with :func:`server_config`, which also raises the process's limit on open
files (:func:`raise_open_file_limit`).
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any, Final, cast

import structlog
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_log = structlog.get_logger(__name__)

MAX_HEADER_BYTES: Final = 64 * 1024
"""Largest request line plus headers, bytes (64 KiB: four times h11's default; our largest header, a bearer
token, is under 100 bytes). The count is exact up to one socket read (at most 256 KiB) past it."""

_REFUSAL = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"connection: close\r\n"
    b"content-length: %d\r\n\r\n%s"
)


def _refusal() -> bytes:
    body = b'{"error": "headers_too_large", "detail": "the request line and headers are larger than %d bytes"}' % (
        MAX_HEADER_BYTES
    )
    return _REFUSAL % (len(body), body)


JOINED_AT_MOST: Final = 16 * 1024
"""Largest body joined to its head (a copy of both). A larger one (a fleet's ``/metrics``: tens of megabytes) goes
in a write of its own: its copy, made a few times a minute, left the server ~130 MiB larger, the allocator keeping
the memory it had served it from (docs/benchmarks.md)."""


class HeadWithBody:
    """A connection's transport that sends a response's head and its body in one write.

    uvicorn writes a response's status line and headers as soon as the application starts the response, and the
    body in a second write: two ``send`` system calls, and two TCP segments for the client to take in, for an
    answer of a few hundred bytes (a heartbeat's). This transport keeps a write made while nothing is held until
    the end of the event loop's turn: a write in the same turn (the body, which a plain response sends right after
    its start) goes out with it in one ``send`` when it is at most :data:`JOINED_AT_MOST` bytes; otherwise the
    turn's end sends it alone. Nothing waits past the turn in which it was written (a stream's head leaves before
    its first chunk is made), and the order of the bytes is the order of the writes: closing, or any other way of
    writing, sends what is held first. Everything else is the transport's own.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        """``None``: nothing held and no send due; the bytes held for the send due at the turn's end (empty: the
        turn's writes went out already)."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is None:  # the turn's first write: held (a copy, should the caller reuse a buffer)
            self._held = bytes(data)
            self._loop.call_soon(self._send_held)
        elif held:  # the second: both in one send, unless it is large
            self._held = b""
            if len(data) <= JOINED_AT_MOST:
                self._transport.write(held + data)
            else:
                self._transport.write(held)
                self._transport.write(data)
        else:
            self._transport.write(data)

    def _send_held(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held)

    def _release(self) -> None:
        """Send what is held now (before a write by other means, or closing); the turn's end has nothing left."""
        held = self._held
        if held:
            self._held = b""
            self._transport.write(held)

    def writelines(self, data: Any) -> None:
        self._release()
        self._transport.writelines(data)

    def write_eof(self) -> None:
        self._release()
        self._transport.write_eof()

    def close(self) -> None:
        self._release()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with at most :data:`MAX_HEADER_BYTES` of request head per request, each
    response's head sent with its body (:class:`HeadWithBody`), and nothing of an answered request kept while the
    connection waits for the next one (:meth:`on_response_complete`)."""

    max_header_bytes: int = MAX_HEADER_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._in_body = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(cast(asyncio.Transport, HeadWithBody(transport, self.loop)))

    def data_received(self, data: bytes) -> None:
        counting = not self._in_body
        if counting:
            self._head_bytes += len(data)
        super().data_received(data)
        # judged after parsing: one read may hold a whole head and the start of its body; the head did not end
        # in it when the parser is still before the body
        if (
            counting
            and not self._in_body
            and self._head_bytes > self.max_header_bytes
            and not self.transport.is_closing()
        ):
            self.transport.write(_refusal())
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._in_body = True
        self._head_bytes = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False

    def on_response_complete(self) -> None:
        """Once a request is answered and no other is queued behind it, let go of its scope.

        uvicorn keeps the answered request's scope (its headers, and what the application put in it: FastAPI's
        exit stacks, the route's state) on the connection until the next request arrives. Every agent keeps an
        idle connection open between beats, so a 10,000-node fleet held 10,000 answered scopes: 5.1 of the 13.3
        KiB that an idle connection kept in the server (docs/benchmarks.md). Nothing reads an answered request's
        scope again: a queued (pipelined) request has its own, and the protocol's is replaced when the next
        request begins; a request whose head is arriving meanwhile keeps its own (it is not the cycle's)."""
        super().on_response_complete()
        cycle = self.cycle
        if cycle is None or not cycle.response_complete or self.pipeline:
            return
        if self.scope is cycle.scope:  # no later request has begun on this connection
            self.scope = self.headers = None  # type: ignore[assignment]  # as uvicorn's own before a first request
        cycle.scope = None  # type: ignore[assignment]  # an answered cycle reads its scope no more


FLEET_OPEN_FILES: Final = 16_384
"""Open files under which a server warns at start: a 10,000-node fleet's agents hold 10,000 connections to the
platform server (with room for the database, the logs and the clients of the web UI)."""


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit and return it; warn when it stays short of
    :data:`FLEET_OPEN_FILES`, or cannot be raised.

    Every socket is an open file, and every agent keeps a connection to the platform server: one a node, all the
    time (it keeps its connection between beats: ``agent/client.py``). The usual soft limit is 1,024 (systemd's
    default for a service, and most shells'), and past it the server cannot accept: uvloop closes the new
    connections unanswered, and nothing is logged (a server started under a soft limit of 256 closed 161 of 400
    connections held open at once; ``tests/e2e/test_server_process.py``). The hard limit is the operator's
    (``LimitNOFILE=`` of a systemd unit, ``ulimit -Hn``); a process may raise its soft limit up to it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            _log.warning("http.open_files_not_raised", soft=soft, hard=hard, error=str(exc))
    if soft != resource.RLIM_INFINITY and soft < FLEET_OPEN_FILES:
        _log.warning(
            "http.open_files_low",
            limit=soft,
            hint="each agent or client keeps a connection open, and past this limit new connections are closed "
            f"unanswered: raise the hard limit to at least {FLEET_OPEN_FILES} for a fleet (LimitNOFILE= in the "
            "systemd unit, ulimit -Hn)",
        )
    return soft


def server_config(app: Any, *, host: str, port: int, **options: Any) -> uvicorn.Config:
    """A uvicorn configuration for one of our services: our logging (``log_config=None``), no access log, and
    the bounded request head. The process's open-file limit is raised first (:func:`raise_open_file_limit`)."""
    raise_open_file_limit()
    return uvicorn.Config(
        app, host=host, port=port, http=BoundedHttpToolsProtocol, log_config=None, access_log=False, **options
    )


def serve(app: Any, *, host: str, port: int, **options: Any) -> None:
    """Run ``app`` until the process is told to stop (what ``uvicorn.run`` does, with :func:`server_config`)."""
    uvicorn.Server(server_config(app, host=host, port=port, **options)).run()


def serve_workers(app: str, *, host: str, port: int, workers: int, **options: Any) -> None:
    """Run ``workers`` processes of the uvicorn factory ``app`` (``module:function``) on one listening socket,
    under uvicorn's supervisor: it restarts a worker that dies and stops them all on SIGTERM or SIGINT."""
    from uvicorn.supervisors import Multiprocess

    config = server_config(app, host=host, port=port, workers=workers, factory=True, **options)
    sock = config.bind_socket()
    Multiprocess(config, sockets=[sock]).run()
