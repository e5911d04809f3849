"""The NodeManager's routers: thin handlers over :class:`~.daemon.NodeManager` (assembled in :mod:`.assembly`).

- :func:`node_router` — ``/metrics`` and the node status.
- :func:`ft_router` — the FT routes (status, guard, apply, finalize, probe, nudge): 404 while the proxy is off.
- :func:`engines_router` — the engine lifecycle routes (stop, start, restart).
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from heteroflow.contracts.serving import (
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
from heteroflow.core.openapi import json_request_body
from heteroflow.http.bodies import read_model
from heteroflow.serving.node_manager.daemon import NodeManager
from heteroflow.serving.node_manager.metrics import CONTENT_TYPE, NodeManagerMetrics

_M = TypeVar("_M", bound=BaseModel)


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


async def _body(request: Request, model: type[_M], *, empty_ok: bool = False) -> _M:
    # a BodyError (too large, too deep, not JSON) is answered by its own handler (400 or 413)
    return await read_model(request, model, empty_ok=empty_ok)


def node_router(nm: NodeManager) -> APIRouter:
    """``/metrics`` and the node status."""
    router = APIRouter()
    metrics = NodeManagerMetrics(nm.status)

    @router.get("/metrics", response_class=Response, responses=_errors())
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @router.get(NM_STATUS_PATH, responses=_errors())
    async def status() -> Response:
        return JSONResponse(_jsonable(nm.status()))

    return router


def ft_router(nm: NodeManager) -> APIRouter:
    """The FT routes; each answers 404 (:class:`~.daemon.ProxyDisabledError`) while the proxy is off."""
    router = APIRouter()

    @router.post(NM_FT_STATUS_PATH, **_ft_route(FtStatusRequest, FtStatusResponse, codes=(400, 404)))
    async def ft_status(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.ft_status(await _body(request, FtStatusRequest))
        return JSONResponse(answer.model_dump(mode="json", exclude_none=True))

    @router.post(NM_FT_GUARD_PATH, **_ft_route(GuardRequest, GuardResponse))
    async def ft_guard(request: Request) -> Response:
        nm.require_proxy()
        return JSONResponse(nm.ft_guard(await _body(request, GuardRequest)).model_dump(mode="json"))

    @router.post(
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

    @router.post(NM_FT_FINALIZE_PATH, **_ft_route(FinalizeRequest, FinalizeResponse))
    async def ft_finalize(request: Request) -> Response:
        nm.require_proxy()
        return JSONResponse((await nm.ft_finalize(await _body(request, FinalizeRequest))).model_dump(mode="json"))

    @router.post(
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

    @router.post(NM_FT_NUDGE_PATH, **_ft_route(ProbeRequest, ProbeResponse))
    async def ft_nudge(request: Request) -> Response:
        nm.require_proxy()
        answer = await nm.probe(await _body(request, ProbeRequest), nudge=True)
        return JSONResponse(answer.model_dump(mode="json"))

    return router


def engines_router(nm: NodeManager) -> APIRouter:
    """Stop, start and restart the pod's engines."""
    router = APIRouter()

    @router.post(
        NM_ENGINES_STOP_PATH,
        responses={200: {"model": EnginesResponse}, **_errors(400)},
        openapi_extra=json_request_body(EnginesStopRequest, required=False),
    )
    async def engines_stop(request: Request) -> Response:
        body = await _body(request, EnginesStopRequest, empty_ok=True)
        return JSONResponse((await nm.stop_engines(body.endpoint_ids)).model_dump(mode="json"))

    @router.post(
        NM_ENGINES_START_PATH,
        responses={200: {"model": EnginesResponse}, **_errors(400)},
        openapi_extra=json_request_body(EnginesStartRequest, required=False),
    )
    async def engines_start(request: Request) -> Response:
        body = await _body(request, EnginesStartRequest, empty_ok=True)
        return JSONResponse((await nm.start_engines(body)).model_dump(mode="json"))

    @router.post(
        NM_ENGINES_RESTART_PATH,
        responses={200: {"model": EnginesResponse}, **_errors(400)},
        openapi_extra=json_request_body(EnginesStartRequest, required=False),
    )
    async def engines_restart(request: Request) -> Response:
        body = await _body(request, EnginesStartRequest, empty_ok=True)
        return JSONResponse((await nm.start_engines(body, restart=True)).model_dump(mode="json"))

    return router


def _jsonable(value: object) -> object:
    """A frozen status dataclass (nested dataclasses, tuples, pydantic models) as JSON-ready data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if hasattr(value, "__dataclass_fields__"):
        return {name: _jsonable(getattr(value, name)) for name in value.__dataclass_fields__}
    if isinstance(value, tuple | list):
        return [_jsonable(item) for item in value]
    return value
