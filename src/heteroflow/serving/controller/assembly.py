"""The controller's HTTP API (``serving-ft.md`` APIs).

Routes (all but ``/health`` need the cluster token; 4xx bodies are ``{"error", "detail"}``):

- ``POST /controller/node_manager/register`` · ``POST /controller/node_manager/heartbeat`` ·
  ``POST /controller/report_software_fault`` — the NodeManagers' side (wire models in ``contracts/serving.py``).
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

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from heteroflow.core.request_body import BodyLimit
from heteroflow.http.bodies import BadBodyError
from heteroflow.http.errors import error_response
from heteroflow.http.gate import TokenGate, gate_middleware
from heteroflow.http.probes import PROBE_PATHS, probes_router
from heteroflow.serving.controller.leadership import LeaderElection
from heteroflow.serving.controller.monitor import ResourceMonitor
from heteroflow.serving.controller.routes import ControllerContext, node_manager_router, operator_router, serve
from heteroflow.serving.controller.service import Controller

PROBES = PROBE_PATHS
OPEN_BEFORE_ACTING = PROBES | {"/metrics", "/controller/leadership", "/controller/config"}
"""Routes that answer before the controller acts (a standby's): none of them acts or reports instance state."""


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

    # the last middleware added runs first: the token gate, then the leadership check, then the body limit, so
    # that an anonymous body is never read
    app.add_middleware(
        BodyLimit,
        render=lambda _, exc: {"error": "invalid_body", "detail": str(exc).replace("the request body", "the body")},
        too_large_status=400,
    )

    @app.middleware("http")
    async def _acting(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if not controller.started and request.url.path not in OPEN_BEFORE_ACTING:
            found = leadership_status()
            leader = found["leader_url"] or found["leader_id"]
            detail = (
                f"this controller is a standby; the leader is {leader}"
                if leader and found["role"] == "standby"
                else "this controller is not acting yet (it is starting or waiting for the leader lease)"
            )
            return error_response(503, "not_leader", detail)
        return await call_next(request)

    gate = TokenGate(cluster_token, allow_no_token=allow_no_token, open_paths=PROBES)
    app.middleware("http")(gate_middleware(gate, lambda detail: error_response(401, "unauthorized", detail)))

    @app.exception_handler(BadBodyError)
    async def _bad_body(_: Request, exc: BadBodyError) -> JSONResponse:
        return error_response(400, "invalid_body", str(exc))

    def readiness() -> tuple[bool, dict[str, object]]:
        acting = controller.started and (leadership is None or leadership.leading)
        return acting, leadership_status()

    app.include_router(
        probes_router(
            readiness=readiness, ready_description="Not acting yet, or a standby: the same body, ready false."
        )
    )
    serve(app, ControllerContext(controller=controller, monitor=monitor, leadership_status=leadership_status))
    app.include_router(operator_router())
    app.include_router(node_manager_router())
    return app
