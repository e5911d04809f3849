"""Bounded JSON request bodies: the pure checks and the ASGI middleware, without a web framework."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.core.request_body import (
    MAX_JSON_DEPTH,
    BodyError,
    BodyLimit,
    BodyTooLargeError,
    InvalidJsonBodyError,
    check_body,
    nesting_depth,
    parse_json,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=30,
)


def depth_of(value: object) -> int:
    """The definition, recursively: 0 for a scalar, one more than the deepest child for a container."""
    if isinstance(value, dict):
        return 1 + max((depth_of(child) for child in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(child) for child in value), default=0)
    return 0


@given(json_values)
def test_nesting_depth_is_the_recursive_definition_without_recursing(value: object) -> None:
    assert nesting_depth(value, limit=1000) == depth_of(value)
    assert nesting_depth(value, limit=1) == min(depth_of(value), 2)


@given(json_values)  # JSON values: NaN and the infinities are not JSON (refused, see test_text_and_files.py)
def test_a_valid_body_parses_back_to_its_value(value: object) -> None:
    raw = json.dumps(value).encode()
    if depth_of(value) <= MAX_JSON_DEPTH:
        assert parse_json(raw) == value
        check_body(raw, declared_json=True)


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        (b"[" * 10_000 + b"]" * 10_000, InvalidJsonBodyError, "nested deeper than 32"),
        (b"[" * 33 + b"]" * 33, InvalidJsonBodyError, "nested deeper than 32"),
        (b'{"a": ' * 33 + b"1" + b"}" * 33, InvalidJsonBodyError, "nested deeper than 32"),
        (b"{", InvalidJsonBodyError, "not JSON"),
        (b'"\xff"', InvalidJsonBodyError, "not JSON"),
        (b"1" * 5000, InvalidJsonBodyError, "not JSON"),  # past int()'s digit limit
        (b" " * (1 << 20) + b"{}", BodyTooLargeError, "larger than 1048576 bytes"),
    ],
)
def test_parse_json_refuses_with_a_typed_error(raw: bytes, error: type[BodyError], fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        parse_json(raw)


def test_parse_json_accepts_32_levels_and_utf16() -> None:
    assert nesting_depth(parse_json(b"[" * 32 + b"]" * 32)) == 32
    assert parse_json('{"a": 1}'.encode("utf-16")) == {"a": 1}


def test_check_body_lets_non_json_through_but_not_what_cannot_be_decoded_when_declared_json() -> None:
    check_body(b"{not json")  # the route answers malformed JSON in its own words
    check_body(b"\xff\xfe\xfd")  # not declared JSON: not ours to judge
    check_body('{"a": 1}'.encode("utf-16"), declared_json=True)
    with pytest.raises(InvalidJsonBodyError, match="not UTF-8"):
        check_body(b'{"a": "\xff"}', declared_json=True)
    with pytest.raises(InvalidJsonBodyError, match="nested"):
        check_body(b"[" * 10_000 + b"]" * 10_000)


@pytest.mark.parametrize(
    ("raw", "plain"),
    [
        (b'{"gpu_stats": [{"index": 0, "uuid": "GPU-1", "power_w": 186.11}]}', True),
        (b'{"a": "\\u0000"}', False),  # an escape: the decoded string may hold anything
        (b'{"a": "\\u202e"}', False),
        ('{"a": "é"}'.encode(), False),  # not ASCII: a bidi control or a C1 character would be too
        ('{"a": "x"}'.encode("utf-16"), True),  # judged as the UTF-8 it is read as
        (b'{"a": "\x7f"}', False),
        (b'{"a":\n 1}', False),  # whitespace outside strings too: plain means printable only
        (b"\xff\xfe\xfd", False),
    ],
)
def test_check_body_says_whether_the_body_is_plain_text(raw: bytes, plain: bool) -> None:
    assert check_body(raw, strict_text=False) is plain


@pytest.mark.parametrize("byte", range(256))
def test_plain_text_is_printable_ascii_without_a_backslash_byte_by_byte(byte: int) -> None:
    raw = b'{"a": "x' + bytes([byte]) + b'y"}'
    expected = 0x20 <= byte <= 0x7E and byte != 0x5C
    if byte >= 0x80 or byte == 0x5C or byte == 0x22:  # not UTF-8 alone, an escape, or a quote that ends the string
        raw = b"x" + bytes([byte]) + b"y"
    assert check_body(raw, strict_text=False) is expected


# == the middleware =========================================================================================
class Echo:
    """An application that answers 200 with the body it read (and counts its calls)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def render(path: str, exc: BodyError) -> dict[str, object]:
    return {"path": path, "code": exc.code, "detail": str(exc)}


