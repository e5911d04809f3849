"""The NodeManager's routers: thin handlers over :class:`~.daemon.NodeManager` (assembled in :mod:`.assembly`).

- :func:`node_router` — ``/metrics`` and the node status.
- :func:`ft_router` — the FT routes (status, guard, apply, finalize, probe, nudge): 404 while the proxy is off.
- :func:`engines_router` — the engine lifecycle routes (stop, start, restart).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from heteroflow.contracts import serving as wire
from heteroflow.core.openapi import json_request_body
from heteroflow.http.bodies import read_model
from heteroflow.serving.node_manager.daemon import NodeManager
from heteroflow.serving.node_manager.metrics import CONTENT_TYPE, NodeManagerMetrics

_M = TypeVar("_M", bound=BaseModel)
_A = TypeVar("_A", bound=BaseModel)


_ERRORS: dict[int, str] = {
    400: "A malformed body, JSON nested too deeply, an unknown endpoint id or a bad command.",
    401: "No valid cluster token (unauthorized).",
    404: "The FT routes are off: enable_dp_scale_down_proxy is false, or the controller has not registered us.",
    409: "No guard, an expired guard, or a second apply in the round; an engine start in a world too small to "
    "hold every logical expert.",
    413: "The body is larger than 1 MiB.",
    502: "Another round owns this NodeManager, or the round is stale.",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of a guarded route (401, 413 and ``codes``), each an :class:`ErrorBody`."""
    return {code: {"model": wire.ErrorBody, "description": _ERRORS[code]} for code in sorted({401, 413, *codes})}


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

    @router.get(wire.NM_STATUS_PATH, responses=_errors())
    async def status() -> Response:
        return JSONResponse(_jsonable(nm.status()))

    return router


@dataclass(frozen=True, slots=True)
class _Failure:
    """How an FT route's answer reports an engine's failure: a 502 carrying the same answer (every result)."""

    failed: Callable[[Any], bool]
    """True when the answer reports a failure (an engine did not accept, a probe failed)."""
    says: str
    """The 502's description in the OpenAPI document."""


def _ft_route(
    router: APIRouter,
    nm: NodeManager,
    path: str,
    model: type[_M],
    answer: type[_A],
    handle: Callable[[_M], _A | Awaitable[_A]],
    *,
    ok: int = 200,
    ok_says: str | None = None,
    failure: _Failure | None = None,
    codes: tuple[int, ...] = (400, 404, 409, 502),
    exclude_none: bool = False,
) -> None:
    """One FT route, named ``ft_<last path segment>``: 404 while the proxy is off, the body read as ``model``,
    ``handle``'s ``answer`` as JSON with the status ``ok`` (502 when ``failure`` says the answer reports one)."""

    async def endpoint(request: Request) -> Response:
        nm.require_proxy()
        pending = handle(await _body(request, model))
        done = await pending if inspect.isawaitable(pending) else pending
        status = 502 if failure is not None and failure.failed(done) else ok
        return JSONResponse(done.model_dump(mode="json", exclude_none=exclude_none), status_code=status)

    answers: dict[int | str, dict[str, Any]] = {ok: {"model": answer, **({"description": ok_says} if ok_says else {})}}
    if failure is None:
        answers.update(_errors(*codes))
    else:
        answers.update(_errors(*(code for code in codes if code != 502)))
        answers[502] = {"model": answer | wire.ErrorBody, "description": failure.says}
    router.add_api_route(
        path,
        endpoint,
        methods=["POST"],
        name="ft_" + path.rsplit("/", 1)[-1],
        status_code=ok,
        responses=answers,
        openapi_extra=json_request_body(model),
    )


def ft_router(nm: NodeManager) -> APIRouter:
    """The FT routes; each answers 404 (:class:`~.daemon.ProxyDisabledError`) while the proxy is off."""
    router = APIRouter()
    route = partial(_ft_route, router, nm)
    route(
        wire.NM_FT_STATUS_PATH,
        wire.FtStatusRequest,
        wire.FtStatusResponse,
        lambda body: nm.ft_status(body),
        codes=(400, 404),
        exclude_none=True,
    )
    route(wire.NM_FT_GUARD_PATH, wire.GuardRequest, wire.GuardResponse, lambda body: nm.ft_guard(body))
    route(
        wire.NM_FT_APPLY_PATH,
        wire.NmApplyRequest,
        wire.NmApplyResponse,
        lambda body: nm.ft_apply(body),
        ok=202,
        ok_says="Every engine accepted the instruction.",
        failure=_Failure(
            lambda answer: not answer.accepted,
            "An engine did not accept (each engine's result), or another round owns us.",
        ),
    )
    route(wire.NM_FT_FINALIZE_PATH, wire.FinalizeRequest, wire.FinalizeResponse, lambda body: nm.ft_finalize(body))
    route(
        wire.NM_FT_PROBE_PATH,
        wire.ProbeRequest,
        wire.ProbeResponse,
        lambda body: nm.probe(body),
        failure=_Failure(
            lambda answer: not answer.ok, "A probe failed (each endpoint's result), or another round owns us."
        ),
    )
    route(wire.NM_FT_NUDGE_PATH, wire.ProbeRequest, wire.ProbeResponse, lambda body: nm.probe(body, nudge=True))
    return router


def _engines_route(
    router: APIRouter, path: str, model: type[_M], handle: Callable[[_M], Awaitable[wire.EnginesResponse]]
) -> None:
    """One engine lifecycle route, named ``engines_<last path segment>``: an optional body read as ``model``."""

    async def endpoint(request: Request) -> Response:
        body = await _body(request, model, empty_ok=True)
        return JSONResponse((await handle(body)).model_dump(mode="json"))

    router.add_api_route(
        path,
        endpoint,
        methods=["POST"],
        name="engines_" + path.rsplit("/", 1)[-1],
        responses={200: {"model": wire.EnginesResponse}, **_errors(400, 409)},
        openapi_extra=json_request_body(model, required=False),
    )


def engines_router(nm: NodeManager) -> APIRouter:
    """Stop, start and restart the pod's engines."""
    router = APIRouter()
    _engines_route(
        router, wire.NM_ENGINES_STOP_PATH, wire.EnginesStopRequest, lambda body: nm.stop_engines(body.endpoint_ids)
    )
    _engines_route(router, wire.NM_ENGINES_START_PATH, wire.EnginesStartRequest, lambda body: nm.start_engines(body))
    _engines_route(
        router,
        wire.NM_ENGINES_RESTART_PATH,
        wire.EnginesStartRequest,
        lambda body: nm.start_engines(body, restart=True),
    )
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
