"""The NodeManager's HTTP API: thin handlers over :class:`~.daemon.NodeManager`.

- Every route but the ``/health`` probe needs ``Authorization: Bearer <cluster token>`` (401 otherwise),
  checked first. ``/metrics`` needs it too, as the controller's and the Coordinator's do: its series name the
  pod, its endpoints and whether a round holds the guard.
- The FT routes (status, apply, guard, finalize, and probe/nudge) answer 404 while
  ``enable_dp_scale_down_proxy`` is off, whatever the body.
- Bodies are parsed here, so a malformed body is a 400 with a message, never a 422 or a 500; a body over
  1 MiB is a 413 and JSON nested deeper than 32 levels a 400 (:mod:`heteroflow.core.request_body`), both
  answered before the route runs.
- Errors map to HTTP statuses in one place (:data:`STATUS_OF`): stale or conflicting rounds → 502 (the
  RFC's status for "another transaction owns this NodeManager"), a missing or expired guard, a second apply or
  an engine start in a world too small to hold the experts → 409, a bad command → 400. An apply the engines did
  not all accept (HTTP 202) answers 502 with each engine's result.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from heteroflow.core.request_body import BodyError, BodyLimit
from heteroflow.http.bodies import BadBodyError
from heteroflow.http.errors import StatusMap, error_response
from heteroflow.http.gate import TokenGate, gate_middleware
from heteroflow.http.probes import LIVENESS_PATH, probes_router
from heteroflow.serving.node_manager import service
from heteroflow.serving.node_manager.daemon import NodeManager, ProxyDisabledError, UnknownEndpointError
from heteroflow.serving.node_manager.lifecycle import LaunchRefusedError
from heteroflow.serving.node_manager.routes import engines_router, ft_router, node_router

STATUS_OF = StatusMap(
    {
        UnknownEndpointError: 400,
        service.InvalidCommandError: 400,
        service.NotGuardedError: 409,
        service.AlreadyAppliedError: 409,
        LaunchRefusedError: 409,
        service.GuardConflictError: 502,
        service.StaleRequestError: 502,
    }
)
"""The status of each FT error; anything else is a 500."""

OPEN_PATHS = frozenset({LIVENESS_PATH})
"""The liveness probe, which kubelet calls without a token; it says nothing but "the process serves HTTP"."""


def create_app(nm: NodeManager, *, cluster_token: str | None, allow_no_token: bool = False) -> FastAPI:
    app = FastAPI(
        title="HeteroFlow NodeManager", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False
    )
    # added before the token check, so that the token check runs first (the last middleware added is outermost)
    app.add_middleware(BodyLimit, render=lambda _, exc: {"error": exc.code, "detail": str(exc)})
    gate = TokenGate(cluster_token, allow_no_token=allow_no_token, open_paths=OPEN_PATHS)
    app.middleware("http")(gate_middleware(gate, lambda detail: error_response(401, "unauthorized", detail)))

    @app.exception_handler(BadBodyError)
    async def _bad_body(_: Request, exc: BadBodyError) -> JSONResponse:
        return error_response(400, "invalid_body", str(exc))

    @app.exception_handler(BodyError)
    async def _body_error(_: Request, exc: BodyError) -> JSONResponse:
        return error_response(exc.status, exc.code, str(exc))

    @app.exception_handler(ProxyDisabledError)
    async def _proxy_off(_: Request, exc: ProxyDisabledError) -> JSONResponse:
        return error_response(404, "not_found", str(exc))

    @app.exception_handler(service.FtServiceError)
    async def _ft_error(_: Request, exc: service.FtServiceError) -> JSONResponse:
        return error_response(STATUS_OF.status_of(exc), exc.code, str(exc))

    app.include_router(probes_router())
    app.include_router(node_router(nm))
    app.include_router(ft_router(nm))
    app.include_router(engines_router(nm))
    return app
