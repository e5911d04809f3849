"""The status table and reading a body into its model."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from heteroflow.http.bodies import BadBodyError, read_model
from heteroflow.http.errors import StatusMap, error_response


class _Base(Exception):
    pass


class _Child(_Base):
    pass


def test_status_map_first_matching_entry_wins() -> None:
    table = StatusMap({_Child: 409, _Base: 502})
    assert table.status_of(_Child()) == 409
    assert table.status_of(_Base()) == 502
    assert table.status_of(ValueError()) == 500
    assert StatusMap({}, default=400).status_of(ValueError()) == 400


class _Model(BaseModel):
    name: str
    count: int = 0


def _app(*, empty_ok: bool = False, as_bad_body: bool = False) -> FastAPI:
    app = FastAPI()

    @app.exception_handler(BadBodyError)
    async def bad(_: Request, exc: BadBodyError) -> JSONResponse:
        return error_response(400, "invalid_body", str(exc))

    @app.post("/m")
    async def route(request: Request) -> Response:
        body = await read_model(request, _Model, empty_ok=empty_ok, body_errors_as_bad_body=as_bad_body)
        return JSONResponse(body.model_dump())

    return app


async def _post(app: FastAPI, content: bytes) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.post("/m", content=content, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        (b"[1, 2]", "the body must be a JSON object"),
        (b'{"count": 1}', "name: Field required"),
        (b'{"name": "a", "count": "many"}', "count: Input should be a valid integer, unable to parse string as an"),
    ],
)
def test_wrong_body_names_the_problem(content: bytes, detail: str) -> None:
    answer = asyncio.run(_post(_app(), content))
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith(detail)


def test_right_body_and_empty_body() -> None:
    assert asyncio.run(_post(_app(), b'{"name": "a"}')).json() == {"name": "a", "count": 0}
    assert asyncio.run(_post(_app(empty_ok=True), b"  ")).status_code == 400  # the defaults lack a name


def test_body_error_becomes_bad_body_when_asked() -> None:
    deep = b"[" * 40 + b"]" * 40
    answer = asyncio.run(_post(_app(as_bad_body=True), deep))
    assert answer.status_code == 400
    assert answer.json()["error"] == "invalid_body"
    assert "the request body" not in answer.json()["detail"]
