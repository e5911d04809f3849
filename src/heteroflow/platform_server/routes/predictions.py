"""Prediction routes (``/api/v1/gpu-health/``): the prediction list and the statistics."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import timedelta
from typing import Annotated, Final, get_args

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from heteroflow.core.clock import utc
from heteroflow.core.ids import Source
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.predictions import STATUSES, PredictionStatus
from heteroflow.health.rules import RULE_VERSION
from heteroflow.health.statistics import BandCounts, Exposure, band_statistics, disclaimer
from heteroflow.health.text_codes import conclusion_code, reason_code
from heteroflow.platform.auth import NodeScope, Principal, Scope
from heteroflow.platform_server.auth import context, require
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import BadRequest, error_responses
from heteroflow.platform_server.routes.gpu_health import SourceParam, parse_source
from heteroflow.platform_server.schemas import (
    BandOut,
    OtherSourceOut,
    PredictionList,
    PredictionOut,
    PredictionStatsOut,
    UtcTime,
    coded_text,
    evidence_out,
)
from heteroflow.storage.prediction_store import STRONG_SIGNALS, PredictionFilter, PredictionOrder, PredictionRecord

router = APIRouter(prefix="/api/v1/gpu-health", tags=["gpu-health"], responses=error_responses(400, 403))

Ctx = Annotated[ServerContext, Depends(context)]
Reader = Annotated[Principal, Depends(require(Scope.NODES_READ))]
BANDS = (7, 30)

TREND_SIGNALS: Final = ("corrected_ecc_growth", "pending_remap_growth", "retired_pages_growth")
PREDICTION_TYPES: Final = {
    "strong": STRONG_SIGNALS,
    "trend": TREND_SIGNALS,
    **{code: (code,) for code in (*STRONG_SIGNALS, *TREND_SIGNALS)},
}
"""``type=``: a layer (strong: the card already reports uncorrectable errors or a remap failure; trend: a counter
grows) or one signal code."""
ORDERS: Final = get_args(PredictionOrder)
CSV_LIMIT: Final = 10_000
"""Rows of one CSV export; a fleet's pending predictions fit many times over, and the body stays a few MB."""
CSV_COLUMNS: Final = (
    "id", "node_id", "node_name", "gpu_index", "uuid", "source", "status", "signals", "t0", "window_end",
    "rule_version", "created_at", "judged_at", "conclusion",
)  # fmt: skip

TypeParam = Annotated[
    str | None, Query(description="strong, trend, or one signal code (uncorrectable_ecc, remap_failure, …)")
]
SortParam = Annotated[str, Query(description="newest (default), strong_first or window_end")]
SearchParam = Annotated[
    str | None, Query(min_length=1, max_length=128, description="part of the card's uuid or of its node's name")
]


def _filter(
    principal: Principal,
    *,
    node_id: str | None,
    gpu_index: int | None,
    status: str | None,
    since: UtcTime | None,
    until: UtcTime | None,
    source: str,
    type_: str | None,
    search: str | None,
) -> PredictionFilter:
    if status is not None and status not in STATUSES:
        raise BadRequest(f"status must be one of {', '.join(STATUSES)}")
    if type_ is not None and type_ not in PREDICTION_TYPES:
        raise BadRequest(f"type must be one of {', '.join(PREDICTION_TYPES)}")
    chosen: PredictionStatus | None = next((s for s in STATUSES if s == status), None)
    return PredictionFilter(
        source=parse_source(source),
        scope=NodeScope.of(principal),
        node_id=node_id,
        gpu_index=gpu_index,
        status=chosen,
        since=utc(since) if since else None,
        until=utc(until) if until else None,
        signals=PREDICTION_TYPES[type_] if type_ is not None else (),
        search=search.strip() or None if search else None,
    )


