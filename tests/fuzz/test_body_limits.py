"""Hostile bodies on every route of every service that takes a JSON body: refused with a 4xx and a sentence.

A body over the service's limit (1 MiB everywhere), sent with its length declared, or streamed without one;
JSON nested 10,000 levels deep (past CPython's recursion limit); a Content-Length that is not a number;
bytes declared JSON that are not text. The service answers 400 or 413 with a message, never a 500, and keeps
serving: the next request is answered as usual.

Requests are driven through ASGI messages directly, so that a body can arrive in chunks and headers can carry
bytes no HTTP client would send.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz.services import BUILDERS, Service, operations_of

LIMIT = 1 << 20
"""The body limit of every service (the Coordinator's ``max_body_bytes`` default included)."""

DEPTH = 10_000

Raw = tuple[int, dict[str, str], bytes]


async def call(
    service: Service,
    path: str,
    chunks: list[bytes],
    *,
    headers: dict[bytes, bytes] | None = None,
    method: str = "POST",
) -> Raw:
    """One request as ASGI messages: the body in ``chunks`` (more to come between them); status, headers, body."""
    sent = {k.lower().encode(): v.encode() for k, v in service.headers.items()}
    sent.setdefault(b"content-type", b"application/json")
    sent.update(headers or {})
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": list(sent.items()),
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "state": {},
    }
    pending = list(chunks) or [b""]
    answer: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        await asyncio.Event().wait()  # the client stays connected until the answer is complete
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await asyncio.wait_for(service.app(scope, receive, send), timeout=30)
    return answer["status"], answer["headers"], answer["body"]


def message_of(body: bytes) -> str:
    """The sentence of an error answer, whatever the service's error shape."""
    document = json.loads(body)
    error = document.get("error")
    if isinstance(error, dict):
        return str(error.get("message", ""))
    detail = document.get("detail")
    if isinstance(detail, str) and detail:
        return detail
    if isinstance(detail, list) and detail:
        return str(detail[0].get("msg", ""))
    return str(error or "")


def assert_refused(answer: Raw, *, statuses: tuple[int, ...], mentions: str) -> None:
    status, headers, body = answer
    assert status in statuses, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), headers
    sentence = message_of(body)
    assert re.search(mentions, sentence, re.IGNORECASE), sentence


def concrete(template: str, values: dict[str, str] | None = None) -> str:
    return re.sub(r"\{([^}]+)\}", lambda found: (values or {}).get(found.group(1), "x"), template)


