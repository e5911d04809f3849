"""The JSON peer client: the bearer token, one pooled client per peer, and errors that carry retry meaning."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pydantic import BaseModel

from heteroflow.http.peer import JsonPeer, Rejected, Unavailable, parse_retry_after


class _Ask(BaseModel):
    n: int
    note: str | None = None


class _Answer(BaseModel):
    doubled: int


def _peer(handler: httpx.MockTransport, *, seen: list[str], unavailable: tuple[int, ...] = ()) -> JsonPeer:
    def transport_for(base: str) -> httpx.AsyncBaseTransport:
        seen.append(base)
        return handler

    return JsonPeer(token="tok", timeout_sec=1.0, transport_for=transport_for, unavailable_statuses=unavailable)


def test_post_sends_token_and_body_and_reads_the_answer() -> None:
    requests: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"doubled": 2 * int(request.read().decode().split(":")[1].strip("}"))})

    seen: list[str] = []
    peer = _peer(httpx.MockTransport(handle), seen=seen)

    async def run() -> list[_Answer]:
        answers = [await peer.post("http://a/", "/x", _Ask(n=n), _Answer) for n in (1, 2)]
        await peer.aclose()
        return answers

    assert [a.doubled for a in asyncio.run(run())] == [2, 4]
    assert seen == ["http://a"]  # one pooled client for both requests
    assert requests[0].headers["authorization"] == "Bearer tok"
    assert requests[0].read() == b'{"n":1}'  # None fields are left out


def test_nobody_answering_is_unavailable() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    peer = _peer(httpx.MockTransport(handle), seen=[])
    with pytest.raises(Unavailable, match="ConnectError") as caught:
        asyncio.run(peer.post("http://a", "/x", _Ask(n=1), _Answer))
    assert caught.value.retry_after_sec is None


def test_an_overloaded_peer_is_unavailable_with_its_retry_after() -> None:
    peer = _peer(
        httpx.MockTransport(lambda _: httpx.Response(503, json={"detail": "busy"}, headers={"Retry-After": "7"})),
        seen=[],
        unavailable=(503,),
    )
    with pytest.raises(Unavailable, match="HTTP 503: busy") as caught:
        asyncio.run(peer.post("http://a", "/x", _Ask(n=1), _Answer))
    assert caught.value.retry_after_sec == 7.0


def test_a_refusal_is_rejected_with_its_status() -> None:
    peer = _peer(httpx.MockTransport(lambda _: httpx.Response(503, json={"error": "not_leader"})), seen=[])
    with pytest.raises(Rejected, match="HTTP 503: not_leader") as caught:
        asyncio.run(peer.post("http://a", "/x", _Ask(n=1), _Answer))
    assert caught.value.status == caught.value.status_code == 503


@pytest.mark.parametrize("content", [b"not json", b'{"doubled": "x"}'])
def test_an_answer_that_breaks_the_contract_is_rejected(content: bytes) -> None:
    peer = _peer(httpx.MockTransport(lambda _: httpx.Response(200, content=content)), seen=[])
    with pytest.raises(Rejected, match="unexpected answer") as caught:
        asyncio.run(peer.post("http://a", "/x", _Ask(n=1), _Answer))
    assert caught.value.status == 200


@pytest.mark.parametrize(("content", "error"), [(b"[1]", "not an object"), (b"<html>", "not JSON")])
def test_get_object_refuses_what_is_not_an_object(content: bytes, error: str) -> None:
    peer = _peer(httpx.MockTransport(lambda _: httpx.Response(200, content=content)), seen=[])
    with pytest.raises(Rejected, match=error):
        asyncio.run(peer.get_object("http://a", "/status"))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("7", 7.0), (" 12 ", 12.0), ("0", 0.0), (None, None), ("", None), ("soon", None), ("-1", None),
     ("Wed, 21 Oct 2015 07:28:00 GMT", None)],
)  # fmt: skip
def test_retry_after_seconds(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


def test_a_request_may_carry_its_own_credential_and_query() -> None:
    requests: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"ok": True})

    peer = _peer(httpx.MockTransport(handle), seen=[])

    async def run() -> None:
        await peer.send("http://a", "GET", "/check", headers={"Authorization": "Bearer the-key"})
        assert await peer.get_object("http://a", "/feed", params={"cursor": "1.5", "limit": 10}) == {"ok": True}
        await peer.aclose()

    asyncio.run(run())
    assert requests[0].headers["authorization"] == "Bearer the-key"  # the request's own wins over the client's
    assert requests[1].headers["authorization"] == "Bearer tok"
    assert dict(requests[1].url.params) == {"cursor": "1.5", "limit": "10"}


@pytest.mark.parametrize(("status", "error"), [(404, Rejected), (503, Unavailable)])
def test_check_says_the_status_the_peer_answered(status: int, error: type[Exception]) -> None:
    peer = _peer(httpx.MockTransport(lambda _: httpx.Response(200)), seen=[], unavailable=(503,))
    answer = httpx.Response(status, json={"detail": "no such thing"}, request=httpx.Request("GET", "http://a/x"))
    peer.check(httpx.Response(204), "GET", "http://a/x", range(200, 300))  # a success status: nothing
    with pytest.raises(error, match=f"GET http://a/x answered HTTP {status}: no such thing"):
        peer.check(answer, "GET", "http://a/x", (200,))
