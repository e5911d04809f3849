"""Pure pieces of the forwarding: SSE event boundaries, the headers an engine gets and gives back."""

from __future__ import annotations

import json

import httpx
import pytest

from heteroflow.serving.coordinator.relay_http import (
    last_event_end,
    returned_headers,
    stream_error_event,
    upstream_headers,
)
from heteroflow.serving.coordinator.views import EndpointKey


@pytest.mark.parametrize(
    ("buffer", "end"),
    [
        (b"", 0),
        (b"dat", 0),
        (b"data: 1\n", 0),
        (b"data: 1\n\n", 9),
        (b"data: 1\n\ndata: 2", 9),
        (b"data: 1\n\ndata: 2\n\n", 18),
        (b"data: 1\r\n\r\ndata", 11),
    ],
)
def test_last_event_end(buffer: bytes, end: int) -> None:
    assert last_event_end(buffer) == end


def test_the_error_event_is_an_openai_error_then_done() -> None:
    first, second, rest = stream_error_event("boom").split(b"\n\n")
    assert json.loads(first.removeprefix(b"data: "))["error"]["message"] == "boom"
    assert second == b"data: [DONE]"
    assert rest == b""


def test_the_engine_gets_no_client_credentials_and_no_hop_by_hop_headers() -> None:
    client = [
        ("Authorization", "Bearer client-key"),
        ("Cookie", "a=1"),
        ("Connection", "keep-alive"),
        ("Host", "coordinator"),
        ("Content-Length", "12"),
        ("Accept-Encoding", "gzip"),
        ("Content-Type", "application/json"),
        ("X-Request-Id", "spoofed"),
    ]
    sent = upstream_headers(client, request_id="rid", token="cluster", stream=False)
    assert sent == {
        "Content-Type": "application/json",
        "accept-encoding": "gzip",
        "x-request-id": "rid",
        "authorization": "Bearer cluster",
    }
    streamed = upstream_headers(client, request_id="rid", token=None, stream=True)
    assert streamed["accept-encoding"] == "identity"  # events must be cut on plain text
    assert "authorization" not in streamed


KEY = EndpointKey("inst-1", 2, "10.0.0.7", 8102)


def test_returned_headers_drop_framing_keep_the_rest_and_name_the_endpoint() -> None:
    upstream = httpx.Headers(
        {"content-type": "text/event-stream", "content-length": "5", "content-encoding": "gzip", "server": "uvicorn",
         "x-heteroflow-endpoint": "spoofed/9"}
    )  # fmt: skip
    raw = returned_headers(upstream, decoded=False, answered_by=KEY)
    assert raw == {"content-type": "text/event-stream", "content-encoding": "gzip", "x-heteroflow-endpoint": "inst-1/2"}
    assert returned_headers(upstream, decoded=True, answered_by=KEY) == {
        "content-type": "text/event-stream",
        "x-heteroflow-endpoint": "inst-1/2",
    }


def test_the_endpoint_header_stays_latin_1() -> None:
    key = EndpointKey("décodé", 0, "10.0.0.7", 8100)
    headers = returned_headers(httpx.Headers(), decoded=True, answered_by=key)
    assert headers["x-heteroflow-endpoint"] == "d\\xe9cod\\xe9/0"