def padded(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes."""
    overhead = len(b'{"pad": ""}')
    return b'{"pad": "' + b"a" * (size - overhead) + b'"}'


def deep_array(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def deep_object(depth: int) -> bytes:
    return b'{"a": ' * depth + b"{}" + b"}" * depth


async def still_serving(service: Service) -> None:
    status, _, body = await call(service, "/health", [], method="GET")
    assert status == 200, body


def run(name: str, tmp_path: Path, scenario: Callable[[Service], Awaitable[None]]) -> None:
    async def main() -> None:
        async with BUILDERS[name](tmp_path) as service:
            await scenario(service)
            await still_serving(service)

    asyncio.run(main())


ROUTES = [
    pytest.param(name, template, id=f"{name}-{template}")
    for name, templates in {
        "platform": (
            "/api/v1/nodes/register",
            "/api/v1/nodes/{node_id}/heartbeat",
            "/api/v1/nodes/{node_id}/release",
            "/api/v1/alerts/{alert_id}/resolve",
            "/api/v1/alerts/{alert_id}/acknowledge",
        ),
        "controller": (
            "/controller/node_manager/register",
            "/controller/node_manager/heartbeat",
            "/controller/report_software_fault",
            "/controller/report_hardware_fault",
        ),
        "node_manager": (
            "/node-manager/fault-tolerance/status",
            "/node-manager/fault-tolerance/guard",
            "/node-manager/fault-tolerance/apply",
            "/node-manager/fault-tolerance/finalize",
            "/node-manager/fault-tolerance/probe",
            "/node-manager/fault-tolerance/nudge",
            "/node-manager/engines/stop",
            "/node-manager/engines/start",
            "/node-manager/engines/restart",
        ),
        "coordinator": (
            "/coordinator/manage/del",
            "/coordinator/manage/add",
            "/coordinator/manage/set",
            "/v1/completions",
            "/v1/chat/completions",
        ),
        "engine_sim": ("/v1/completions", "/v1/chat/completions", "/v1/fault_tolerance/apply", "/sim/faults"),
    }.items()
    for template in templates
]


BODILESS_POSTS: dict[str, set[str]] = {
    "platform": {"/api/v1/auth/session"},
    "controller": {"/controller/fault_tolerance/instances/{instance_id}/restore"},
}
"""POST routes that read no body (sign-in: the token comes in the Authorization header; a restore: the instance is
named by the path)."""


@pytest.mark.parametrize("name", list(BUILDERS))
def test_the_routes_below_are_every_post_route_of_the_service(name: str, tmp_path: Path) -> None:
    async def scenario(service: Service) -> None:
        posts = {path for method, path in operations_of(service.app) if method == "POST"}
        listed = {template for service_name, template in (p.values for p in ROUTES) if service_name == name}
        bodiless = BODILESS_POSTS.get(name, set())
        assert listed == posts - bodiless
        assert bodiless <= posts
        paths = service.app.openapi()["paths"]
        assert not [path for path in bodiless if "requestBody" in paths[path]["post"]]
        assert set(service.json_routes) == posts - bodiless

    run(name, tmp_path, scenario)


@pytest.mark.parametrize(("name", "template"), ROUTES)
def test_hostile_bodies_are_refused_with_a_4xx_and_a_reason(name: str, template: str, tmp_path: Path) -> None:
    async def scenario(service: Service) -> None:
        path = concrete(template, service.path_values)
        # over the limit, its length declared (refused before the body is read, but by the Coordinator's and the
        # controller's management routes, which read on and refuse with their 400)
        declared = await call(service, path, [padded(LIMIT + 1)])
        assert_refused(declared, statuses=(400, 413), mentions=r"larger than \d+ bytes")
        # over the limit, no length declared: streamed in 64 KiB pieces
        body = padded(LIMIT + 64 * 1024)
        pieces = [body[i : i + 65_536] for i in range(0, len(body), 65_536)]
        streamed = await call(service, path, pieces, headers={b"transfer-encoding": b"chunked"})
        assert_refused(streamed, statuses=(400, 413), mentions=r"larger than \d+ bytes")
        # at the limit exactly: read and judged on its content, never refused for its size
        at_limit = await call(service, path, [padded(LIMIT)])
        assert at_limit[0] < 500, at_limit
        assert not re.search(r"larger than", at_limit[2].decode(errors="replace")), at_limit[2][:300]
        # nested 10,000 deep, past CPython's recursion limit: a 400, not a RecursionError
        for deep in (deep_array(DEPTH), deep_object(DEPTH)):
            answer = await call(service, path, [deep])
            assert_refused(answer, statuses=(400,), mentions=r"nested|deep|recursion|not JSON|invalid")
        # declared JSON, not text: a 4xx with a reason in the service's own error shape
        undecodable = await call(service, path, [b'{"a": "\xff\xfe\xfd"}'])
        assert_refused(undecodable, statuses=(400, 422), mentions=r"\w")
        # a Content-Length that is not a length ('²' passes str.isdigit(), int() refuses it and 5000 digits):
        # the body {} may well be valid (engines/stop), only a server error is wrong here
        for length in (b"\xb2", b"9" * 5000, b"-1", b"1e3"):
            answer = await call(service, path, [b"{}"], headers={b"content-length": length})
            assert answer[0] < 500, (length[:20], answer)

    run(name, tmp_path, scenario)
