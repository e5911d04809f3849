"""GPU health read routes (``/api/v1/gpu-health/``): samples and the capability matrix."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from heteroflow.core.clock import utc
from heteroflow.core.ids import NodeId
from heteroflow.health.counters import HEALTH_KEYS
from heteroflow.health.xid_collection import CardXidState, XidCollectionReport
from heteroflow.platform.auth import NodeScope, Principal, Scope
from heteroflow.server.auth import context, require, visible_node
from heteroflow.server.context import ServerContext
from heteroflow.server.errors import BadRequest, error_responses
from heteroflow.server.schemas import CapabilitiesOut, CardCapabilityOut, SampleOut, SamplesOut, UtcTime

router = APIRouter(prefix="/api/v1/gpu-health", tags=["gpu-health"], responses=error_responses(400, 403))

Ctx = Annotated[ServerContext, Depends(context)]
Reader = Annotated[Principal, Depends(require(Scope.NODES_READ))]

CAPABILITIES_NOTE = (
    "Capabilities are derived from the samples actually received, not from a vendor support matrix: a "
    "metric is collectable when this card reported a non-null value in the period. 'unknown' means it was "
    "not collected in the period; it does not mean zero errors."
)


def parse_source(source: str) -> Literal["real", "simulated"]:
    """``real`` (default) or ``simulated``. ``all`` is refused: one series never mixes sources (H-70)."""
    if source == "real":
        return "real"
    if source == "simulated":
        return "simulated"
    raise BadRequest(f"source must be 'real' or 'simulated', not {source!r} (sources are never mixed)")


SourceParam = Annotated[str, Query(description="real (default) or simulated; 'all' is refused")]


def _since(value: datetime | None, *, default: datetime) -> datetime:
    return utc(value) if value is not None else default


@router.get(
    "/samples",
    response_model=SamplesOut,
    summary="Raw health samples of one card slot",
    responses=error_responses(404),
)
async def samples(
    ctx: Ctx,
    principal: Reader,
    node_id: Annotated[str, Query(min_length=1, max_length=64)],
    gpu_index: Annotated[int, Query(ge=0, le=4095)],
    since: UtcTime | None = None,
    limit: Annotated[int, Query(description="1..20000, default 5000")] = 5000,
    source: SourceParam = "real",
) -> SamplesOut:
    """Samples ascending by time since ``since`` (default the last 7 days). When more than ``limit``
    exist, the newest ``limit`` are returned and ``truncated`` is true."""
    if not 1 <= limit <= 20_000:
        raise BadRequest("limit must be between 1 and 20000")
    chosen = parse_source(source)
    node = await visible_node(ctx, principal, node_id, cached=False)
    start = _since(since, default=ctx.clock.now() - timedelta(days=7))
    rows, truncated = await asyncio.to_thread(
        ctx.samples.card_samples,
        node_id=NodeId(node.id),
        gpu_index=gpu_index,
        source=chosen,
        since=start,
        limit=limit,
    )
    return SamplesOut(
        node_id=node.id,
        gpu_index=gpu_index,
        source=chosen,
        since=start,
        limit=limit,
        truncated=truncated,
        samples=[SampleOut(sampled_at=r.sampled_at, uuid=r.uuid, **r.counters.as_dict()) for r in rows],
    )


@router.get("/capabilities", response_model=CapabilitiesOut, summary="What each card can report")
async def capabilities(
    ctx: Ctx,
    principal: Reader,
    source: SourceParam = "real",
    since: UtcTime | None = None,
    stalled: Annotated[bool | None, Query(description="true: only cards whose collection stalled; false: none")] = None,
    node_id: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    q: Annotated[
        str | None, Query(min_length=1, max_length=128, description="part of the card's uuid or its node's name")
    ] = None,
) -> CapabilitiesOut:
    """One row per card (node, index, uuid) with samples in the period (default: the retention period).
    ``stalled``, ``node_id`` and ``q`` keep only the matching cards (the footer note stays)."""
    chosen = parse_source(source)
    now = ctx.clock.now()
    start = _since(since, default=now - timedelta(days=ctx.health_settings.retention_days))
    stall = timedelta(minutes=ctx.health_settings.stall_threshold_minutes)
    until = now + timedelta(seconds=ctx.health_settings.clock_skew_seconds)
    cards = await asyncio.to_thread(
        ctx.samples.capabilities, scope=NodeScope.of(principal), source=chosen, since=start, until=until
    )
    if stalled is not None:
        cards = [card for card in cards if (now - card.last_sample_at > stall) == stalled]
    if node_id is not None:
        cards = [card for card in cards if card.node_id == node_id]
    needle = q.strip().lower() if q else ""
    if needle:
        names = await asyncio.to_thread(ctx.nodes.names, {card.node_id for card in cards})
        cards = [
            card
            for card in cards
            if needle in (card.uuid or "").lower() or needle in names.get(card.node_id, "").lower()
        ]
    monotonic = ctx.clock.monotonic()
    xid_reports = {card.node_id: ctx.xid_collection.get(card.node_id, now=monotonic) for card in cards}
    return CapabilitiesOut(
        source=chosen,
        since=start,
        stall_threshold_minutes=ctx.health_settings.stall_threshold_minutes,
        note=CAPABILITIES_NOTE,
        cards=[
            CardCapabilityOut(
                node_id=card.node_id,
                gpu_index=card.gpu_index,
                uuid=card.uuid,
                metrics={key: "collectable" if card.collectable[key] else "unknown" for key in HEALTH_KEYS},
                first_sample_at=card.first_sample_at,
                last_sample_at=card.last_sample_at,
                sample_count=card.sample_count,
                collection_stalled=now - card.last_sample_at > stall,
                trend_prediction_possible=card.collectable["ecc_corrected_total"],
                semantics_unconfirmed=list(card.semantics_unconfirmed),
                xid_events=_card_xids(xid_reports[card.node_id], card.gpu_index)[0],
                xid_events_reason=_card_xids(xid_reports[card.node_id], card.gpu_index)[1],
            )
            for card in cards
        ],
    )


def _card_xids(report: XidCollectionReport | None, gpu_index: int) -> tuple[CardXidState, str | None]:
    if report is None:
        return "unknown", "the agent has not reported its XID source recently"
    return report.card(gpu_index)
