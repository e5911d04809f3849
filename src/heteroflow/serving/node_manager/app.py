"""The NodeManager's HTTP API: thin handlers over :class:`~.daemon.NodeManager`.

- Every route but the ``/health`` probe needs ``Authorization: Bearer <cluster token>`` (401 otherwise),
  checked first. ``/metrics`` needs it too, as the controller's and the Coordinator's do: its series name the
  pod, its endpoints and whether a round holds the guard.
- The FT routes (status, apply, guard, finalize, and probe/nudge) answer 404 while
  ``enable_dp_scale_down_proxy`` is off, whatever the body.
- Bodies are parsed here, so a malformed body is a 400 with a message, never a 422 or a 500; a body over
  1 MiB is a 413 and JSON nested deeper than 32 levels a 400 (:mod:`heteroflow.core.request_body`), both
  answered before the route runs.
- Errors map to HTTP statuses in one place (:data:`_STATUS_OF`): stale or conflicting rounds → 502 (the
  RFC's status for "another transaction owns this NodeManager"), a missing or expired guard or a second
  apply → 409, a bad command → 400. An apply the engines did not all accept (HTTP 202) answers 502 with
  each engine's result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from heteroflow.core.openapi import json_request_body
from heteroflow.core.request_body import BodyError, BodyLimit, parse_json
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
    EnginesResponse,
    EnginesStartRequest,
    EnginesStopRequest,
    ErrorBody,
    FinalizeRequest,
    FinalizeResponse,
    FtStatusRequest,
    FtStatusResponse,
    GuardRequest,
    GuardResponse,
    NmApplyRequest,
    NmApplyResponse,
    ProbeRequest,
    ProbeResponse,
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


_ERRORS: dict[int, str] = {
    400: "A malformed body, JSON nested too deeply, an unknown endpoint id or a bad command.",
    401: "No valid cluster token (unauthorized).",
    404: "The FT routes are off: enable_dp_scale_down_proxy is false, or the controller has not registered us.",
    409: "No guard, an expired guard, or a second apply in the round.",
    413: "The body is larger than 1 MiB.",
    502: "Another round owns this NodeManager, or the round is stale.",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of a guarded route (401, 413 and ``codes``), each an :class:`ErrorBody`."""
    return {code: {"model": ErrorBody, "description": _ERRORS[code]} for code in sorted({401, 413, *codes})}


def _ft_route(model: type[BaseModel], answer: object, *, codes: tuple[int, ...] = (400, 404, 409, 502)) -> Any:
    """``responses`` and ``openapi_extra`` of an FT route whose body is ``model`` and whose 200 is ``answer``."""
    return {"responses": {200: {"model": answer}, **_errors(*codes)}, "openapi_extra": json_request_body(model)}


class _BadBody(Exception):
    pass


