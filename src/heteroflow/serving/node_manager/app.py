"""The NodeManager's HTTP API: thin handlers over :class:`~.daemon.NodeManager`.

- Every ``/node-manager/…`` route needs ``Authorization: Bearer <cluster token>`` (401 otherwise), checked
  first; ``/health`` and ``/metrics`` stay open (as the engines' do).
- The FT routes (status, apply, guard, finalize, and probe/nudge) answer 404 while
  ``enable_dp_scale_down_proxy`` is off, whatever the body.
- Bodies are parsed here, so a malformed body is a 400 with a message, never a 422 or a 500.
- Errors map to HTTP statuses in one place (:data:`_STATUS_OF`): stale or conflicting rounds → 502 (the
  RFC's status for "another transaction owns this NodeManager"), a missing or expired guard or a second
  apply → 409, a bad command → 400. An apply the engines did not all accept (HTTP 202) answers 502 with
  each engine's result.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from heteroflow.platform.auth import bearer_matches
from heteroflow.serving.node_manager import service
from heteroflow.serving.node_manager.daemon import NodeManager, ProxyDisabledError, UnknownEndpointError
from heteroflow.serving.node_manager.metrics import CONTENT_TYPE, NodeManagerMetrics
from heteroflow.serving.wire import (
    NM_ENGINES_RESTART_PATH,
    NM_ENGINES_START_PATH,
    NM_ENGINES_STOP_PATH,
    NM_FT_APPLY_PATH,
    NM_FT_FINALIZE_PATH,
    NM_FT_GUARD_PATH,
    NM_FT_NUDGE_PATH,
    NM_FT_PROBE_PATH,
    NM_FT_STATUS_PATH,
    NM_STATUS_PATH,
    EnginesStartRequest,
    EnginesStopRequest,
    ErrorBody,
    FinalizeRequest,
    FtStatusRequest,
    GuardRequest,
    NmApplyRequest,
    ProbeRequest,
)

_M = TypeVar("_M", bound=BaseModel)

_STATUS_OF: dict[type[Exception], int] = {
    UnknownEndpointError: 400,
    service.InvalidCommandError: 400,
    service.NotGuardedError: 409,
    service.AlreadyAppliedError: 409,
    service.GuardConflictError: 502,
    service.StaleRequestError: 502,
}


class _BadBody(Exception):
    pass


def _error(status: int, code: str, detail: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(ErrorBody(error=code, detail=detail).model_dump(), status_code=status, headers=headers)


async def _body(request: Request, model: type[_M], *, empty_ok: bool = False) -> _M:
    raw_bytes = await request.body()
    if not raw_bytes.strip() and empty_ok:
        return model.model_validate({})
    try:
        raw = json.loads(raw_bytes)
    except ValueError as exc:
        raise _BadBody(f"the body is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise _BadBody("the body must be a JSON object")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "body"
        raise _BadBody(f"{where}: {err['msg']}") from exc


def create_app(nm: NodeManager, *, cluster_token: str | None, allow_no_token: bool = False) -> FastAPI:
    app = FastAPI(title="HeteroFlow NodeManager", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def _authenticate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path.startswith("/node-manager/"):
            if cluster_token:
                if not bearer_matches(request.headers.get("authorization"), cluster_token):
                    return _error(401, "unauthorized", "a valid cluster token is required (Authorization: Bearer)")
            elif not allow_no_token:
                return _error(401, "unauthorized", "no cluster token is configured; internal routes are closed")
        return await call_next(request)

    @app.exception_handler(_BadBody)
    async def _bad_body(_: Request, exc: _BadBody) -> JSONResponse:
        return _error(400, "invalid_body", str(exc))

    @app.exception_handler(ProxyDisabledError)
    async def _proxy_off(_: Request, exc: ProxyDisabledError) -> JSONResponse:
        return _error(404, "not_found", str(exc))

    @app.exception_handler(service.FtServiceError)
    async def _ft_error(_: Request, exc: service.FtServiceError) -> JSONResponse:
        status = next((code for kind, code in _STATUS_OF.items() if isinstance(exc, kind)), 500)
        return _error(status, exc.code, str(exc))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    metrics = NodeManagerMetrics(nm.status)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get(NM_STATUS_PATH)
    async def status() -> Response:
        return JSONResponse(_jsonable(nm.status()))

    @app.post(NM_FT_STATUS_PATH)
    async def ft_status(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.ft_status(await _body(request, FtStatusRequest))
        return JSONResponse(answer.model_dump(mode="json", exclude_none=True))

    @app.post(NM_FT_GUARD_PATH)
    async def ft_guard(request: Request) -> Response:
        nm.require_proxy()
        return JSONResponse(nm.ft_guard(await _body(request, GuardRequest)).model_dump(mode="json"))

    @app.post(NM_FT_APPLY_PATH)
    async def ft_apply(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.ft_apply(await _body(request, NmApplyRequest))
        return JSONResponse(answer.model_dump(mode="json"), status_code=202 if answer.accepted else 502)

    @app.post(NM_FT_FINALIZE_PATH)
    async def ft_finalize(request: Request) -> Response:
        nm.require_proxy()
        return JSONResponse((await nm.ft_finalize(await _body(request, FinalizeRequest))).model_dump(mode="json"))

    @app.post(NM_FT_PROBE_PATH)
    async def ft_probe(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.probe(await _body(request, ProbeRequest))
        return JSONResponse(answer.model_dump(mode="json"), status_code=200 if answer.ok else 502)

    @app.post(NM_FT_NUDGE_PATH)
    async def ft_nudge(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.probe(await _body(request, ProbeRequest), nudge=True)
        return JSONResponse(answer.model_dump(mode="json"))

    @app.post(NM_ENGINES_STOP_PATH)
    async def engines_stop(request: Request) -> Response:
        body = await _body(request, EnginesStopRequest, empty_ok=True)
        return JSONResponse((await nm.stop_engines(body.endpoint_ids)).model_dump(mode="json"))

    @app.post(NM_ENGINES_START_PATH)
    async def engines_start(request: Request) -> Response:
        body = await _body(request, EnginesStartRequest, empty_ok=True)
        return JSONResponse((await nm.start_engines(body)).model_dump(mode="json"))

    @app.post(NM_ENGINES_RESTART_PATH)
    async def engines_restart(request: Request) -> Response:
        body = await _body(request, EnginesStartRequest, empty_ok=True)
        return JSONResponse((await nm.start_engines(body, restart=True)).model_dump(mode="json"))

    return app


def _jsonable(value: object) -> object:
    """A frozen status dataclass (nested dataclasses, tuples, pydantic models) as JSON-ready data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if hasattr(value, "__dataclass_fields__"):
        return {name: _jsonable(getattr(value, name)) for name in value.__dataclass_fields__}
    if isinstance(value, tuple | list):
        return [_jsonable(item) for item in value]
    return value