def drive(
    app: Any, messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[int | None, bytes]:
    scope = {"type": "http", "method": "POST", "path": "/r", "headers": headers or []}
    pending = list(messages)
    answer: dict[str, Any] = {"status": None, "body": b""}

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        else:
            answer["body"] += message.get("body", b"")

    asyncio.run(app(scope, receive, send))
    return answer["status"], answer["body"]


def test_a_body_that_does_not_arrive_in_time_is_answered_408_and_an_outside_cancellation_stays_one() -> None:
    reading_started: list[asyncio.Event] = []

    async def never() -> dict[str, Any]:
        for started in reading_started:
            started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    answers: list[int] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answers.append(message["status"])

    echo = Echo()
    scope = {"type": "http", "method": "POST", "path": "/r", "headers": []}

    async def slow_sender() -> None:
        await BodyLimit(echo, render=render, read_timeout_sec=0.05)(scope, never, send)

    asyncio.run(slow_sender())
    assert answers == [408]
    assert echo.calls == 0

    async def cancelled_from_outside() -> bool:
        reading_started.append(asyncio.Event())
        reading = asyncio.create_task(BodyLimit(echo, render=render, read_timeout_sec=60)(scope, never, send))
        await reading_started[0].wait()
        reading.cancel()
        try:
            await reading
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(cancelled_from_outside()) is True
    assert answers == [408]  # nothing answered for the cancelled request


def chunks(*parts: bytes) -> list[dict[str, Any]]:
    return [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1} for i, part in enumerate(parts)]


def test_an_accepted_body_reaches_the_application_unchanged_in_one_message() -> None:
    echo = Echo()
    status, body = drive(BodyLimit(echo, render=render, max_bytes=10), chunks(b'{"a"', b": 1}"))
    assert (status, body, echo.calls) == (200, b'{"a": 1}', 1)


@pytest.mark.parametrize(
    ("messages", "headers"),
    [
        (chunks(b"x" * 11), []),  # received
        (chunks(b"x" * 6, b"x" * 6), []),  # streamed past the limit
        (chunks(b"{}"), [(b"content-length", b"11")]),  # declared
        (chunks(b"{}"), [(b"content-length", b"9" * 5000)]),  # declared, thousands of digits
    ],
)
def test_a_body_over_the_limit_is_a_413_rendered_by_the_service(
    messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]]
) -> None:
    echo = Echo()
    status, body = drive(BodyLimit(echo, render=render, max_bytes=10), messages, headers)
    assert status == 413
    assert json.loads(body) == {
        "path": "/r",
        "code": "body_too_large",
        "detail": "the request body is larger than 10 bytes",
    }
    assert echo.calls == 0


@pytest.mark.parametrize("length", [b"\xb2", b"-1", b"1e3", b""])
def test_a_content_length_that_is_no_length_is_ignored_and_the_bytes_counted(length: bytes) -> None:
    echo = Echo()
    status, body = drive(BodyLimit(echo, render=render, max_bytes=10), chunks(b"{}"), [(b"content-length", length)])
    assert (status, body) == (200, b"{}")


def test_deep_or_undecodable_json_is_a_400_before_the_application() -> None:
    echo = Echo()
    limit = BodyLimit(echo, render=render)
    status, body = drive(limit, chunks(b"[" * 10_000 + b"]" * 10_000))
    assert (status, json.loads(body)["code"]) == (400, "invalid_body")
    json_type = [(b"content-type", b"application/vnd.api+json; charset=utf-8")]
    status, body = drive(limit, chunks(b'{"a": "\xff"}'), json_type)
    assert (status, json.loads(body)["code"]) == (400, "invalid_body")
    assert echo.calls == 0


def test_a_client_gone_before_its_body_ended_reaches_no_application() -> None:
    echo = Echo()
    status, _ = drive(BodyLimit(echo, render=render), [*chunks(b"{", b"}")[:1], {"type": "http.disconnect"}])
    assert (status, echo.calls) == (None, 0)


def test_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def nothing() -> dict[str, Any]:
        raise AssertionError("the middleware must not read a lifespan scope")

    async def ignore(message: MutableMapping[str, Any]) -> None:
        return None

    asyncio.run(BodyLimit(app, render=render)({"type": "lifespan"}, nothing, ignore))
    assert seen == ["lifespan"]


def test_slow_and_prompt_bodies_read_at_once_share_one_deadline_timer() -> None:
    """Twenty senders that never finish and twenty that send at once, through one middleware: the slow ones are
    answered 408 within the deadline and one sweep period, the prompt ones reach the application, and once nothing
    is being read the loop keeps no deadline timer."""

    async def scenario() -> tuple[list[int], float, int, int, bool]:
        echo = Echo()
        limit = BodyLimit(echo, render=render, read_timeout_sec=0.2)
        statuses: list[int] = []
        gate = asyncio.Event()

        async def slow() -> dict[str, Any]:
            await gate.wait()  # never set: the body never arrives
            raise AssertionError("unreachable")

        async def prompt() -> dict[str, Any]:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        scope = {"type": "http", "method": "POST", "path": "/r", "headers": [(b"content-type", b"application/json")]}
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.gather(
            *(limit(dict(scope), slow, send) for _ in range(20)), *(limit(dict(scope), prompt, send) for _ in range(20))
        )
        took = loop.time() - started
        deadlines = limit.deadlines
        assert deadlines is not None
        # the sweep that cancelled the last slow read found nothing else watched: it set no new timer
        return statuses, took, len(deadlines), echo.calls, deadlines.armed

    statuses, took, still_watched, reached, armed = asyncio.run(scenario())
    assert sorted(statuses) == [200] * 20 + [408] * 20
    assert reached == 20
    assert 0.2 <= took < 0.2 + 0.05 + 1.0  # the deadline, one sweep period (0.05 s), slack for a loaded machine
    assert still_watched == 0
    assert not armed
