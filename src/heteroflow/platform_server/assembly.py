"""Assembly of the platform server: :func:`build_context` wires the stores, services and background workers
into one :class:`ServerContext`; :func:`create_app` puts the lifespan, the error renderers, the middleware stack
(in its order) and the routers of :mod:`.routes` together over it."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.engine import Engine

import heteroflow
from heteroflow.core.admission import AdmissionGate, AdmissionLimit, Scope, watch_loop_lag
from heteroflow.core.auth_failures import BlockFailedCredentials, FailedCredentials
from heteroflow.core.authentication import AuthenticateFirst, Denial, may_carry_body
from heteroflow.core.client_limits import ClientLimit, InFlightByKey, peer_address
from heteroflow.core.clock import Clock, SystemClock
from heteroflow.core.request_body import BodyLimit
from heteroflow.core.ttl_cache import TtlCache
from heteroflow.health.ingest import HealthIngestor
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.health.tool_stalls import ToolStallBook
from heteroflow.health.xid_collection import XidCollectionBook
from heteroflow.platform.auth import Principal
from heteroflow.platform.cards import CardBook
from heteroflow.platform.liveness import LivenessTracker
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings, AlertNotifier
from heteroflow.platform_server.auth import (
    authenticate,
    check_before_work,
    credential_keys,
    heartbeat_node_id,
    heartbeat_owner,
    holds_valid_token,
    invalid_request,
    note_unauthorized,
)
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import install_error_handlers, limited, overloaded, refused_body
from heteroflow.platform_server.gpu_metrics import GpuMetricsRecorder
from heteroflow.platform_server.maintenance import run_maintenance
from heteroflow.platform_server.metrics import ServerMetrics
from heteroflow.platform_server.prediction_worker import PredictionWorker
from heteroflow.platform_server.routes import alerts as alert_routes
from heteroflow.platform_server.routes import gpu_health as gpu_health_routes
from heteroflow.platform_server.routes import gpu_metrics as gpu_metrics_routes
from heteroflow.platform_server.routes import hardware_events as hardware_event_routes
from heteroflow.platform_server.routes import nodes as node_routes
from heteroflow.platform_server.routes import ops as ops_routes
from heteroflow.platform_server.routes import predictions as prediction_routes
from heteroflow.platform_server.routes import serving as serving_routes
from heteroflow.platform_server.routes import session as session_routes
from heteroflow.platform_server.routes import web as web_routes
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.alert_store import SqlAlertStore
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.health_store import SqlHealthSampleStore
from heteroflow.storage.lease_store import SqlLeaseStore
from heteroflow.storage.metrics_store import SqlGpuMetricsStore
from heteroflow.storage.node_store import SqlNodeStore
from heteroflow.storage.prediction_store import SqlPredictionStore
from heteroflow.storage.session_store import SqlSessionStore
from heteroflow.storage.token_store import SqlTokenStore


def build_context(
    *,
    settings: ServerSettings,
    health_settings: HealthStorageSettings,
    prediction_settings: PredictionSettings | None = None,
    delivery_settings: AlertDeliverySettings | None = None,
    metrics_settings: GpuMetricsSettings | None = None,
    clock: Clock | None = None,
    engine: Engine | None = None,
) -> ServerContext:
    clock = clock or SystemClock()
    engine = engine or create_db_engine(settings.database_url)
    prediction_settings = prediction_settings or PredictionSettings.load()
    metrics_settings = metrics_settings or GpuMetricsSettings.load()
    samples = SqlHealthSampleStore(engine)
    nodes = SqlNodeStore(engine)
    predictions = SqlPredictionStore(engine)
    alerts = SqlAlertStore(engine)
    gpu_metrics = SqlGpuMetricsStore(engine)
    notifier = AlertNotifier(delivery_settings or AlertDeliverySettings.load())
    worker = PredictionWorker(
        predictions=predictions,
        alerts=alerts,
        nodes=nodes,
        leases=SqlLeaseStore(engine),
        settings=prediction_settings,
        clock=clock,
        notifier=notifier,
        metrics=gpu_metrics,
        weak_params=metrics_settings.weak,
    )
    metrics = ServerMetrics()
    sa.event.listen(engine, "before_cursor_execute", lambda *_: metrics.db_statements.inc())
    ingestor = HealthIngestor(store=samples, clock=clock, settings=health_settings)
    liveness = LivenessTracker()
    metrics.watch(ingestor.status, liveness.status)
    heartbeat_admission = AdmissionGate(
        max_in_flight=settings.max_in_flight_heartbeats,
        max_lag_sec=settings.heartbeat_shed_lag_seconds,
        # each tenant's nodes, and each token's within it, get a bounded share: no one fills the gate alone
        max_per_tenant=settings.heartbeat_tenant_slots,
        max_per_token=settings.heartbeat_token_slots,
    )
    metrics.watch_admission(heartbeat_admission.status)
    recorder = GpuMetricsRecorder(
        store=gpu_metrics, alerts=alerts, clock=clock, settings=metrics_settings, notifier=notifier
    )
    metrics.watch_gpus(recorder.latest)
    tool_stalls = ToolStallBook(stale_sec=settings.offline_after_seconds)
    metrics.watch_tool_stalls(lambda: tool_stalls.stalled(now=clock.monotonic()))
    return ServerContext(
        settings=settings,
        health_settings=health_settings,
        clock=clock,
        engine=engine,
        tokens=SqlTokenStore(engine),
        sessions=SqlSessionStore(engine),
        nodes=nodes,
        samples=samples,
        ingestor=ingestor,
        liveness=liveness,
        metrics=metrics,
        prediction_settings=prediction_settings,
        predictions=predictions,
        alerts=alerts,
        worker=worker,
        notifier=notifier,
        metrics_settings=metrics_settings,
        gpu_metrics=gpu_metrics,
        metrics_recorder=recorder,
        token_cache=TtlCache(ttl_sec=settings.auth_cache_seconds, max_entries=10_000),
        node_cache=TtlCache(ttl_sec=settings.node_cache_seconds, max_entries=100_000),
        heartbeat_admission=heartbeat_admission,
        node_limit=InFlightByKey(max_per_client=settings.max_in_flight_per_node),
        peer_limit=InFlightByKey(max_per_client=settings.max_in_flight_per_peer),
        xid_collection=XidCollectionBook(stale_sec=settings.offline_after_seconds),
        tool_stalls=tool_stalls,
        cards=CardBook(settings.card_limits),
        failed_credentials=FailedCredentials(
            max_failures=settings.max_failed_credentials, window_sec=settings.failed_credentials_window_seconds
        ),
    )


def _is_heartbeat(scope: Scope) -> bool:
    return heartbeat_node_id(scope) is not None


_ROUTERS = (
    node_routes,
    gpu_health_routes,
    gpu_metrics_routes,
    hardware_event_routes,
    prediction_routes,
    alert_routes,
    ops_routes,
    serving_routes,
    session_routes,
    web_routes,
)
"""The route modules, each a thin ``router`` over the :class:`ServerContext`, in the order they are included."""


def _lifespan(
    ctx: ServerContext, *, migrate: bool, run_worker: bool
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Start-up (migrations, ingestor, notifier, metrics recorder, background tasks, siblings) and shutdown in the
    reverse order, the controller proxy's pool last."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if migrate:
            await asyncio.to_thread(upgrade_database, ctx.engine)
        ctx.ingestor.start()
        ctx.notifier.start()
        ctx.metrics_recorder.start()
        tasks = [
            asyncio.create_task(run_maintenance(ctx), name="maintenance"),
            asyncio.create_task(watch_loop_lag(ctx.heartbeat_admission), name="loop-lag"),
        ]
        if ctx.prediction_settings.enabled and run_worker:
            tasks.append(asyncio.create_task(ctx.worker.run(), name="prediction-worker"))
        if ctx.siblings is not None:
            await ctx.siblings.start()
        try:
            yield
        finally:
            if ctx.siblings is not None:
                await ctx.siblings.stop()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await ctx.ingestor.stop()
            await ctx.metrics_recorder.stop()
            await ctx.notifier.stop()
            await app.state.controller_proxy.aclose()

    return lifespan


def _add_middleware(app: FastAPI, ctx: ServerContext) -> None:
    """The middleware stack, in the order that matters (see the comments: the last added runs first)."""
    # the last added runs first: failed-credential block → token check (and a heartbeat's node credential) →
    # per-address limit → per-node
    # limit → heartbeat admission → body size, read time, depth and unwritable text → a verified, valid
    # heartbeat recorded (routes/nodes.py: LeanHeartbeat) → FastAPI; a heartbeat's bad values are refused one by
    # one by its route (a bad reading never costs the beat)
    app.add_middleware(node_routes.LeanHeartbeat, ctx=ctx)
    app.add_middleware(BodyLimit, render=refused_body, strict_text=lambda scope: not _is_heartbeat(scope))
    retry_after_sec = max(1, math.ceil(ctx.settings.heartbeat_interval_seconds))
    # a refused heartbeat costs no body read at all; only authenticated heartbeats count
    app.add_middleware(
        AdmissionLimit,
        gate=ctx.heartbeat_admission,
        applies=_is_heartbeat,
        retry_after_sec=retry_after_sec,
        render=overloaded,
        on_refused=lambda _, why: ctx.metrics.heartbeats_refused.labels(reason=why).inc(),
        owner_of=heartbeat_owner,
    )
    # per client, inside the token check and before the gate: one node (its credential verified before this)
    # or one address never holds more than its share of the slots, so the others' beats still get one
    app.add_middleware(
        ClientLimit,
        limiter=ctx.node_limit,
        key_of=heartbeat_node_id,
        retry_after_sec=retry_after_sec,
        render=limited("this node"),
        on_refused=lambda _: ctx.metrics.requests_limited.labels(limit="node").inc(),
    )
    app.add_middleware(
        ClientLimit,
        limiter=ctx.peer_limit,
        key_of=lambda scope: peer_address(scope) if may_carry_body(scope) else None,
        retry_after_sec=retry_after_sec,
        render=limited("this address"),
        on_refused=lambda _: ctx.metrics.requests_limited.labels(limit="peer").inc(),
    )

    async def check(scope: Scope) -> Denial | None:
        return await check_before_work(ctx, scope)

    def denied(scope: Scope, denial: Denial) -> None:
        ctx.metrics.requests_denied.labels(status=str(denial.status)).inc()
        if denial.status == 401:
            note_unauthorized(ctx, scope)

    app.add_middleware(
        AuthenticateFirst,
        check=check,
        render=lambda _, denial: {"error": denial.code, "detail": denial.message},
        on_denied=denied,
    )
    # outermost: an address or a token with too many 401s is answered 429 before anything else, lookups included
    app.add_middleware(
        BlockFailedCredentials,
        book=ctx.failed_credentials,
        keys_of=credential_keys,
        trusted=lambda scope: holds_valid_token(ctx, scope),
        now=ctx.clock.monotonic,
        render=lambda _, wait: {
            "error": "too_many_requests",
            "detail": f"too many requests with a refused credential; retry in {wait} s",
        },
        on_refused=lambda _: ctx.metrics.requests_limited.labels(limit="credentials").inc(),
    )


def create_app(ctx: ServerContext, *, migrate: bool = True, run_worker: bool = True) -> FastAPI:
    """The platform server's app over ``ctx``: lifespan, error renderers, middleware, then the routers.

    ``migrate``: upgrade the database at start-up; ``run_worker``: run the prediction worker in this process.
    """
    app = FastAPI(
        title="HeteroFlow platform server",
        version=heteroflow.__version__,
        description="Nodes, auth and tenants, and GPU health samples. Every route needs a bearer token.",
        lifespan=_lifespan(ctx, migrate=migrate, run_worker=run_worker),
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # no "/nodes/" → "/nodes" redirect: Starlette builds its Location from the Host header, which any
        # client sets (an open redirect to another site)
        redirect_slashes=False,
        # the platform's metrics are its own Prometheus registry; FastAPI's OpenTelemetry bridge, left on, asks
        # the environment for a tracer, meter and logger provider on every request (~5 % of a steady beat's CPU)
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.context = ctx
    app.state.on_unauthorized = lambda scope: note_unauthorized(ctx, scope)  # errors.py: each 401 a route answers
    app.state.controller_proxy = serving_routes.controller_proxy(ctx)
    install_error_handlers(app)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await invalid_request(request, exc)

    _add_middleware(app, ctx)
    for routes in _ROUTERS:
        app.include_router(routes.router)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(_: Annotated[Principal, Depends(authenticate)]) -> dict[str, Any]:
        return app.openapi()

    return app
