"""GPU health read routes (``/api/v1/gpu-health/``): samples and the capability matrix."""

from __future__ import annotations

import asyncio
import csv
import io
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Response

from heteroflow.core.clock import utc
from heteroflow.core.ids import NodeId
from heteroflow.health.counters import HEALTH_KEYS
from heteroflow.health.samples import Card
from heteroflow.health.xid_collection import CardXidState, XidCollectionReport
from heteroflow.platform.auth import NodeScope, Principal, Scope
from heteroflow.platform_server.auth import context, require, visible_node
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import BadRequest, error_responses
from heteroflow.platform_server.prediction_worker import CardFlood
from heteroflow.platform_server.schemas import (
    CapabilitiesOut,
    CardCapabilityOut,
    CeFloodOut,
    SampleOut,
    SamplesOut,
    UtcTime,
    XidEventOut,
    XidEventsOut,
    evidence_out,
)
from heteroflow.storage.health_buckets import CAPABILITY_SORTS, CapabilityQuery, CapabilitySort
from heteroflow.storage.health_store import CardCapability

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


@router.get(
    "/xid-events",
    response_model=XidEventsOut,
    summary="XID events of one node, or of one of its cards",
    responses=error_responses(404),
)
async def xid_events(
    ctx: Ctx,
    principal: Reader,
    node_id: Annotated[str, Query(min_length=1, max_length=64)],
    gpu_index: Annotated[int | None, Query(ge=0, le=4095, description="one card; absent: every card")] = None,
    since: UtcTime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="1..1000, default 200")] = 200,
    source: SourceParam = "real",
) -> XidEventsOut:
    """The XID events the node's agent reported since ``since`` (default: the retention period), newest first."""
    chosen = parse_source(source)
    node = await visible_node(ctx, principal, node_id, cached=False)
    start = _since(since, default=ctx.clock.now() - timedelta(days=ctx.health_settings.retention_days))
    events, truncated = await asyncio.to_thread(
        ctx.samples.xid_events, node_id=NodeId(node.id), source=chosen, gpu_index=gpu_index, since=start, limit=limit
    )
    return XidEventsOut(
        node_id=node.id,
        source=chosen,
        gpu_index=gpu_index,
        since=start,
        limit=limit,
        truncated=truncated,
        events=[
            XidEventOut(
                gpu_index=e.gpu_index, uuid=e.uuid, xid=e.xid, occurred_at=e.occurred_at, received_at=e.received_at
            )
            for e in events
        ],
    )


CapabilityStatus = Literal["all", "collecting", "stalled"]
CAPABILITY_STATUSES: tuple[CapabilityStatus, ...] = ("all", "collecting", "stalled")


def _capability_status(status: str, stalled: bool | None) -> bool | None:
    """``status`` (all, collecting, stalled) or the older ``stalled`` flag, as "stalled or not" (None: both)."""
    if status not in CAPABILITY_STATUSES:
        raise BadRequest(f"status must be one of {', '.join(CAPABILITY_STATUSES)}")
    if status != "all":
        if stalled is not None and stalled != (status == "stalled"):
            raise BadRequest("status and stalled contradict each other")
        return status == "stalled"
    return stalled


def _capability_sort(sort: str) -> CapabilitySort:
    for known in CAPABILITY_SORTS:
        if sort == known:
            return known
    raise BadRequest(f"sort must be one of {', '.join(CAPABILITY_SORTS)}")


def _capability_unknown(unknown: str | None) -> str | None:
    if unknown is None or unknown == "":
        return None
    if unknown == "any" or unknown in HEALTH_KEYS:
        return unknown
    raise BadRequest(f"unknown must be any or one of {', '.join(HEALTH_KEYS)}")


