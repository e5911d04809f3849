"""Alert routes: list and filter, one alert with its history, acknowledge (who, when, note), manual resolve
(who, when, why)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from heteroflow.health.alerts import AlertedCard
from heteroflow.health.text_codes import alert_text_code
from heteroflow.platform.auth import NodeScope, Principal, Scope
from heteroflow.platform_server.auth import context, require
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import Conflict, NotFound, error_responses
from heteroflow.platform_server.schemas import (
    AcknowledgeRequest,
    AlertCardOut,
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


def card_out(c: AlertedCard) -> AlertCardOut:
    return AlertCardOut(
        gpu_index=c.gpu_index,
        uuid=c.uuid,
        source="simulated" if c.source == "simulated" else "real",
        severity=c.severity,
        signals=list(c.signals),
        prediction_id=c.prediction_id,
        status=c.status,
        t0=c.t0,
        evidence=evidence_out(c.evidence),
    )


def alert_out(a: AlertRecord, cards: list[AlertedCard] | None = None) -> AlertOut:
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
        acknowledged_at=a.acknowledged_at,
        acknowledged_by=a.acknowledged_by,
        acknowledgement=a.acknowledgement,
        cards=[card_out(c) for c in cards or []],
    )


async def _cards(ctx: ServerContext, records: list[AlertRecord]) -> dict[str, list[AlertedCard]]:
    return await asyncio.to_thread(ctx.predictions.alert_cards, {a.id: a.node_id for a in records})


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
    severity: Annotated[Literal["WARN", "CRITICAL"] | None, Query(description="CRITICAL or WARN")] = None,
    acknowledged: Annotated[
        bool | None, Query(description="true: acknowledged by someone; false: nobody has acknowledged it")
    ] = None,
    node: Annotated[str | None, Query(max_length=253, description="Part of the node's name")] = None,
    gpu: Annotated[
        int | None, Query(ge=0, le=1_000_000, description="Alerts with a predicted card of this index")
    ] = None,
    q: Annotated[str | None, Query(max_length=128, description="Part of the node's name or of the message")] = None,
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
        severity=severity,
        acknowledged=acknowledged,
        node=(node or "").strip() or None,
        gpu_index=gpu,
        search=(q or "").strip() or None,
    )
    cards = await _cards(ctx, records)
    return AlertList(items=[alert_out(a, cards.get(a.id)) for a in records], total=total, limit=limit, offset=offset)


@router.get(
    "/{alert_id}", response_model=AlertDetail, summary="One alert and its history", responses=error_responses(404)
)
async def get_alert(
    alert_id: str, ctx: Ctx, principal: Annotated[Principal, Depends(require(Scope.NODES_READ))]
) -> AlertDetail:
    alert = await _visible(ctx, principal, alert_id)
    events = await asyncio.to_thread(ctx.alerts.events, alert.id)
    cards = await _cards(ctx, [alert])
    return AlertDetail(
        alert=alert_out(alert, cards.get(alert.id)),
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
    ctx.notifier.submit("resolved", after, cards=(await _cards(ctx, [after])).get(after.id, []))
    return await get_alert(alert_id, ctx, principal)


@router.post(
    "/{alert_id}/acknowledge",
    response_model=AlertDetail,
    summary="Acknowledge an alert: someone works on it",
    responses=error_responses(400, 404, 409, 413),
)
async def acknowledge_alert(
    alert_id: str,
    body: AcknowledgeRequest,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Scope.ALERTS_WRITE))],
) -> AlertDetail:
    """Who, when and the note go to the history; the alert stays open until it is resolved. Acknowledging again
    (a hand-over) adds to the history; a resolved alert cannot be acknowledged (409)."""
    alert = await _visible(ctx, principal, alert_id)
    done = await asyncio.to_thread(
        ctx.alerts.acknowledge, alert.id, by=principal.actor, note=body.note.strip(), now=ctx.clock.now()
    )
    if not done:
        raise Conflict(f"alert {alert_id!r} is resolved: nothing to acknowledge")
    after = await asyncio.to_thread(ctx.alerts.get, alert.id)
    assert after is not None
    ctx.notifier.submit("acknowledged", after, cards=(await _cards(ctx, [after])).get(after.id, []))
    return await get_alert(alert_id, ctx, principal)
