"""The HTTP the Forwarder relays: headers each way, SSE event framing, error events and the streamed answer.

The rules of forwarding (hold, re-route, resume) are in :mod:`.proxy`; this module holds what it changes in,
or reads from, the bytes and headers that pass through.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from typing import Any

import httpx
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from heteroflow.serving.coordinator.errors import openai_error_body
from heteroflow.serving.coordinator.streams import DONE, Event, split_event
from heteroflow.serving.coordinator.views import EndpointKey

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade"}
)  # fmt: skip
_NOT_FORWARDED = _HOP_BY_HOP | {"host", "authorization", "content-length", "cookie", "accept-encoding", "x-request-id"}
ENDPOINT_HEADER = "x-heteroflow-endpoint"
"""Names the ``instance/endpoint`` whose engine answered (added to every engine answer, for tracing a request)."""
_NOT_RETURNED = _HOP_BY_HOP | {"content-length", "date", "server", ENDPOINT_HEADER}


def upstream_headers(
    client_headers: Iterable[tuple[str, str]], *, request_id: str, token: str | None, stream: bool
) -> dict[str, str]:
    """What the engine gets: the client's headers minus hop-by-hop ones and its credentials.

    The client's API key is never forwarded (the engine trusts the cluster token instead), and a streamed
    answer is asked uncompressed so that it can be cut at event boundaries.
    """
    given = list(client_headers)
    out = {name: value for name, value in given if name.lower() not in _NOT_FORWARDED}
    encoding = next((value for name, value in given if name.lower() == "accept-encoding"), "identity")
    out["accept-encoding"] = "identity" if stream else encoding
    out["x-request-id"] = request_id
    if token:
        out["authorization"] = f"Bearer {token}"
    return out


def returned_headers(upstream: httpx.Headers, *, decoded: bool, answered_by: EndpointKey) -> dict[str, str]:
    """What the client gets: the engine's headers minus hop-by-hop ones, plus which endpoint answered."""
    drop = _NOT_RETURNED | ({"content-encoding"} if decoded else frozenset())
    kept = {name: value for name, value in upstream.multi_items() if name.lower() not in drop}
    # header values are latin-1 on the wire: ids the controller chose may not be
    kept[ENDPOINT_HEADER] = answered_by.label.encode("ascii", "backslashreplace").decode("ascii")
    return kept


def last_event_end(buffer: bytes) -> int:
    """Length of the prefix of ``buffer`` that holds only complete SSE events (0 if none ends yet)."""
    ends = [buffer.rfind(separator) + len(separator) for separator in (b"\n\n", b"\r\n\r\n") if separator in buffer]
    return max(ends, default=0)


def stream_error_event(message: str, *, code: int = 502) -> bytes:
    body = openai_error_body(status_code=code, kind="BadGatewayError", message=message)
    return b"data: " + json.dumps(body).encode("utf-8") + b"\n\n" + DONE


class EventReader:
    """SSE events from a chunk iterator, one at a time; a partial event at the end of the stream is dropped."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    async def next(self) -> Event | None:
        while True:
            cut = split_event(self._buffer)
            if cut:
                raw, self._buffer = self._buffer[:cut], self._buffer[cut:]
                return Event.parse(raw)
            chunk = await anext(self._chunks, None)
            if chunk is None:
                return None
            self._buffer += chunk


def parsed_body(raw: bytes) -> dict[str, Any] | None:
    with contextlib.suppress(ValueError):
        body = json.loads(raw)
        return body if isinstance(body, dict) else None
    return None


def error_text(event: Event) -> str:
    error = event.payload.get("error") if event.payload is not None else None
    message = error.get("message") if isinstance(error, dict) else error
    return str(message)[:200] if message else "no detail"


class RelayResponse(StreamingResponse):
    """A streamed answer; its generator (and so its leases and connections) is closed however the response ends
    (finished, failed upstream, or the client went away)."""

    def __init__(self, *, events: AsyncGenerator[bytes, None], status_code: int, headers: Mapping[str, str]) -> None:
        self._events = events
        super().__init__(events, status_code=status_code, headers=dict(headers))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(RuntimeError):  # still running: it was cancelled and closes itself
                await self._events.aclose()