def _capability_query(
    ctx: ServerContext,
    principal: Principal,
    *,
    source: str,
    since: datetime | None,
    status: str,
    stalled: bool | None,
    node_id: str | None,
    q: str | None,
    sort: str,
    unknown: str | None,
    limit: int | None,
    offset: int,
) -> CapabilityQuery:
    now = ctx.clock.now()
    stall = timedelta(minutes=ctx.health_settings.stall_threshold_minutes)
    return CapabilityQuery(
        scope=NodeScope.of(principal),
        source=parse_source(source),
        since=_since(since, default=now - timedelta(days=ctx.health_settings.retention_days)),
        until=now + timedelta(seconds=ctx.health_settings.clock_skew_seconds),
        stalled_before=now - stall,
        stalled=_capability_status(status, stalled),
        node_id=node_id,
        q=q.strip() or None if q else None,
        sort=_capability_sort(sort),
        limit=limit,
        offset=offset,
        unknown=_capability_unknown(unknown),
        # every matching card is read (no page, no unknown filter): the counts come from them, not window sums
        count_unknowns=not (limit is None and offset == 0 and not unknown),
    )


StatusParam = Annotated[str, Query(description="all (default), collecting or stalled")]
StalledParam = Annotated[bool | None, Query(description="true: only cards whose collection stalled; false: none")]
NodeIdParam = Annotated[str | None, Query(min_length=1, max_length=64)]
CardSearch = Annotated[
    str | None, Query(min_length=1, max_length=128, description="part of the card's uuid or its node's name")
]
SortParam = Annotated[str, Query(description="node (default: node name, index), stalled_first or recent_first")]
UnknownParam = Annotated[
    str | None,
    Query(
        max_length=64,
        description="any: cards with at least one counter never known in the period; a counter's key "
        "(e.g. ecc_uncorrected_total): cards for which it was never known",
    ),
]


@router.get("/capabilities", response_model=CapabilitiesOut, summary="What each card can report")
async def capabilities(
    ctx: Ctx,
    principal: Reader,
    source: SourceParam = "real",
    since: UtcTime | None = None,
    status: StatusParam = "all",
    stalled: StalledParam = None,
    node_id: NodeIdParam = None,
    q: CardSearch = None,
    sort: SortParam = "node",
    unknown: UnknownParam = None,
    limit: Annotated[int | None, Query(description="1..1000; absent: every matching card")] = None,
    offset: int = 0,
) -> CapabilitiesOut:
    """One row per card (node, index, uuid) with samples in the period (default: the retention period).
    ``status`` (or ``stalled``), ``node_id``, ``q`` and ``unknown`` keep only the matching cards, ``sort`` orders
    them and ``limit``/``offset`` page them, all in SQL; ``total`` counts the matching cards (the footer note
    stays) and ``unknown_counts`` how many of them, ``unknown`` aside, never had each counter known."""
    if limit is not None and not 1 <= limit <= 1000:
        raise BadRequest("limit must be between 1 and 1000")
    if not 0 <= offset <= 10_000_000:
        raise BadRequest("offset must be between 0 and 10000000")
    query = _capability_query(
        ctx,
        principal,
        source=source,
        since=since,
        status=status,
        stalled=stalled,
        node_id=node_id,
        q=q,
        sort=sort,
        unknown=unknown,
        limit=limit,
        offset=offset,
    )
    page = await asyncio.to_thread(ctx.samples.capability_page, query)
    now = ctx.clock.now()
    stall = timedelta(minutes=ctx.health_settings.stall_threshold_minutes)
    monotonic = ctx.clock.monotonic()
    xid_reports = {card.node_id: ctx.xid_collection.get(card.node_id, now=monotonic) for card in page.cards}
    return CapabilitiesOut(
        source=parse_source(source),
        since=query.since,
        stall_threshold_minutes=ctx.health_settings.stall_threshold_minutes,
        note=CAPABILITIES_NOTE,
        total=page.total,
        offset=offset,
        limit=limit,
        sort=query.sort,
        unknown=query.unknown,
        unknown_counts=page.unknown_counts,
        cards=[
            _capability_out(
                card,
                now - card.last_sample_at > stall,
                xid_reports[card.node_id],
                ctx.worker.flood(Card(NodeId(card.node_id), card.gpu_index, card.uuid, parse_source(source))),
            )
            for card in page.cards
        ],
    )


