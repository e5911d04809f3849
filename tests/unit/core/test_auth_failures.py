from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from heteroflow.core.auth_failures import (
    BlockFailedCredentials,
    FailedCredentials,
    Message,
    Scope,
    address_key,
    credential_key,
)


def test_a_key_is_blocked_after_its_failures_until_its_window_ends() -> None:
    book = FailedCredentials(max_failures=3, window_sec=60.0)
    keys = ("address:10.0.0.1", "key:abc")
    assert book.quiet
    assert [book.fail(keys, now=float(n)) for n in range(4)] == ["first", None, "blocked", None]
    assert book.retry_after(keys, now=10.0) == 50  # the rest of the window, rounded up
    assert book.retry_after(("address:10.0.0.1",), now=59.5) == 1
    assert book.retry_after(("address:10.0.0.2",), now=10.0) is None  # another address is not the blocked one
    assert book.retry_after(keys, now=60.0) is None  # the window ended: forgotten
    status = book.status(now=60.0)
    assert (status.failures_total, status.refused_total, status.logged_total, status.unlogged_total) == (4, 2, 2, 2)
    assert (status.keys, status.blocked_keys) == (0, 0)


def test_memory_is_bounded_by_forgetting_the_oldest_windows() -> None:
    book = FailedCredentials(max_failures=1, window_sec=60.0, max_keys=2)
    for n in range(5):
        book.fail((f"address:{n}",), now=0.0)
    assert book.status(now=1.0).keys == 2
    assert book.retry_after(("address:0",), now=1.0) is None
    assert book.retry_after(("address:4",), now=1.0) == 59


def test_keys_never_carry_the_credential() -> None:
    assert credential_key("ab" * 32) == "key:abababababab"
    assert address_key("10.0.0.1") == "address:10.0.0.1"
    assert address_key(None) is None


@pytest.mark.parametrize(("max_failures", "window"), [(0, 1.0), (1, 0.0)])
def test_a_limit_must_allow_something(max_failures: int, window: float) -> None:
    with pytest.raises(ValueError, match="failed-credential"):
        FailedCredentials(max_failures=max_failures, window_sec=window)


def test_the_middleware_answers_a_blocked_key_first_and_lets_a_trusted_credential_through() -> None:
    book = FailedCredentials(max_failures=1, window_sec=30.0)
    reached: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    refused: list[str] = []
    middleware = BlockFailedCredentials(
        app,
        book=book,
        keys_of=lambda scope: ("address:" + scope["client"][0],),
        trusted=lambda scope: scope["path"] == "/trusted",
        now=lambda: 10.0,
        render=lambda _, wait: {"error": "too_many_requests", "wait": wait},
        on_refused=lambda scope: refused.append(scope["path"]),
    )

    def call(path: str) -> list[Message]:
        sent: list[Message] = []

        async def send(message: Message) -> None:
            sent.append(message)

        async def receive() -> Message:
            raise AssertionError("a refused request's body is never read")

        scope = {"type": "http", "path": path, "client": ("10.0.0.9", 1234), "headers": []}
        asyncio.run(middleware(scope, receive, send))
        return sent

    assert call("/a")[0]["status"] == 200  # nothing on record: passes without a lookup
    book.fail(("address:10.0.0.9",), now=0.0)
    answer = call("/b")
    assert answer[0]["status"] == 429
    assert dict(answer[0]["headers"])[b"retry-after"] == b"20"
    assert dict(answer[0]["headers"])[b"connection"] == b"close"
    assert json.loads(answer[1]["body"]) == {"error": "too_many_requests", "wait": 20}
    assert call("/trusted")[0]["status"] == 200  # a credential held as valid is never refused for its address
    assert (reached, refused) == (["/a", "/trusted"], ["/b"])
