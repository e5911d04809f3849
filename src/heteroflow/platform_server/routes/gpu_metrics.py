"""``GET /api/v1/nodes/{node_id}/gpu-metrics``: a node's per-minute GPU metrics history (scoped like every node
route: a node outside the caller's tenant is a 404)."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from heteroflow.core.clock import utc
from heteroflow.health.gpu_metrics import METRIC_KEYS, Aggregate, MinuteRow, downsample, minute_of
from heteroflow.platform.auth import Principal, Scope
from heteroflow.platform_server.auth import context, require, visible_node
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import error_responses
from heteroflow.platform_server.schemas import UtcTime

router = APIRouter(prefix="/api/v1/nodes", tags=["nodes"], responses=error_responses(403, 404))

Ctx = Annotated[ServerContext, Depends(context)]
Reader = Annotated[Principal, Depends(require(Scope.NODES_READ))]

#: a series never has more points than this; a wider range gets a coarser step (reported back)
MAX_POINTS = 1440


class AggregateOut(BaseModel):
    min: float
    avg: float
    max: float


class MetricsPointOut(BaseModel):
    t: datetime
    """The start of the step (UTC)."""
    samples: int
    temperature_c: AggregateOut | None
    utilization_pct: AggregateOut | None
    memory_used_mib: AggregateOut | None
    memory_total_mib: AggregateOut | None
    power_w: AggregateOut | None


class GpuSeriesOut(BaseModel):
    gpu_index: int
    uuid: str | None
    points: list[MetricsPointOut]


class GpuMetricsOut(BaseModel):
    node_id: str
    since: datetime
    until: datetime
    step_seconds: int
    retention_days: int
    gpus: list[GpuSeriesOut]
    note: str = (
        "Per-minute min/avg/max of the heartbeat metrics; null means not reported (unknown), never 0. "
        "Memory use is the workload's business: a full card is healthy and busy."
    )


def _agg(value: Aggregate | None) -> AggregateOut | None:
    return AggregateOut(min=value.min, avg=value.avg, max=value.max) if value is not None else None


def _point(row: MinuteRow) -> MetricsPointOut:
    values = {name: _agg(row.values.get(name)) for name in METRIC_KEYS}
    return MetricsPointOut(t=row.minute, samples=row.samples, **values)


@router.get("/{node_id}/gpu-metrics", response_model=GpuMetricsOut, summary="A node's GPU metrics history")
async def gpu_metrics(
    node_id: str,
    ctx: Ctx,
    principal: Reader,
    gpu_index: Annotated[int | None, Query(ge=0, le=4095)] = None,
    since: UtcTime | None = None,
    step: Annotated[int, Query(ge=60, le=86_400, description="seconds per point, a multiple of 60")] = 60,
) -> GpuMetricsOut:
    """Per-GPU series since ``since`` (default the last hour, at most the retention period), one point per
    ``step`` seconds (rounded up to whole minutes; coarser when the range would exceed 1440 points)."""
    node = await visible_node(ctx, principal, node_id, cached=False)
    now = ctx.clock.now()
    oldest = now - timedelta(days=ctx.metrics_settings.retention_days)
    start = minute_of(max(utc(since) if since is not None else now - timedelta(hours=1), oldest))
    until = minute_of(now) + timedelta(minutes=1)
    minutes = max(math.ceil(step / 60), math.ceil((until - start) / timedelta(minutes=1) / MAX_POINTS))
    step_delta = timedelta(minutes=minutes)
    rows = await asyncio.to_thread(
        ctx.gpu_metrics.read, node_id=node.id, gpu_index=gpu_index, source=node.source, since=start, until=until
    )
    by_card: dict[int, list[MinuteRow]] = {}
    for row in rows:
        by_card.setdefault(row.key.gpu_index, []).append(row)
    gpus = [
        GpuSeriesOut(
            gpu_index=index,
            uuid=series[-1].uuid,
            points=[_point(row) for row in downsample(series, start=start, step=step_delta)],
        )
        for index, series in sorted(by_card.items())
    ]
    return GpuMetricsOut(
        node_id=node.id,
        since=start,
        until=until,
        step_seconds=int(step_delta.total_seconds()),
        retention_days=ctx.metrics_settings.retention_days,
        gpus=gpus,
    )
