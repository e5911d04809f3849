"""Alert routes: list, one alert with its history, manual resolve (who, when, why)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from heteroflow.health.text_codes import alert_text_code
from heteroflow.platform.auth import NodeScope, Principal, Scope
from heteroflow.platform_server.auth import context, require
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import Conflict, NotFound, error_responses
from heteroflow.platform_server.schemas import (
    AlertDetail,
    AlertEventOut,
    AlertList,
    AlertOut,
    EvidenceLineOut,
    ResolveRequest,
    coded_text,
    evidence_out,
)
from heteroflow.storage.alert_store import AlertEvent, AlertRecord

router = APIRouter(prefix="/api/v1/alerts", tags=["alerts"], responses=error_responses(403))

Ctx = Annotated[ServerContext, Depends(context)]


def alert_out(a: AlertRecord) -> AlertOut:
    return AlertOut(
        id=a.id,
        type=a.type,
        severity=a.severity,
        node_id=a.node_id,
        node_name=a.node_name,
        status=a.status,
        message=a.message,
        created_at=a.created_at,
        resolved_at=a.resolved_at,
        resolved_by=a.resolved_by,
        resolution=a.resolution,
        backlog=a.backlog_since is not None,
        backlog_since=a.backlog_since,
        message_code=coded_text(a.message, alert_text_code),
        message_evidence=_quoted_evidence(a.message),
        resolution_code=coded_text(a.resolution, alert_text_code),
    )


def _quoted_evidence(text: str) -> list[EvidenceLineOut]:
    coded = alert_text_code(text)
    return evidence_out(coded.params.get("evidence")) if coded is not None else []


def event_out(e: AlertEvent) -> AlertEventOut:
    return AlertEventOut(
        at=e.at,
        actor=e.actor,
        action=e.action,
        note=e.note,
        note_code=coded_text(e.note, alert_text_code),
        note_evidence=_quoted_evidence(e.note),
    )


async def _visible(ctx: ServerContext, principal: Principal, alert_id: str) -> AlertRecord:
    alert = await asyncio.to_thread(ctx.alerts.get, alert_id)
    if alert is None or not principal.sees_node(alert.tenant_id):
        raise NotFound(f"alert {alert_id!r} not found")
    return alert


@router.get("", response_model=AlertList, summary="Alerts in the caller's scope")
async def list_alerts(
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Scope.NODES_READ))],
    status: Literal["open", "resolved"] | None = None,
    type: Annotated[str | None, Query(max_length=64)] = None,
    node_id: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> AlertList:
    records, total = await asyncio.to_thread(
        ctx.alerts.list,
        scope=NodeScope.of(principal),
        status=status,
        type=type,
        node_id=node_id,
        limit=limit,
        offset=offset,
    )
    return AlertList(items=[alert_out(a) for a in records], total=total, limit=limit, offset=offset)


@router.get(
    "/{alert_id}", response_model=AlertDetail, summary="One alert and its history", responses=error_responses(404)
)
async def get_alert(
    alert_id: str, ctx: Ctx, principal: Annotated[Principal, Depends(require(Scope.NODES_READ))]
) -> AlertDetail:
    alert = await _visible(ctx, principal, alert_id)
    events = await asyncio.to_thread(ctx.alerts.events, alert.id)
    return AlertDetail(
        alert=alert_out(alert),
        history=[event_out(e) for e in events],
    )


@router.post(
    "/{alert_id}/resolve",
    response_model=AlertDetail,
    summary="Resolve an alert by hand",
    responses=error_responses(400, 404, 409, 413),
)
async def resolve_alert(
    alert_id: str,
    body: ResolveRequest,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Scope.ALERTS_WRITE))],
) -> AlertDetail:
    """The only way, with the node's deletion, to close an alert after a hit or while a judgement is voided."""
    alert = await _visible(ctx, principal, alert_id)
    resolved = await asyncio.to_thread(
        ctx.alerts.resolve, alert.id, by=principal.actor, reason=body.reason, now=ctx.clock.now()
    )
    if not resolved:
        raise Conflict(f"alert {alert_id!r} is already resolved")
    after = await asyncio.to_thread(ctx.alerts.get, alert.id)
    assert after is not None
    ctx.notifier.submit("resolved", after)
    return await get_alert(alert_id, ctx, principal)
