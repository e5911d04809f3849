"""Assembly of the platform server: stores, services, background tasks, routes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI
from sqlalchemy.engine import Engine

import heteroflow
from heteroflow.core.clock import Clock, SystemClock
from heteroflow.core.ttl_cache import TtlCache
from heteroflow.health.ingest import HealthIngestor
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import Principal
from heteroflow.platform.liveness import LivenessTracker
from heteroflow.server.auth import authenticate
from heteroflow.server.context import ServerContext
from heteroflow.server.errors import install_error_handlers
from heteroflow.server.maintenance import run_maintenance
from heteroflow.server.metrics import ServerMetrics
from heteroflow.server.routes import gpu_health, nodes, ops
from heteroflow.server.settings import ServerSettings
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.health_store import SqlHealthSampleStore
from heteroflow.storage.node_store import SqlNodeStore
from heteroflow.storage.token_store import SqlTokenStore


def build_context(
    *,
    settings: ServerSettings,
    health_settings: HealthStorageSettings,
    clock: Clock | None = None,
    engine: Engine | None = None,
) -> ServerContext:
    clock = clock or SystemClock()
    engine = engine or create_db_engine(settings.database_url)
    samples = SqlHealthSampleStore(engine)
    metrics = ServerMetrics()
    sa.event.listen(engine, "before_cursor_execute", lambda *_: metrics.db_statements.inc())
    ingestor = HealthIngestor(store=samples, clock=clock, settings=health_settings)
    liveness = LivenessTracker()
    metrics.watch(ingestor.status, liveness.status)
    return ServerContext(
        settings=settings,
        health_settings=health_settings,
        clock=clock,
        engine=engine,
        tokens=SqlTokenStore(engine),
        nodes=SqlNodeStore(engine),
        samples=samples,
        ingestor=ingestor,
        liveness=liveness,
        metrics=metrics,
        token_cache=TtlCache(ttl_seconds=settings.auth_cache_seconds, max_entries=10_000),
        node_cache=TtlCache(ttl_seconds=settings.node_cache_seconds, max_entries=100_000),
    )


def create_app(ctx: ServerContext, *, migrate: bool = True) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if migrate:
            await asyncio.to_thread(upgrade_database, ctx.engine)
        ctx.ingestor.start()
        flusher = asyncio.create_task(run_maintenance(ctx), name="maintenance")
        try:
            yield
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            await ctx.ingestor.stop()

    app = FastAPI(
        title="HeteroFlow platform server",
        version=heteroflow.__version__,
        description="Nodes, auth and tenants, and GPU health samples. Every route needs a bearer token.",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.context = ctx
    install_error_handlers(app)
    app.include_router(nodes.router)
    app.include_router(gpu_health.router)
    app.include_router(ops.router)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(_: Annotated[Principal, Depends(authenticate)]) -> dict[str, Any]:
        return app.openapi()

    return app
