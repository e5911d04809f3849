"""The Coordinator's routers: thin handlers over :class:`~.service.Coordinator` (assembled in :mod:`.assembly`).

- :func:`openai_router` — ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (F-41),
  behind an API key (:mod:`.auth`); the key was checked before the body was read (the assembly's middleware).
- :func:`management_router` — DEL, ADD, SET and ``GET /coordinator/instances`` (F-40), and
  ``GET /coordinator/client_outcomes`` (what clients saw in a time window, :mod:`.client_outcomes`), behind the
  cluster token;
  every answer is a ``ViewResponse`` (the views after the operation), with the operation's outcome in the
  ``X-HeteroFlow-View-Outcome`` header.
- :func:`metrics_router` — ``GET /metrics``, behind the cluster token.

Errors are raised as the typed errors of :mod:`.errors`, which the assembly renders.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from heteroflow.contracts.serving import (
    COORDINATOR_ADD_PATH,
    COORDINATOR_CLIENT_OUTCOMES_PATH,
    COORDINATOR_DEL_PATH,
    COORDINATOR_INSTANCES_PATH,
    COORDINATOR_SET_PATH,
    ErrorBody,
    ViewAddRequest,
    ViewDelRequest,
    ViewResponse,
    ViewSetRequest,
)
from heteroflow.core.openapi import json_request_body
from heteroflow.serving.coordinator.body import parse_inference_body
from heteroflow.serving.coordinator.errors import (
    CoordinatorError,
    InvalidViewRequestError,
    ManagementAuthError,
    ModelNotFoundError,
    OpenAiErrorBody,
    openai_error_response,
)
from heteroflow.serving.coordinator.metrics import CONTENT_TYPE
from heteroflow.serving.coordinator.middleware import cluster_token_problem
from heteroflow.serving.coordinator.service import Coordinator
from heteroflow.serving.coordinator.views import InstanceView, ViewChange, valid_host

_M = TypeVar("_M", bound=BaseModel)

VIEW_OUTCOME_HEADER = "X-HeteroFlow-View-Outcome"
_OUTCOME_PARAMETERS = [
    {"name": "since", "in": "query", "required": True, "schema": {"type": "number"}, "description": "Unix seconds"},
    {"name": "until", "in": "query", "required": True, "schema": {"type": "number"}, "description": "Unix seconds"},
    {"name": "model", "in": "query", "required": False, "schema": {"type": "string"}},
    {"name": "instance_id", "in": "query", "required": False, "schema": {"type": "string"}},
]
MAX_WINDOW_SEC = 86_400.0
"""The longest window ``GET /coordinator/client_outcomes`` counts (a round lasts seconds to minutes)."""
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

_MANAGEMENT_ERRORS: dict[int, str] = {
    400: "The body is not the wire model (invalid_body), or is larger than max_body_bytes.",
    401: "No valid cluster token, or none configured (unauthorized).",
    409: "ADD for an instance that serves another model (model_mismatch).",
}
_OPENAI_ERRORS: dict[int, str] = {
    400: "A malformed body: not JSON, nested too deeply, no string 'model', or a non-boolean 'stream'.",
    401: "No valid API key, or none configured.",
    404: "No instance was ever published for the model.",
    413: "The body is larger than max_body_bytes.",
    503: "No engine answered without a fault within the client deadline (held and re-routed until then), or the "
    "API key could not be checked; see Retry-After.",
}
_INFERENCE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "An OpenAI request; the Coordinator reads 'model' and 'stream' and forwards the "
                    "body unchanged.",
                    "required": ["model"],
                    "properties": {"model": {"type": "string", "minLength": 1}, "stream": {"type": "boolean"}},
                    "additionalProperties": True,
                }
            }
        },
    }
}


def _management_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody, "description": _MANAGEMENT_ERRORS[code]} for code in sorted({401, *codes})}


def _openai_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": OpenAiErrorBody, "description": _OPENAI_ERRORS[code]} for code in sorted({401, *codes})}


_INFERENCE_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The engine's answer, passed through (server-sent events when stream is true); an engine's "
        "own 4xx is passed through unchanged too.",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **_openai_errors(400, 404, 413, 503),
}


def _view_response(change: ViewChange | None, views: tuple[InstanceView, ...]) -> JSONResponse:
    body = ViewResponse(instances=[view.wire() for view in views]).model_dump(mode="json")
    headers = {VIEW_OUTCOME_HEADER: change.outcome.value} if change is not None else None
    if change is not None and change.detail:
        # header values are latin-1 on the wire: ids the controller chose may not be
        detail = change.detail.encode("ascii", "backslashreplace").decode("ascii")
        headers = {**(headers or {}), "X-HeteroFlow-View-Detail": detail}
    return JSONResponse(body, headers=headers)


async def _management_body(request: Request, model: type[_M]) -> _M:
    """The wire model of a management body: its size, read time and depth were bounded by :class:`BodyLimit`,
    after the cluster token was checked (:func:`.middleware.bound_bodies`)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "body"
        raise InvalidViewRequestError(f"{where}: {err['msg']}") from exc


def _routable(body: ViewAddRequest) -> ViewAddRequest:
    for endpoint in body.endpoints:
        if not valid_host(endpoint.ip):
            raise InvalidViewRequestError(f"endpoint {endpoint.id}: {endpoint.ip!r} is not an IP address or host name")
    return body


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


def _require_cluster_token(coordinator: Coordinator, request: Request) -> None:
    problem = cluster_token_problem(coordinator.settings.cluster_token, request.headers.get("authorization"))
    if problem is not None:
        raise ManagementAuthError(problem)


