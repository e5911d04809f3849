"""The controller's routers: thin handlers over :class:`~.service.Controller` (assembled in :mod:`.assembly`).

Each router is built once per process (:func:`functools.cache`) and reaches the controller of the app serving the
request through ``app.state`` (:class:`ControllerContext`, set by :func:`serve`): FastAPI's route building (the
models of every route's body and answers) is most of an app's assembly, and a process that starts controllers
again and again (the in-process test planes) would otherwise pay it at every start.

- :func:`node_manager_router` — what the NodeManagers (and hardware-fault sources) send.
- :func:`operator_router` — what an operator reads: status, rounds, resource monitor, config, leadership, metrics;
  and the one thing an operator asks for: a scaled-down instance's restore to its configured size.

4xx bodies are ``{"error", "detail"}`` (:func:`heteroflow.http.errors.error_response`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from heteroflow.contracts.serving import (
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
from heteroflow.core.openapi import json_request_body
from heteroflow.http.bodies import read_model
from heteroflow.http.errors import error_response
from heteroflow.serving.controller.monitor import ResourceMonitor
from heteroflow.serving.controller.registration import RegistrationConflictError
from heteroflow.serving.controller.restore import RestoreRefusedError
from heteroflow.serving.controller.service import Controller, UnknownInstanceError
from heteroflow.serving.controller.status import instance_statuses

_M = TypeVar("_M", bound=BaseModel)

LeadershipStatus = Callable[[], dict[str, object]]
"""This controller's role and the leader: ``{"role", "leader_id", "leader_url"}``."""

_ERRORS: dict[int, str] = {
    400: "The body is not the wire model (invalid_body): too large, not JSON, too deep, or a field is wrong.",
    401: "No valid cluster token (unauthorized).",
    404: "Not in this controller's memory (unknown_instance, unknown_round).",
    409: (
        "The registration contradicts the instance's registered facts (registration_conflict); the instance "
        "cannot be restored now (restore_refused, the reason in detail)."
    ),
    503: "This controller does not act (not_leader): a standby, or it is still loading; the leader is named.",
}


@dataclasses.dataclass(frozen=True)
class ControllerContext:
    """What the routers serve: the controller, its resource monitor and its leadership status."""

    controller: Controller
    monitor: ResourceMonitor | None
    leadership_status: LeadershipStatus


def serve(app: FastAPI, context: ControllerContext) -> None:
    """Make ``app``'s routers serve ``context``."""
    app.state.controller_context = context


def _context(request: Request) -> ControllerContext:
    context: ControllerContext = request.app.state.controller_context  # set by serve() before the app serves
    return context


