"""Prediction routes (``/api/v1/gpu-health/``): the prediction list and the statistics."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from heteroflow.core.clock import utc
from heteroflow.health.predictions import STATUSES, PredictionStatus
from heteroflow.health.rules import RULE_VERSION
from heteroflow.health.statistics import band_statistics, disclaimer
from heteroflow.platform.auth import NodeScope, Principal, Scope
from heteroflow.server.auth import context, require
from heteroflow.server.context import ServerContext
from heteroflow.server.errors import BadRequest, error_responses
from heteroflow.server.routes.gpu_health import SourceParam, parse_source
from heteroflow.server.schemas import (
    BandOut,
    PredictionList,
    PredictionOut,
    PredictionStatsOut,
    UtcTime,
)
from heteroflow.storage.prediction_store import PredictionFilter

router = APIRouter(prefix="/api/v1/gpu-health", tags=["gpu-health"], responses=error_responses(400, 403))

Ctx = Annotated[ServerContext, Depends(context)]
Reader = Annotated[Principal, Depends(require(Scope.NODES_READ))]
BANDS = (7, 30)


@router.get("/predictions", response_model=PredictionList, summary="Predictions (experimental rules)")
async def list_predictions(
    ctx: Ctx,
    principal: Reader,
    node_id: Annotated[str | None, Query(max_length=64)] = None,
    gpu_index: Annotated[int | None, Query(ge=0, le=4095)] = None,
    status: str | None = None,
    since: UtcTime | None = None,
    until: UtcTime | None = None,
    source: SourceParam = "real",
    limit: int = 100,
    offset: int = 0,
) -> PredictionList:
    """Newest t0 first; ``since``/``until`` bound t0. Each item carries its frozen rule version and window."""
    if not 1 <= limit <= 500:
        raise BadRequest("limit must be between 1 and 500")
    if not 0 <= offset <= 10_000_000:
        raise BadRequest("offset must be between 0 and 10000000")
    if status is not None and status not in STATUSES:
        raise BadRequest(f"status must be one of {', '.join(STATUSES)}")
    chosen: PredictionStatus | None = next((s for s in STATUSES if s == status), None)
    flt = PredictionFilter(
        source=parse_source(source),
        scope=NodeScope.of(principal),
        node_id=node_id,
        gpu_index=gpu_index,
        status=chosen,
        since=utc(since) if since else None,
        until=utc(until) if until else None,
    )
    records, total = await asyncio.to_thread(ctx.predictions.list, flt, limit=limit, offset=offset)
    return PredictionList(
        items=[
            PredictionOut(
                id=r.id,
                node_id=r.card.node_id,
                gpu_index=r.card.gpu_index,
                uuid=r.card.uuid,
                source=r.card.source,
                rule_version=r.rule_version,
                window_days=r.window_days,
                t0=r.t0,
                window_end=r.window_end,
                status=r.status,
                signals=list(r.signals),
                evidence=r.evidence,
                created_at=r.created_at,
                judged_at=r.judged_at,
                conclusion=r.conclusion,
            )
            for r in records
        ],
        total=total,
        limit=limit,
        offset=offset,
        current_rule_version=RULE_VERSION,
    )


@router.get("/prediction-stats", response_model=PredictionStatsOut, summary="Precision and recall, 7 and 30 days")
async def prediction_stats(
    ctx: Ctx, principal: Reader, since: UtcTime | None = None, source: SourceParam = "real"
) -> PredictionStatsOut:
    """Both bands always. Ratios are null — never 0 — while the evidence is insufficient, with the reasons."""
    chosen = parse_source(source)
    now = ctx.clock.now()
    start = utc(since) if since else now - timedelta(days=ctx.health_settings.retention_days)
    scope = NodeScope.of(principal)
    counts, exposure = await asyncio.to_thread(
        ctx.predictions.statistics, source=chosen, scope=scope, since=start, now=now, window_days=BANDS
    )
    settings = ctx.prediction_settings
    bands = []
    for n in BANDS:
        stats = band_statistics(
            counts[n], exposure, min_matured=settings.min_matured, min_span_days=settings.min_span_days
        )
        bands.append(
            BandOut(
                window_days=n,
                pending=stats.counts.pending,
                hit=stats.counts.hit,
                miss=stats.counts.miss,
                voided=stats.counts.voided,
                matured=stats.matured,
                failed_cards=stats.counts.failed_cards,
                predicted_cards=stats.counts.predicted_cards,
                missed_cards=stats.missed_cards,
                unconfirmed_failed_cards=stats.counts.unconfirmed_failed_cards,
                precision=stats.precision,
                recall=stats.recall,
                insufficient=list(stats.insufficient),
            )
        )
    return PredictionStatsOut(
        source=chosen,
        since=start,
        until=now,
        rule_version=RULE_VERSION,
        monitorable_cards=exposure.monitorable_cards,
        card_days=round(exposure.card_days, 3),
        span_days=round(exposure.span_days, 3) if exposure.span_days is not None else None,
        min_matured=settings.min_matured,
        min_span_days=settings.min_span_days,
        windows=bands,
        disclaimer=disclaimer(min_matured=settings.min_matured, min_span_days=settings.min_span_days),
    )
