"""Operational routes: liveness probe, Prometheus metrics, server status."""

from __future__ import annotations

import asyncio
import os
from collections.abc import MutableMapping
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST

from heteroflow.core.errors import StoreUnavailableError
from heteroflow.platform.auth import Principal, Scope
from heteroflow.platform_server.auth import authenticate, context, require_cluster_wide
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import error_responses
from heteroflow.platform_server.fleet_metrics import render_fleet
from heteroflow.storage.fleet_store import FleetSnapshot, SqlFleetStore

router = APIRouter(tags=["operations"])

Ctx = Annotated[ServerContext, Depends(context)]


@router.get("/health", summary="Liveness probe of the server process (open: probes carry no token)")
async def health() -> dict[str, str]:
    """Answers from the event loop alone, never the database: a database outage must not restart the server
    (heartbeats keep answering through it, H-22)."""
    return {"status": "ok"}


@router.get("/healthz", summary="Liveness of the server process (any valid token)", responses=error_responses())
async def healthz(_: Annotated[Principal, Depends(authenticate)]) -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/api/v1/auth/whoami",
    summary="The caller's token: its label, scopes and tenant's name (any valid token; never the token itself)",
    responses=error_responses(),
)
async def whoami(principal: Annotated[Principal, Depends(authenticate)]) -> dict[str, Any]:
    """What the Coordinator asks about an API key: whether it has the ``inference`` scope, and its tenant."""
    return {
        "token_name": principal.token_name,
        "scopes": sorted(scope.value for scope in principal.scopes),
        "tenant_name": principal.tenant_name,
    }


@router.get("/metrics", summary="Prometheus metrics", response_class=Response, responses=error_responses(403))
async def metrics(ctx: Ctx, _: Annotated[Principal, Depends(require_cluster_wide(Scope.METRICS_READ))]) -> Response:
    snapshot: FleetSnapshot | None
    try:
        snapshot = await asyncio.to_thread(SqlFleetStore(ctx.engine).snapshot)
    except StoreUnavailableError:  # the in-memory series still answer; the fleet ones say they are missing
        snapshot = None
    parts = await ctx.metrics.scrape_parts() if ctx.siblings is None else await ctx.siblings.render()
    parts.append(await asyncio.to_thread(render_fleet, snapshot))  # a line per node: off the loop, like the cards'
    return exposition(parts)


def exposition(parts: list[bytes]) -> Response:
    """The answer whose body is ``parts``, sent one after another with their total length: a fleet's 28 MB is never
    joined into one text on the event loop."""
    return _PartsResponse(parts, media_type=CONTENT_TYPE_LATEST)


class _PartsResponse(Response):
    """A body sent as several ``http.response.body`` messages under one ``Content-Length``: nothing more. Not a
    ``StreamingResponse``, which also runs a task listening for the client's disconnect, work a scrape needs not."""

    def __init__(self, parts: list[bytes], *, media_type: str) -> None:
        self._parts = parts or [b""]
        super().__init__(content=b"", media_type=media_type)
        self.headers["content-length"] = str(sum(len(part) for part in self._parts))

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        last = len(self._parts) - 1
        for number, part in enumerate(self._parts):
            await send({"type": "http.response.body", "body": part, "more_body": number < last})


@router.get(
    "/api/v1/server/status",
    summary="Status of the server's background paths (admin)",
    responses=error_responses(403),
)
async def status(ctx: Ctx, _: Annotated[Principal, Depends(require_cluster_wide(Scope.ADMIN))]) -> dict[str, Any]:
    return {
        "health_ingest": asdict(ctx.ingestor.status()),
        "heartbeat_admission": asdict(ctx.heartbeat_admission.status()),
        "client_limits": {"node": asdict(ctx.node_limit.status()), "peer": asdict(ctx.peer_limit.status())},
        "failed_credentials": asdict(ctx.failed_credentials.status(now=ctx.clock.monotonic())),
        "liveness": asdict(ctx.liveness.status()),
        "prediction_worker": asdict(ctx.worker.status()),
        "alert_delivery": asdict(ctx.notifier.status()),
        "gpu_metrics": asdict(ctx.metrics_recorder.status()),
        "worker": {
            "pid": os.getpid(),
            "workers": ctx.settings.workers,
            "siblings_now": None if ctx.siblings is None else len(ctx.siblings.siblings()),
        },
        "config_warnings": [
            *ctx.settings.config_warnings,
            *ctx.health_settings.config_warnings,
            *ctx.prediction_settings.config_warnings,
            *ctx.metrics_settings.config_warnings,
        ],
    }