def _controller(request: Request) -> Controller:
    return _context(request).controller


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of a guarded route (401 and ``codes``), each ``{"error", "detail"}``."""
    return {code: {"model": ErrorBody, "description": _ERRORS[code]} for code in sorted({401, *codes})}


async def _body(request: Request, model: type[_M]) -> _M:
    # size and read time were bounded by BodyLimit; every refusal of a body is a 400 here
    return await read_model(request, model, body_errors_as_bad_body=True)


@functools.cache
def node_manager_router() -> APIRouter:
    """Registration, heartbeats and fault reports."""
    router = APIRouter()

    @router.post(
        REGISTER_PATH,
        responses={200: {"model": RegisterResponse}, **_errors(400, 409, 503)},
        openapi_extra=json_request_body(RegisterRequest),
    )
    async def register(request: Request) -> Response:
        try:
            answer = await _controller(request).register(await _body(request, RegisterRequest))
        except RegistrationConflictError as exc:
            return error_response(409, "registration_conflict", str(exc))
        return JSONResponse(answer.model_dump(mode="json"))

    @router.post(
        HEARTBEAT_PATH,
        responses={200: {"model": HeartbeatResponse}, **_errors(400, 503)},
        openapi_extra=json_request_body(HeartbeatRequest),
    )
    async def heartbeat(request: Request) -> Response:
        answer = _controller(request).heartbeat(await _body(request, HeartbeatRequest))
        return JSONResponse(answer.model_dump(mode="json"))

    @router.post(
        REPORT_SOFTWARE_FAULT_PATH,
        responses=_errors(400, 404, 503),
        openapi_extra=json_request_body(SoftwareFaultReport),
    )
    async def report(request: Request) -> Response:
        body = await _body(request, SoftwareFaultReport)
        try:
            used = _controller(request).report(body)
        except UnknownInstanceError as exc:
            return error_response(404, "unknown_instance", str(exc))
        return JSONResponse({"accepted": True, "used": used})

    @router.post(
        REPORT_HARDWARE_FAULT_PATH,
        responses={200: {"model": HardwareFaultAnswer}, **_errors(400, 503)},
        openapi_extra=json_request_body(HardwareFaultReport),
    )
    async def report_hardware(request: Request) -> Response:
        body = await _body(request, HardwareFaultReport)
        mappings = _controller(request).hardware_fault(body)
        answer = HardwareFaultAnswer(
            key=f"{body.fault_code}|{body.card}|{body.node_name}",
            mappings={
                inst: (f"{m.kind.value} {sorted(m.ranks)}" if m.ranks else f"{m.kind.value} {m.reason}".strip())
                for inst, m in mappings.items()
            },
        )
        return JSONResponse(answer.model_dump())

    return router


@functools.cache
def operator_router() -> APIRouter:
    """The read-only routes: leadership, metrics, status, resource monitor, rounds, config."""
    router = APIRouter()

    @router.get("/controller/leadership", responses=_errors())
    async def leadership_route(request: Request) -> Response:
        return JSONResponse(_context(request).leadership_status())

    @router.get("/metrics", response_class=Response, responses=_errors())
    async def metrics(request: Request) -> Response:
        return Response(_controller(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/controller/fault_tolerance/status", responses=_errors(503))
    async def ft_status(request: Request) -> Response:
        return JSONResponse(instance_statuses(_controller(request)))

    @router.get("/controller/resource_monitor", responses=_errors(503))
    async def resource_monitor(request: Request) -> Response:
        monitor = _context(request).monitor
        if monitor is None:
            return JSONResponse({"sources": [], "standing": [], "reports": 0, "sink_errors": 0})
        return JSONResponse(dataclasses.asdict(monitor.status()))

    @router.get("/controller/fault_tolerance/rounds", responses=_errors(503))
    async def rounds(request: Request, instance_id: str | None = None) -> Response:
        controller = _controller(request)
        found = [
            {k: v for k, v in record.as_json().items() if k != "events"}
            for inst_id in ([instance_id] if instance_id else list(controller.instances))
            for record in controller.history.for_instance(inst_id)
        ]
        return JSONResponse(found)

    @router.get("/controller/fault_tolerance/rounds/{request_id}", responses=_errors(404, 503))
    async def round_timeline(request: Request, request_id: str) -> Response:
        record = _controller(request).history.get(request_id)
        if record is None:
            return error_response(404, "unknown_round", f"no round {request_id!r} in this controller's history")
        return JSONResponse(record.as_json())

    @router.post(
        "/controller/fault_tolerance/instances/{instance_id}/restore",
        status_code=202,
        responses={
            202: {"description": "The restore started: its request id (a round of kind restore)."},
            **_errors(404, 409, 503),
        },
    )
    async def restore_instance(request: Request, instance_id: str) -> Response:
        """Bring a scaled-down instance back to its configured size: a planned relaunch at full size
        (``docs/controller.md``, Capacity back). 409 when nothing is to restore or its capacity is not back."""
        try:
            request_id = _controller(request).restore(instance_id, requested_by="operator")
        except UnknownInstanceError as exc:
            return error_response(404, "unknown_instance", str(exc))
        except RestoreRefusedError as exc:
            return error_response(409, "restore_refused", str(exc))
        return JSONResponse({"request_id": request_id, "instance_id": instance_id}, status_code=202)

    @router.get("/controller/config", responses=_errors())
    async def config(request: Request) -> Response:
        controller = _controller(request)
        cfg = controller.config
        return JSONResponse(
            {
                "fault_tolerance_config": cfg.ft.model_dump(),
                "derived": {"enable_dp_scale_down_proxy": cfg.ft.scale_down_enabled},
                "store_error": controller.store_error,
                "warnings": list(cfg.warnings),
            }
        )

    return router
