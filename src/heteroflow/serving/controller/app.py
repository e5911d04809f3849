"""The controller's HTTP API (``serving-ft.md`` APIs).

Routes (all but ``/health`` need the cluster token; 4xx bodies are ``{"error", "detail"}``):

- ``POST /controller/node_manager/register`` · ``POST /controller/node_manager/heartbeat`` ·
  ``POST /controller/report_software_fault`` — the NodeManagers' side (wire models in ``serving/wire.py``).
- ``POST /controller/report_hardware_fault`` — a hardware fault from a source outside the process (F-3, F-12).
- ``GET /controller/fault_tolerance/status`` — one runtime per instance, RFC §7's keys plus what an operator
  needs beside them (pods, published view, generation, last decision, recent rounds).
- ``GET /controller/fault_tolerance/rounds`` (``?instance_id=``) and ``…/rounds/{request_id}`` — the evidence
  timelines (F-60).
- ``GET /controller/resource_monitor`` — the hardware sources: state, snapshots, problems, standing faults.
- ``GET /controller/config`` — the effective configuration and the warnings of its loading.
- ``GET /controller/leadership`` — this controller's role (``leader``, ``standby``, ``single``) and the leader.
- ``GET /metrics`` (Prometheus), ``GET /health`` (liveness) and ``GET /ready`` (200 once this controller acts:
  started, and the leader in active/standby mode; 503 otherwise) — the two probes are open without a token.

Until the controller acts (a standby, or while it loads the persisted runtimes), every route but the probes,
``/metrics``, ``/controller/leadership`` and ``/controller/config`` answers ``503 not_leader`` naming the leader:
a NodeManager given several controller URLs moves on to the next one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from heteroflow.core.openapi import json_request_body
from heteroflow.core.request_body import BodyError, BodyLimit, parse_json
from heteroflow.platform.auth import bearer_matches
from heteroflow.serving.controller.leadership import LeaderElection
from heteroflow.serving.controller.monitor import ResourceMonitor
from heteroflow.serving.controller.registration import RegistrationConflictError
from heteroflow.serving.controller.service import Controller, UnknownInstanceError
from heteroflow.serving.controller.status import instance_statuses
from heteroflow.serving.wire import (
    HEARTBEAT_PATH,
    REGISTER_PATH,
    REPORT_HARDWARE_FAULT_PATH,
    REPORT_SOFTWARE_FAULT_PATH,
    ErrorBody,
    HardwareFaultAnswer,
    HardwareFaultReport,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    SoftwareFaultReport,
)

_M = TypeVar("_M", bound=BaseModel)

PROBES = frozenset({"/health", "/ready"})
OPEN_BEFORE_ACTING = PROBES | {"/metrics", "/controller/leadership", "/controller/config"}
"""Routes that answer before the controller acts (a standby's): none of them acts or reports instance state."""

MAX_BODY_BYTES = 1 << 20
MAX_JSON_DEPTH = 32


_ERRORS: dict[int, str] = {
    400: "The body is not the wire model (invalid_body): too large, not JSON, too deep, or a field is wrong.",
    401: "No valid cluster token (unauthorized).",
    404: "Not in this controller's memory (unknown_instance, unknown_round).",
    409: "The registration contradicts the instance's registered facts (registration_conflict).",
    503: "This controller does not act (not_leader): a standby, or it is still loading; the leader is named.",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of a guarded route (401 and ``codes``), each ``{"error", "detail"}``."""
    return {code: {"model": ErrorBody, "description": _ERRORS[code]} for code in sorted({401, *codes})}


class _BadBody(Exception):
    pass


def _error(status: int, code: str, detail: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


async def _body(request: Request, model: type[_M]) -> _M:
    try:  # size and read time were bounded by BodyLimit; the depth is checked on the bytes, before parsing
        raw = parse_json(await request.body(), max_bytes=MAX_BODY_BYTES, max_depth=MAX_JSON_DEPTH)
    except BodyError as exc:
        raise _BadBody(str(exc).replace("the request body", "the body")) from exc
    if not isinstance(raw, dict):
        raise _BadBody("the body must be a JSON object")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "body"
        raise _BadBody(f"{where}: {err['msg']}") from exc


def create_app(
    controller: Controller,
    *,
    cluster_token: str | None,
    allow_no_token: bool = False,
    monitor: ResourceMonitor | None = None,
    leadership: LeaderElection | None = None,
) -> FastAPI:
    app = FastAPI(title="HeteroFlow controller", docs_url=None, redoc_url=None, redirect_slashes=False)

    def leadership_status() -> dict[str, object]:
        if leadership is None:
            return {"role": "single", "leader_id": None, "leader_url": None}
        return leadership.status()

    # added before the token check, so that the token check runs first: an anonymous body is never read
    app.add_middleware(
        BodyLimit,
        render=lambda _, exc: {"error": "invalid_body", "detail": str(exc).replace("the request body", "the body")},
        max_bytes=MAX_BODY_BYTES,
        too_large_status=400,
    )

    @app.middleware("http")
    async def _authenticate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        if path not in PROBES:
            if cluster_token:
                if not bearer_matches(request.headers.get("authorization"), cluster_token):
                    return _error(401, "unauthorized", "a valid cluster token is required (Authorization: Bearer)")
            elif not allow_no_token:
                return _error(401, "unauthorized", "no cluster token is configured; internal routes are closed")
        if not controller.started and path not in OPEN_BEFORE_ACTING:
            found = leadership_status()
            leader = found["leader_url"] or found["leader_id"]
            detail = (
                f"this controller is a standby; the leader is {leader}"
                if leader and found["role"] == "standby"
                else "this controller is not acting yet (it is starting or waiting for the leader lease)"
            )
            return _error(503, "not_leader", detail)
        return await call_next(request)

    @app.exception_handler(_BadBody)
    async def _bad_body(_: Request, exc: _BadBody) -> JSONResponse:
        return _error(400, "invalid_body", str(exc))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", responses={503: {"description": "Not acting yet, or a standby: the same body, ready false."}})
    async def ready() -> Response:
        acting = controller.started and (leadership is None or leadership.leading)
        return JSONResponse({"ready": acting, **leadership_status()}, status_code=200 if acting else 503)

    @app.get("/controller/leadership", responses=_errors())
    async def leadership_route() -> Response:
        return JSONResponse(leadership_status())

    @app.get("/metrics", response_class=Response, responses=_errors())
    async def metrics() -> Response:
        return Response(controller.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        REGISTER_PATH,
        responses={200: {"model": RegisterResponse}, **_errors(400, 409, 503)},
        openapi_extra=json_request_body(RegisterRequest),
    )
    async def register(request: Request) -> Response:
        try:
            answer = await controller.register(await _body(request, RegisterRequest))
        except RegistrationConflictError as exc:
            return _error(409, "registration_conflict", str(exc))
        return JSONResponse(answer.model_dump(mode="json"))

    @app.post(
        HEARTBEAT_PATH,
        responses={200: {"model": HeartbeatResponse}, **_errors(400, 503)},
        openapi_extra=json_request_body(HeartbeatRequest),
    )
    async def heartbeat(request: Request) -> Response:
        answer = controller.heartbeat(await _body(request, HeartbeatRequest))
        return JSONResponse(answer.model_dump(mode="json"))

    @app.post(
        REPORT_SOFTWARE_FAULT_PATH,
        responses=_errors(400, 404, 503),
        openapi_extra=json_request_body(SoftwareFaultReport),
    )
    async def report(request: Request) -> Response:
        body = await _body(request, SoftwareFaultReport)
        try:
            used = controller.report(body)
        except UnknownInstanceError as exc:
            return _error(404, "unknown_instance", str(exc))
        return JSONResponse({"accepted": True, "used": used})

    @app.post(
        REPORT_HARDWARE_FAULT_PATH,
        responses={200: {"model": HardwareFaultAnswer}, **_errors(400, 503)},
        openapi_extra=json_request_body(HardwareFaultReport),
    )
    async def report_hardware(request: Request) -> Response:
        body = await _body(request, HardwareFaultReport)
        mappings = controller.hardware_fault(body)
        answer = HardwareFaultAnswer(
            key=f"{body.fault_code}|{body.card}|{body.node_name}",
            mappings={
                inst: (f"{m.kind.value} {sorted(m.ranks)}" if m.ranks else f"{m.kind.value} {m.reason}".strip())
                for inst, m in mappings.items()
            },
        )
        return JSONResponse(answer.model_dump())

    @app.get("/controller/fault_tolerance/status", responses=_errors(503))
    async def ft_status() -> Response:
        return JSONResponse(instance_statuses(controller))

    @app.get("/controller/resource_monitor", responses=_errors(503))
    async def resource_monitor() -> Response:
        if monitor is None:
            return JSONResponse({"sources": [], "standing": [], "reports": 0, "sink_errors": 0})
        return JSONResponse(dataclasses.asdict(monitor.status()))

    @app.get("/controller/fault_tolerance/rounds", responses=_errors(503))
    async def rounds(instance_id: str | None = None) -> Response:
        found = [
            {k: v for k, v in record.as_json().items() if k != "events"}
            for inst_id in ([instance_id] if instance_id else list(controller.instances))
            for record in controller.history.for_instance(inst_id)
        ]
        return JSONResponse(found)

    @app.get("/controller/fault_tolerance/rounds/{request_id}", responses=_errors(404, 503))
    async def round_timeline(request_id: str) -> Response:
        record = controller.history.get(request_id)
        if record is None:
            return _error(404, "unknown_round", f"no round {request_id!r} in this controller's history")
        return JSONResponse(record.as_json())

    @app.get("/controller/config", responses=_errors())
    async def config() -> Response:
        cfg = controller.config
        return JSONResponse(
            {
                "fault_tolerance_config": cfg.ft.model_dump(),
                "derived": {"enable_dp_scale_down_proxy": cfg.ft.scale_down_enabled},
                "store_error": controller.store_error,
                "warnings": list(cfg.warnings),
            }
        )

    return app