def metrics_router(coordinator: Coordinator) -> APIRouter:
    """``GET /metrics``: the cluster token, as the platform server guards its own /metrics with a scope (the
    series name every instance and its size)."""
    router = APIRouter()

    @router.get("/metrics", response_class=Response, responses=_management_errors())
    async def prometheus(request: Request) -> Response:
        _require_cluster_token(coordinator, request)
        return Response(coordinator.metrics.render(), media_type=CONTENT_TYPE)

    return router


def management_router(coordinator: Coordinator) -> APIRouter:
    """DEL, ADD, SET and the views (F-40): on the main app, and on the management listener's."""
    router = APIRouter()

    @router.post(
        COORDINATOR_DEL_PATH,
        responses={200: {"model": ViewResponse}, **_management_errors(400)},
        openapi_extra=json_request_body(ViewDelRequest),
    )
    async def view_del(request: Request) -> JSONResponse:
        _require_cluster_token(coordinator, request)
        body = await _management_body(request, ViewDelRequest)
        change = await coordinator.delete(body)
        return _view_response(change, change.instances)

    @router.post(
        COORDINATOR_ADD_PATH,
        responses={200: {"model": ViewResponse}, **_management_errors(400, 409)},
        openapi_extra=json_request_body(ViewAddRequest),
    )
    async def view_add(request: Request) -> JSONResponse:
        _require_cluster_token(coordinator, request)
        body = _routable(await _management_body(request, ViewAddRequest))
        change = await coordinator.add(body)
        return _view_response(change, change.instances)

    @router.post(
        COORDINATOR_SET_PATH,
        responses={200: {"model": ViewResponse}, **_management_errors(400)},
        openapi_extra=json_request_body(ViewSetRequest),
    )
    async def view_set(request: Request) -> JSONResponse:
        _require_cluster_token(coordinator, request)
        body = _routable(await _management_body(request, ViewSetRequest))
        change = await coordinator.replace(body)
        return _view_response(change, change.instances)

    @router.get(COORDINATOR_INSTANCES_PATH, responses={200: {"model": ViewResponse}, **_management_errors()})
    async def instances(request: Request) -> JSONResponse:
        _require_cluster_token(coordinator, request)
        return _view_response(None, coordinator.views.snapshot())

    @router.get(
        COORDINATOR_CLIENT_OUTCOMES_PATH,
        responses=_management_errors(400),
        openapi_extra={"parameters": _OUTCOME_PARAMETERS},
    )
    async def client_outcomes(request: Request) -> JSONResponse:
        """Counts of the disturbed requests in ``[since, until]`` (Unix seconds), of ``model`` or ``instance_id``.
        The query is read after the cluster token was checked: a caller without it learns nothing, not even
        which parameters are missing."""
        _require_cluster_token(coordinator, request)
        query = request.query_params
        try:
            since, until = float(query.get("since", "")), float(query.get("until", ""))
        except ValueError:
            raise InvalidViewRequestError("since and until are required Unix seconds") from None
        model, instance_id = query.get("model"), query.get("instance_id")
        if not (math.isfinite(since) and math.isfinite(until)) or since > until or until - since > MAX_WINDOW_SEC:
            raise InvalidViewRequestError(
                f"since and until must be finite Unix seconds, since <= until, at most {MAX_WINDOW_SEC:g} s apart"
            )
        if any(v is not None and not 0 < len(v) <= 253 for v in (model, instance_id)):
            raise InvalidViewRequestError("model and instance_id must be 1-253 characters")
        found = coordinator.forwarder.outcomes.summary(since=since, until=until, model=model, instance_id=instance_id)
        return JSONResponse(found)

    return router


def openai_router(coordinator: Coordinator) -> APIRouter:
    """The models list and the two inference routes (F-41)."""
    router = APIRouter()
    settings = coordinator.settings
    created = int(coordinator.clock.now().timestamp())

    @router.get("/v1/models", responses=_openai_errors(503))
    async def models(request: Request) -> Response:
        try:
            await coordinator.keys.verify(request.headers.get("authorization"))
        except CoordinatorError as exc:
            coordinator.metrics.requests.labels(route="models", outcome=exc.outcome).inc()
            raise
        coordinator.metrics.requests.labels(route="models", outcome="ok").inc()
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "heteroflow", "root": name}
            for name in coordinator.views.models()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def inference(request: Request, *, route: str, path: str) -> Response:
        request_id = _request_id(request)
        try:
            await coordinator.keys.verify(request.headers.get("authorization"))
            # size, read time and depth were bounded by BodyLimit, after the key (the assembly's middleware)
            body = parse_inference_body(await request.body(), max_bytes=settings.max_body_bytes)
            if not coordinator.views.is_known(body.model):
                raise ModelNotFoundError(f"The model `{body.model}` does not exist.")
            response = await coordinator.forwarder.forward(
                route=route, path=path, request=body, headers=request.headers.items(), request_id=request_id
            )
        except CoordinatorError as exc:
            coordinator.metrics.requests.labels(route=route, outcome=exc.outcome).inc()
            response = openai_error_response(exc)
        response.headers["x-request-id"] = request_id
        return response

    @router.post("/v1/completions", responses=_INFERENCE_ANSWERS, openapi_extra=_INFERENCE_BODY)
    async def completions(request: Request) -> Response:
        return await inference(request, route="completions", path="/v1/completions")

    @router.post("/v1/chat/completions", responses=_INFERENCE_ANSWERS, openapi_extra=_INFERENCE_BODY)
    async def chat_completions(request: Request) -> Response:
        return await inference(request, route="chat_completions", path="/v1/chat/completions")

    return router