def _order(sort: str) -> PredictionOrder:
    if sort == "strong_first":
        return "strong_first"
    if sort == "window_end":
        return "window_end"
    if sort == "newest":
        return "newest"
    raise BadRequest(f"sort must be one of {', '.join(ORDERS)}")


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
    type: TypeParam = None,
    sort: SortParam = "newest",
    q: SearchParam = None,
    limit: int = 100,
    offset: int = 0,
) -> PredictionList:
    """Newest t0 first by default; ``since``/``until`` bound t0; ``type`` keeps a layer or a signal; ``q`` searches
    the card's uuid and node name. Each item carries its frozen rule version and window."""
    if not 1 <= limit <= 500:
        raise BadRequest("limit must be between 1 and 500")
    if not 0 <= offset <= 10_000_000:
        raise BadRequest("offset must be between 0 and 10000000")
    flt = _filter(
        principal,
        node_id=node_id,
        gpu_index=gpu_index,
        status=status,
        since=since,
        until=until,
        source=source,
        type_=type,
        search=q,
    )
    order = _order(sort)
    records, total = await asyncio.to_thread(ctx.predictions.list, flt, limit=limit, offset=offset, order=order)
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
                evidence_lines=evidence_out(r.evidence),
                conclusion_code=coded_text(r.conclusion, conclusion_code),
                alert_id=r.alert_id,
            )
            for r in records
        ],
        total=total,
        limit=limit,
        offset=offset,
        current_rule_version=RULE_VERSION,
    )


def band_out(counts: BandCounts, exposure: Exposure, settings: PredictionSettings) -> BandOut:
    """One band's figures, overall and (nested) for first failures, through the same evidence gate."""
    stats = band_statistics(counts, exposure, min_matured=settings.min_matured, min_span_days=settings.min_span_days)
    return BandOut(
        window_days=counts.window_days,
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
        insufficient_codes=[
            coded for reason in stats.insufficient if (coded := coded_text(reason, reason_code)) is not None
        ],
        first_failure=band_out(counts.first_failure, exposure, settings) if counts.first_failure else None,
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
    other: Source = "simulated" if chosen == "real" else "real"
    _, others = await asyncio.to_thread(
        ctx.predictions.list, PredictionFilter(source=other, scope=scope, since=start), limit=1, offset=0
    )
    settings = ctx.prediction_settings
    bands = [band_out(counts[n], exposure, ctx.prediction_settings) for n in BANDS]
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
        other_source=_other_source(chosen, other, others),
    )


def _other_source(chosen: Source, other: Source, predictions: int) -> OtherSourceOut | None:
    """What says which source the statistics are of, when the other one has predictions too (none: ``None``)."""
    if predictions == 0:
        return None
    return OtherSourceOut(
        source=other,
        predictions=predictions,
        note=(
            f"These statistics are of {chosen} predictions only; {predictions} {other} prediction(s) exist in the "
            f"period: ask with source={other}."
        ),
    )


@router.get(
    "/predictions.csv",
    summary="The same predictions as CSV (at most 10,000 rows; the same filters and sort)",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}, "description": "One header line, one row per prediction."}},
)
async def export_predictions(
    ctx: Ctx,
    principal: Reader,
    node_id: Annotated[str | None, Query(max_length=64)] = None,
    gpu_index: Annotated[int | None, Query(ge=0, le=4095)] = None,
    status: str | None = None,
    since: UtcTime | None = None,
    until: UtcTime | None = None,
    source: SourceParam = "real",
    type: TypeParam = None,
    sort: SortParam = "newest",
    q: SearchParam = None,
) -> Response:
    """A spreadsheet of the filtered predictions, with each card's node name; ``X-Total-Count`` says how many
    matched (more than the rows when the export was cut at 10,000)."""
    flt = _filter(
        principal,
        node_id=node_id,
        gpu_index=gpu_index,
        status=status,
        since=since,
        until=until,
        source=source,
        type_=type,
        search=q,
    )
    records, total = await asyncio.to_thread(ctx.predictions.list, flt, limit=CSV_LIMIT, offset=0, order=_order(sort))
    names = await asyncio.to_thread(ctx.nodes.names, {r.card.node_id for r in records})
    body = io.StringIO()
    writer = csv.writer(body, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for record in records:
        writer.writerow(_csv_row(record, names.get(record.card.node_id, "")))
    return Response(
        body.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="heteroflow-predictions-{flt.source}.csv"',
            "X-Total-Count": str(total),
        },
    )


def _csv_row(record: PredictionRecord, node_name: str) -> list[str]:
    cells = [
        record.id, record.card.node_id, node_name, str(record.card.gpu_index), record.card.uuid or "",
        record.card.source, record.status, ",".join(record.signals), record.t0.isoformat(),
        record.window_end.isoformat(), record.rule_version, record.created_at.isoformat(),
        record.judged_at.isoformat() if record.judged_at else "", record.conclusion or "",
    ]  # fmt: skip
    # a spreadsheet must not run a cell as a formula (CSV injection): node names come from agents
    return [f"'{cell}" if cell[:1] in ("=", "+", "-", "@", "\t", "\r") else cell for cell in cells]
