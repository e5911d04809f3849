"""SQL storage of alerts and their history (who did what, when, why)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId, TenantId
from heteroflow.health.alerts import AlertStatus, higher_severity
from heteroflow.platform.auth import NodeScope
from heteroflow.storage.db import unavailable_as_store_error
from heteroflow.storage.schema import alert_events, alerts
from heteroflow.storage.schema import predictions as predictions_t
from heteroflow.storage.scope import contains_text

ACKNOWLEDGED = "acknowledged"
"""The history action of an acknowledgement: someone works on the alert (it stays open until resolved)."""
CARD_ADDED = "card_added"
"""The history action of a later prediction on another card of the node joining the open alert."""
CARD_PREDICTED_AGAIN = "card_predicted_again"
"""The history action of a new prediction (a later window) on a card already in the open alert."""

SYSTEM = "system"


@dataclass(frozen=True, slots=True)
class AlertRecord:
    id: str
    type: str
    severity: str
    node_id: NodeId
    node_name: str
    tenant_id: TenantId | None
    status: AlertStatus
    message: str
    created_at: datetime
    resolved_at: datetime | None
    resolved_by: str | None
    resolution: str | None
    backlog_since: datetime | None
    acknowledged_at: datetime | None = None
    acknowledged_by: str | None = None
    acknowledgement: str | None = None
    """The newest acknowledgement's note (who works on it, what is planned); an alert may be acknowledged again."""


@dataclass(frozen=True, slots=True)
class AlertJoin:
    """A card joined an open alert: the alert after it, and its severity before (when the join raised it)."""

    alert: AlertRecord
    previous_severity: str | None


@dataclass(frozen=True, slots=True)
class AlertEvent:
    at: datetime
    actor: str
    action: str
    note: str


def _record(row: Any) -> AlertRecord:
    return AlertRecord(
        id=row.id,
        type=row.type,
        severity=row.severity,
        node_id=NodeId(row.node_id),
        node_name=row.node_name,
        tenant_id=TenantId(row.tenant_id) if row.tenant_id is not None else None,
        status=row.status,
        message=row.message,
        created_at=row.created_at,
        resolved_at=row.resolved_at,
        resolved_by=row.resolved_by,
        resolution=row.resolution,
        backlog_since=row.backlog_since,
    )


class SqlAlertStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def raise_alert(
        self,
        *,
        type: str,
        severity: str,
        node_id: NodeId,
        node_name: str,
        tenant_id: TenantId | None,
        message: str,
        now: datetime,
    ) -> tuple[AlertRecord, bool]:
        """Open an alert unless one of this type is already open on the node. Returns (alert, created)."""
        alert_id = str(uuid.uuid4())
        try:
            with unavailable_as_store_error(), self._engine.begin() as conn:
                conn.execute(
                    sa.insert(alerts).values(
                        id=alert_id,
                        type=type,
                        severity=severity,
                        node_id=node_id,
                        node_name=node_name,
                        tenant_id=tenant_id,
                        status="open",
                        message=message,
                        created_at=now,
                    )
                )
                conn.execute(
                    sa.insert(alert_events).values(
                        alert_id=alert_id, at=now, actor=SYSTEM, action="raised", note=message
                    )
                )
        except sa.exc.IntegrityError:
            existing = self.open_alert(node_id, type)
            if existing is None:  # resolved in between: try once more
                return self.raise_alert(
                    type=type,
                    severity=severity,
                    node_id=node_id,
                    node_name=node_name,
                    tenant_id=tenant_id,
                    message=message,
                    now=now,
                )
            return existing, False
        created = self.get(alert_id)
        assert created is not None
        return created, True

    def open_alert(self, node_id: NodeId, type: str) -> AlertRecord | None:
        query = sa.select(alerts).where(alerts.c.node_id == node_id, alerts.c.type == type, alerts.c.status == "open")
        with unavailable_as_store_error(), self._engine.connect() as conn:
            row = conn.execute(query).first()
        return _record(row) if row is not None else None

    def open_alerts(self, type: str) -> list[AlertRecord]:
        query = sa.select(alerts).where(alerts.c.type == type, alerts.c.status == "open")
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return [_record(row) for row in conn.execute(query)]

    def get(self, alert_id: str) -> AlertRecord | None:
        with unavailable_as_store_error(), self._engine.connect() as conn:
            row = conn.execute(sa.select(alerts).where(alerts.c.id == alert_id)).first()
            return _with_acknowledgements(conn, [_record(row)])[0] if row is not None else None

    def join(
        self, alert_id: str, *, severity: str, note: str, now: datetime, action: str = CARD_ADDED
    ) -> AlertJoin | None:
        """A later prediction on another card of the node joins the open alert: kept in its history, and the
        alert's severity rises to the card's when that is higher (never falls). None when it is not open."""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            row = conn.execute(sa.select(alerts).where(alerts.c.id == alert_id, alerts.c.status == "open")).first()
            if row is None:
                return None
            raised = higher_severity(row.severity, severity)
            previous: str | None = None
            if raised != row.severity:
                result = conn.execute(
                    sa.update(alerts)
                    .where(alerts.c.id == alert_id, alerts.c.status == "open", alerts.c.severity == row.severity)
                    .values(severity=raised)
                )
                previous = row.severity if result.rowcount else None
            conn.execute(
                sa.insert(alert_events).values(alert_id=alert_id, at=now, actor=SYSTEM, action=action, note=note)
            )
        after = self.get(alert_id)
        return AlertJoin(alert=after, previous_severity=previous) if after is not None else None

    def acknowledge(self, alert_id: str, *, by: str, note: str, now: datetime) -> bool:
        """Someone works on an open alert: who, when and the note go to its history; it stays open until resolved.

        An acknowledged alert may be acknowledged again (a hand-over); a resolved one may not (False)."""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            is_open = conn.execute(
                sa.select(alerts.c.id).where(alerts.c.id == alert_id, alerts.c.status == "open").with_for_update()
            ).first()
            if is_open is None:
                return False
            conn.execute(
                sa.insert(alert_events).values(alert_id=alert_id, at=now, actor=by, action=ACKNOWLEDGED, note=note)
            )
        return True

    def events(self, alert_id: str) -> list[AlertEvent]:
        query = (
            sa.select(alert_events)
            .where(alert_events.c.alert_id == alert_id)
            .order_by(alert_events.c.at, alert_events.c.id)
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return [AlertEvent(at=r.at, actor=r.actor, action=r.action, note=r.note) for r in conn.execute(query)]

    def resolve(self, alert_id: str, *, by: str, reason: str, now: datetime) -> bool:
        """Resolve an open alert (compare-and-set on ``status='open'``) and keep who, when and why."""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            result = conn.execute(
                sa.update(alerts)
                .where(alerts.c.id == alert_id, alerts.c.status == "open")
                .values(status="resolved", resolved_at=now, resolved_by=by, resolution=reason)
            )
            if not result.rowcount:
                return False
            conn.execute(
                sa.insert(alert_events).values(alert_id=alert_id, at=now, actor=by, action="resolved", note=reason)
            )
        return True

    def flag_backlog(self, *, older_than: datetime, now: datetime) -> list[AlertRecord]:
        """Flag open alerts created before ``older_than`` as operations backlog (once each)."""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            flagged = conn.execute(
                sa.update(alerts)
                .where(alerts.c.status == "open", alerts.c.backlog_since.is_(None), alerts.c.created_at <= older_than)
                .values(backlog_since=now)
                .returning(alerts.c.id)
            ).all()
            for (alert_id,) in flagged:
                conn.execute(
                    sa.insert(alert_events).values(
                        alert_id=alert_id,
                        at=now,
                        actor=SYSTEM,
                        action="backlog",
                        note="open for too long: operations backlog",
                    )
                )
        return [record for (alert_id,) in flagged if (record := self.get(alert_id)) is not None]

    def sweep_node(self, node_id: NodeId, *, now: datetime) -> int:
        """Resolve every open alert of a deleted node (the orphan sweep)."""
        with unavailable_as_store_error(), self._engine.connect() as conn:
            ids = list(
                conn.scalars(sa.select(alerts.c.id).where(alerts.c.node_id == node_id, alerts.c.status == "open"))
            )
        return sum(self.resolve(alert_id, by=SYSTEM, reason="node deleted", now=now) for alert_id in ids)

    def list(
        self,
        *,
        scope: NodeScope,
        status: AlertStatus | None,
        type: str | None,
        node_id: str | None,
        limit: int,
        offset: int,
        severity: str | None = None,
        acknowledged: bool | None = None,
        node: str | None = None,
        gpu_index: int | None = None,
        search: str | None = None,
    ) -> tuple[list[AlertRecord], int]:
        """Alerts, newest first. ``node``: part of the node's name; ``gpu_index``: alerts one of whose
        predictions is on that card; ``acknowledged``: whether anyone acknowledged it; ``search``: part of the node's
        name or of the message (all case-insensitive)."""
        conditions: list[sa.ColumnElement[bool]] = []
        if scope.tenant_id is not None:
            conditions.append(alerts.c.tenant_id == scope.tenant_id)
        if status is not None:
            conditions.append(alerts.c.status == status)
        if type is not None:
            conditions.append(alerts.c.type == type)
        if node_id is not None:
            conditions.append(alerts.c.node_id == node_id)
        if severity is not None:
            conditions.append(alerts.c.severity == severity)
        if acknowledged is not None:
            acked = sa.exists().where(alert_events.c.alert_id == alerts.c.id, alert_events.c.action == ACKNOWLEDGED)
            conditions.append(acked if acknowledged else ~acked)
        if node:
            conditions.append(contains_text(alerts.c.node_name, node))
        if gpu_index is not None:
            conditions.append(
                sa.exists().where(
                    predictions_t.c.alert_id == alerts.c.id,
                    predictions_t.c.node_id == alerts.c.node_id,
                    predictions_t.c.gpu_index == gpu_index,
                )
            )
        if search:
            conditions.append(
                sa.or_(contains_text(alerts.c.node_name, search), contains_text(alerts.c.message, search))
            )
        query = (
            sa.select(alerts)
            .where(*conditions)
            .order_by(alerts.c.created_at.desc(), alerts.c.id)
            .limit(limit)
            .offset(offset)
        )
        count = sa.select(sa.func.count()).select_from(alerts).where(*conditions)
        with unavailable_as_store_error(), self._engine.connect() as conn:
            rows = _with_acknowledgements(conn, [_record(row) for row in conn.execute(query)])
            total = int(conn.execute(count).scalar_one())
        return rows, total


def _with_acknowledgements(conn: sa.Connection, records: Sequence[AlertRecord]) -> list[AlertRecord]:
    """The records with their newest acknowledgement (one query for all of them)."""
    if not records:
        return []
    query = (
        sa.select(alert_events.c.alert_id, alert_events.c.at, alert_events.c.actor, alert_events.c.note)
        .where(alert_events.c.alert_id.in_([r.id for r in records]), alert_events.c.action == ACKNOWLEDGED)
        .order_by(alert_events.c.at, alert_events.c.id)
    )
    newest = {row.alert_id: row for row in conn.execute(query)}
    return [
        replace(r, acknowledged_at=ack.at, acknowledged_by=ack.actor, acknowledgement=ack.note)
        if (ack := newest.get(r.id)) is not None
        else r
        for r in records
    ]