EXPORT_LIMIT = 100_000
"""The most cards one CSV export holds (a fleet of 10,000 nodes of 8 cards)."""


@router.get(
    "/capabilities.csv",
    summary="The capability matrix as CSV, with the same filters",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}}},
)
async def capabilities_csv(
    ctx: Ctx,
    principal: Reader,
    source: SourceParam = "real",
    since: UtcTime | None = None,
    status: StatusParam = "all",
    stalled: StalledParam = None,
    node_id: NodeIdParam = None,
    q: CardSearch = None,
    sort: SortParam = "node",
    unknown: UnknownParam = None,
) -> Response:
    """Every card that matches (up to 100,000), one row each: node, index, uuid, each counter collectable or
    unknown, the first and last sample, the sample count, whether collection stalled. A cell that a spreadsheet
    would read as a formula is prefixed with '."""
    query = _capability_query(
        ctx,
        principal,
        source=source,
        since=since,
        status=status,
        stalled=stalled,
        node_id=node_id,
        q=q,
        sort=sort,
        unknown=unknown,
        limit=EXPORT_LIMIT,
        offset=0,
    )
    query = replace(query, count_unknowns=False)  # the export has no counts
    page = await asyncio.to_thread(ctx.samples.capability_page, query)
    now = ctx.clock.now()
    stall = timedelta(minutes=ctx.health_settings.stall_threshold_minutes)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(
        [
            "node_name",
            "node_id",
            "gpu_index",
            "uuid",
            *HEALTH_KEYS,
            "unknown_count",
            "first_sample_at",
            "last_sample_at",
            "sample_count",
            "collection_stalled",
        ]
    )
    for card in page.cards:
        writer.writerow(
            [
                _cell(card.node_name or ""),
                card.node_id,
                card.gpu_index,
                _cell(card.uuid or ""),
                *("collectable" if card.collectable[key] else "unknown" for key in HEALTH_KEYS),
                sum(not card.collectable[key] for key in HEALTH_KEYS),
                card.first_sample_at.isoformat(),
                card.last_sample_at.isoformat(),
                card.sample_count,
                "true" if now - card.last_sample_at > stall else "false",
            ]
        )
    name = f"heteroflow-capabilities-{query.source}" + (f"-unknown-{query.unknown}" if query.unknown else "") + ".csv"
    return Response(
        out.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            "X-Total-Count": str(page.total),
            "X-Truncated": "true" if page.total > len(page.cards) else "false",
        },
    )


def _cell(text: str) -> str:
    """A text cell a spreadsheet does not run as a formula (CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _capability_out(
    card: CardCapability, stalled: bool, xids: XidCollectionReport | None, flood: CardFlood | None
) -> CardCapabilityOut:
    xid_state, xid_reason = _card_xids(xids, card.gpu_index)
    return CardCapabilityOut(
        node_id=card.node_id,
        gpu_index=card.gpu_index,
        uuid=card.uuid,
        metrics={key: "collectable" if card.collectable[key] else "unknown" for key in HEALTH_KEYS},
        first_sample_at=card.first_sample_at,
        last_sample_at=card.last_sample_at,
        sample_count=card.sample_count,
        collection_stalled=stalled,
        trend_prediction_possible=card.collectable["ecc_corrected_total"],
        semantics_unconfirmed=list(card.semantics_unconfirmed),
        xid_events=xid_state,
        xid_events_reason=xid_reason,
        node_name=card.node_name,
        ce_flood=None
        if flood is None
        else CeFloodOut(
            evidence=evidence_out(f"weak signal [corrected_ecc_flood]: {flood.evidence}")[0],
            since=flood.since,
            evaluated_at=flood.at,
        ),
    )


def _card_xids(report: XidCollectionReport | None, gpu_index: int) -> tuple[CardXidState, str | None]:
    if report is None:
        return "unknown", "the agent has not reported its XID source recently"
    return report.card(gpu_index)