def _error(status: int, code: str, detail: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(ErrorBody(error=code, detail=detail).model_dump(), status_code=status, headers=headers)


async def _body(request: Request, model: type[_M], *, empty_ok: bool = False) -> _M:
    raw_bytes = await request.body()
    if not raw_bytes.strip() and empty_ok:
        return model.model_validate({})
    raw = parse_json(raw_bytes)  # BodyError: answered by its own handler (400 or 413)
    if not isinstance(raw, dict):
        raise _BadBody("the body must be a JSON object")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "body"
        raise _BadBody(f"{where}: {err['msg']}") from exc


_OPEN_PATHS = frozenset({"/health"})
"""The liveness probe, which kubelet calls without a token; it says nothing but "the process serves HTTP"."""


def create_app(nm: NodeManager, *, cluster_token: str | None, allow_no_token: bool = False) -> FastAPI:
    app = FastAPI(
        title="HeteroFlow NodeManager", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False
    )
    # added before the token check, so that the token check runs first (the last middleware added is outermost)
    app.add_middleware(BodyLimit, render=_refused_body)

    @app.middleware("http")
    async def _authenticate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path not in _OPEN_PATHS:
            if cluster_token:
                if not bearer_matches(request.headers.get("authorization"), cluster_token):
                    return _error(401, "unauthorized", "a valid cluster token is required (Authorization: Bearer)")
            elif not allow_no_token:
                return _error(401, "unauthorized", "no cluster token is configured; internal routes are closed")
        return await call_next(request)

    @app.exception_handler(_BadBody)
    async def _bad_body(_: Request, exc: _BadBody) -> JSONResponse:
        return _error(400, "invalid_body", str(exc))

    @app.exception_handler(BodyError)
    async def _body_error(_: Request, exc: BodyError) -> JSONResponse:
        return _error(exc.status, exc.code, str(exc))

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

    @app.get("/metrics", response_class=Response, responses=_errors())
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get(NM_STATUS_PATH, responses=_errors())
    async def status() -> Response:
        return JSONResponse(_jsonable(nm.status()))

    @app.post(NM_FT_STATUS_PATH, **_ft_route(FtStatusRequest, FtStatusResponse, codes=(400, 404)))
    async def ft_status(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.ft_status(await _body(request, FtStatusRequest))
        return JSONResponse(answer.model_dump(mode="json", exclude_none=True))

    @app.post(NM_FT_GUARD_PATH, **_ft_route(GuardRequest, GuardResponse))
    async def ft_guard(request: Request) -> Response:
        nm.require_proxy()
        return JSONResponse(nm.ft_guard(await _body(request, GuardRequest)).model_dump(mode="json"))

    @app.post(
        NM_FT_APPLY_PATH,
        status_code=202,
        responses={
            202: {"model": NmApplyResponse, "description": "Every engine accepted the instruction."},
            **_errors(400, 404, 409),
            502: {
                "model": NmApplyResponse | ErrorBody,
                "description": "An engine did not accept (each engine's result), or another round owns us.",
            },
        },
        openapi_extra=json_request_body(NmApplyRequest),
    )
    async def ft_apply(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.ft_apply(await _body(request, NmApplyRequest))
        return JSONResponse(answer.model_dump(mode="json"), status_code=202 if answer.accepted else 502)

    @app.post(NM_FT_FINALIZE_PATH, **_ft_route(FinalizeRequest, FinalizeResponse))
    async def ft_finalize(request: Request) -> Response:
        nm.require_proxy()
        return JSONResponse((await nm.ft_finalize(await _body(request, FinalizeRequest))).model_dump(mode="json"))

    @app.post(
        NM_FT_PROBE_PATH,
        responses={
            200: {"model": ProbeResponse},
            **_errors(400, 404, 409),
            502: {
                "model": ProbeResponse | ErrorBody,
                "description": "A probe failed (each endpoint's result), or another round owns us.",
            },
        },
        openapi_extra=json_request_body(ProbeRequest),
    )
    async def ft_probe(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.probe(await _body(request, ProbeRequest))
        return JSONResponse(answer.model_dump(mode="json"), status_code=200 if answer.ok else 502)

    @app.post(NM_FT_NUDGE_PATH, **_ft_route(ProbeRequest, ProbeResponse))
    async def ft_nudge(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.probe(await _body(request, ProbeRequest), nudge=True)
        return JSONResponse(answer.model_dump(mode="json"))

    @app.post(
        NM_ENGINES_STOP_PATH,
        responses={200: {"model": EnginesResponse}, **_errors(400)},
        openapi_extra=json_request_body(EnginesStopRequest, required=False),
    )
    async def engines_stop(request: Request) -> Response:
        body = await _body(request, EnginesStopRequest, empty_ok=True)
        return JSONResponse((await nm.stop_engines(body.endpoint_ids)).model_dump(mode="json"))

    @app.post(
        NM_ENGINES_START_PATH,
        responses={200: {"model": EnginesResponse}, **_errors(400)},
        openapi_extra=json_request_body(EnginesStartRequest, required=False),
    )
    async def engines_start(request: Request) -> Response:
        body = await _body(request, EnginesStartRequest, empty_ok=True)
        return JSONResponse((await nm.start_engines(body)).model_dump(mode="json"))

    @app.post(
        NM_ENGINES_RESTART_PATH,
        responses={200: {"model": EnginesResponse}, **_errors(400)},
        openapi_extra=json_request_body(EnginesStartRequest, required=False),
    )
    async def engines_restart(request: Request) -> Response:
        body = await _body(request, EnginesStartRequest, empty_ok=True)
        return JSONResponse((await nm.start_engines(body, restart=True)).model_dump(mode="json"))

    return app


def _refused_body(_: str, exc: BodyError) -> dict[str, object]:
    return ErrorBody(error=exc.code, detail=str(exc)).model_dump()


def _jsonable(value: object) -> object:
    """A frozen status dataclass (nested dataclasses, tuples, pydantic models) as JSON-ready data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if hasattr(value, "__dataclass_fields__"):
        return {name: _jsonable(getattr(value, name)) for name in value.__dataclass_fields__}
    if isinstance(value, tuple | list):
        return [_jsonable(item) for item in value]
    return value
