"""The Coordinator's HTTP apps, assembled from the routers of :mod:`.routes` over :class:`~.service.Coordinator`.

Routes and who may call them:

- ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` — an API key
  (:mod:`.auth`); the key is checked before the body is read, so an anonymous caller cannot make the
  Coordinator read a megabyte.
- ``POST /coordinator/manage/{del,add,set}``, ``GET /coordinator/instances`` — the cluster token; every
  answer is a ``ViewResponse`` (the views after the operation), with the operation's outcome in the
  ``X-HeteroFlow-View-Outcome`` header (``applied``, ``stale_generation``, ``unknown_instance``). With
  ``management_port`` they are also served by :func:`create_management_app` on a listener with an event loop
  of its own (:attr:`Coordinator.main_loop` runs everything that belongs to the OpenAI side).
- ``GET /metrics`` — the cluster token, as the platform server guards its own /metrics with a scope: the
  series name every instance and its size. ``GET /health`` — open, liveness only (a probe carries no secret,
  and the answer says nothing but "the process serves HTTP").

Errors map to statuses in :mod:`.errors`; nothing maps to 500.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from heteroflow.core.admission import AdmissionLimit, Refusal, Scope
from heteroflow.core.client_limits import ClientLimit, peer_address
from heteroflow.http.probes import probes_router
from heteroflow.serving.coordinator.auth import KeyFirst
from heteroflow.serving.coordinator.errors import (
    CoordinatorError,
    ManagementError,
    OverloadedError,
    management_error_response,
    openai_error_body,
    openai_error_response,
)
from heteroflow.serving.coordinator.middleware import INFERENCE_ROUTES, bound_bodies, is_inference, limited
from heteroflow.serving.coordinator.routes import management_router, metrics_router, openai_router
from heteroflow.serving.coordinator.service import Coordinator


def _overloaded(_: Scope, __: Refusal) -> dict[str, object]:
    return openai_error_body(
        status_code=OverloadedError.status_code,
        kind=OverloadedError.kind,
        message="the Coordinator is handling as many requests as it is configured for; try again shortly",
    )


def _render_management_errors(app: FastAPI) -> None:
    @app.exception_handler(ManagementError)
    async def _management_error(_: Request, exc: ManagementError) -> JSONResponse:
        return management_error_response(exc)


def create_app(coordinator: Coordinator) -> FastAPI:
    """The main listener's app: the OpenAI routes, the management routes, ``/metrics`` and ``/health``.

    Its lifespan records the loop it runs on (:attr:`Coordinator.main_loop`) and closes the Coordinator's pools
    at shutdown.
    """
    settings = coordinator.settings

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        coordinator.main_loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            await coordinator.aclose()

    app = FastAPI(
        title="HeteroFlow Coordinator",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
        redirect_slashes=False,
    )
    # the last added runs first: key (and its per-key bound) → per-address limit → admission gate → body size,
    # read time and depth → FastAPI. A key is verified before it takes a slot or sends a byte of its body.
    bound_bodies(app, coordinator.settings, coordinator.metrics)
    app.add_middleware(
        AdmissionLimit,
        gate=coordinator.admission,
        applies=is_inference,
        retry_after_sec=settings.retry_after_sec,
        render=_overloaded,
        on_refused=lambda scope, _: coordinator.metrics.requests.labels(
            route=INFERENCE_ROUTES[scope["path"]], outcome=OverloadedError.outcome
        ).inc(),
    )
    app.add_middleware(
        ClientLimit,
        limiter=coordinator.peer_limit,
        key_of=lambda scope: peer_address(scope) if is_inference(scope) else None,
        retry_after_sec=settings.retry_after_sec,
        render=limited,
        on_refused=lambda scope: coordinator.metrics.requests.labels(
            route=INFERENCE_ROUTES[scope["path"]], outcome="limited"
        ).inc(),
    )
    # added last, so it runs first: a key is verified before it takes an admission slot or sends its body
    keyed = {**INFERENCE_ROUTES, "/v1/models": "models"}
    app.add_middleware(
        KeyFirst,
        verifier=coordinator.keys,
        routes=keyed,
        registry=coordinator.metrics.registry,
        retry_after_sec=settings.retry_after_sec,
        on_refused=lambda route, exc: coordinator.metrics.requests.labels(route=route, outcome=exc.outcome).inc(),
        failures=coordinator.failed_keys,
    )

    _render_management_errors(app)

    @app.exception_handler(CoordinatorError)
    async def _openai_error(_: Request, exc: CoordinatorError) -> JSONResponse:
        return openai_error_response(exc)

    app.include_router(probes_router())
    app.include_router(metrics_router(coordinator))
    app.include_router(management_router(coordinator))
    app.include_router(openai_router(coordinator))
    return app


def create_management_app(coordinator: Coordinator) -> FastAPI:
    """The management routes alone, for the listener of ``management_port`` (a thread and loop of its own):
    a withdrawal never waits behind the OpenAI traffic in the main loop."""
    app = FastAPI(title="HeteroFlow Coordinator management", docs_url=None, redoc_url=None, openapi_url=None)
    bound_bodies(app, coordinator.settings, coordinator.metrics)
    _render_management_errors(app)
    app.include_router(probes_router())
    app.include_router(management_router(coordinator))
    return app
