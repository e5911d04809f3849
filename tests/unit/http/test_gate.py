"""The token gate: who is let in, and that a refused request's body is never read."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from heteroflow.http.errors import error_response
from heteroflow.http.gate import NO_TOKEN_CONFIGURED, TOKEN_REQUIRED, TokenGate, challenge_headers, gate_middleware


@pytest.mark.parametrize(
    ("gate", "path", "authorization", "refusal"),
    [
        (TokenGate("tok"), "/x", "Bearer tok", None),
        (TokenGate("tok"), "/x", "Bearer other", TOKEN_REQUIRED),
        (TokenGate("tok"), "/x", None, TOKEN_REQUIRED),
        (TokenGate("tok"), "/x", "Basic dG9r", TOKEN_REQUIRED),
        (TokenGate("tok", open_paths=frozenset({"/health"})), "/health", None, None),
        (TokenGate(None), "/x", None, NO_TOKEN_CONFIGURED),
        (TokenGate(None), "/x", "Bearer anything", NO_TOKEN_CONFIGURED),
        (TokenGate(None, allow_no_token=True), "/x", None, None),
    ],
)
def test_refusal(gate: TokenGate, path: str, authorization: str | None, refusal: str | None) -> None:
    assert gate.refusal(path, authorization) == refusal


def test_challenge_only_on_401() -> None:
    assert challenge_headers(401) == {"WWW-Authenticate": "Bearer"}
    assert challenge_headers(403) is None
    assert error_response(401, "unauthorized", "no").headers["www-authenticate"] == "Bearer"
    assert "www-authenticate" not in error_response(400, "invalid_body", "no").headers


def _app(reads: list[bytes]) -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        reads.append(await request.body())
        return JSONResponse({"ok": True})

    gate = TokenGate("tok", open_paths=frozenset({"/health"}))
    app.middleware("http")(gate_middleware(gate, lambda detail: error_response(401, "unauthorized", detail)))
    return app


async def _post(app: FastAPI, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.post("/echo", content=b'{"a": 1}', headers=headers)


def test_refused_request_never_reaches_the_route() -> None:
    reads: list[bytes] = []
    answer = asyncio.run(_post(_app(reads), {"Authorization": "Bearer wrong"}))
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert answer.json() == {"error": "unauthorized", "detail": TOKEN_REQUIRED}
    assert reads == []


def test_admitted_request_reaches_the_route() -> None:
    reads: list[bytes] = []
    answer = asyncio.run(_post(_app(reads), {"Authorization": "Bearer tok"}))
    assert answer.status_code == 200
    assert reads == [b'{"a": 1}']
