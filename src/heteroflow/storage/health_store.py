"""SQL storage of GPU health samples and XID events: the ingestion write side and the read queries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from heteroflow.core.ids import NodeId, Source
from heteroflow.health.counters import HEALTH_KEYS, Counters
from heteroflow.health.heartbeat import ParsedXid
from heteroflow.health.samples import CardKey, HealthReading, StoredSample
from heteroflow.platform.auth import NodeScope
from heteroflow.storage.db import unavailable_as_store_error
from heteroflow.storage.schema import gpu_health_samples as samples_t
from heteroflow.storage.schema import gpu_xid_events as xid_t
from heteroflow.storage.schema import nodes as nodes_t


@dataclass(frozen=True, slots=True)
class CardCapability:
    """What one card (node, index, uuid, source) reported in a period (H-4, capability matrix)."""

    node_id: NodeId
    gpu_index: int
    uuid: str | None
    collectable: dict[str, bool]
    first_sample_at: datetime
    last_sample_at: datetime
    sample_count: int


def _row_to_sample(row: Any) -> StoredSample:
    return StoredSample(
        key=CardKey(node_id=NodeId(row.node_id), gpu_index=row.gpu_index, source=row.source),
        uuid=row.uuid,
        sampled_at=row.sampled_at,
        counters=Counters(**{name: getattr(row, name) for name in HEALTH_KEYS}),
    )


def _latest(conn: Connection, key: CardKey) -> StoredSample | None:
    query = (
        sa.select(samples_t)
        .where(
            samples_t.c.node_id == key.node_id,
            samples_t.c.gpu_index == key.gpu_index,
            samples_t.c.source == key.source,
        )
        .order_by(samples_t.c.sampled_at.desc(), samples_t.c.id.desc())
        .limit(1)
    )
    row = conn.execute(query).first()
    return _row_to_sample(row) if row is not None else None


def in_scope(column: sa.ColumnElement[str], scope: NodeScope) -> list[sa.ColumnElement[bool]]:
    """The condition that keeps ``column`` (a node id) inside a tenant's nodes; nothing for an unscoped caller.

    No condition at all rather than ``IN (all nodes)``: the extra term costs nothing in meaning but can turn a
    planner away from the best index.
    """
    if scope.tenant_id is None:
        return []
    return [column.in_(sa.select(nodes_t.c.id).where(nodes_t.c.tenant_id == scope.tenant_id))]


class SqlHealthSampleStore:
    """Implements :class:`heteroflow.health.store.HealthSampleStore` and the read side of the API."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # -- write side ---------------------------------------------------------------------------------------

    def latest(self, key: CardKey) -> StoredSample | None:
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return _latest(conn, key)

    def insert(
        self, readings: Sequence[HealthReading], *, previous: Mapping[CardKey, StoredSample | None] | None = None
    ) -> list[StoredSample]:
        """Insert in one transaction; each row records whether it differs from its slot's previous row.

        ``previous`` is the newest stored row of each slot before this batch, when the caller knows it (the
        ingestion writer always does); otherwise it is read, once per slot. Rows that repeat their
        predecessor (keepalive rows) carry ``changed = false``: the failure scan and the capability matrix
        read only the changed rows, a small fraction of the table, and lose nothing by it.
        """
        if not readings:
            return []
        node_ids = {r.key.node_id for r in readings}
        with unavailable_as_store_error(), self._engine.begin() as conn:
            # a node deleted meanwhile (perhaps through another server) loses its readings, not the batch
            existing = set(conn.scalars(sa.select(nodes_t.c.id).where(nodes_t.c.id.in_(node_ids))))
            chain: dict[CardKey, tuple[str | None, Counters] | None] = {}
            rows = []
            for r in readings:
                if r.key.node_id not in existing:
                    continue
                if r.key not in chain:
                    before = previous[r.key] if previous is not None and r.key in previous else _latest(conn, r.key)
                    chain[r.key] = (before.uuid, before.counters) if before is not None else None
                changed = chain[r.key] != (r.uuid, r.counters)
                chain[r.key] = (r.uuid, r.counters)
                rows.append(
                    {
                        "node_id": r.key.node_id,
                        "gpu_index": r.key.gpu_index,
                        "source": r.key.source,
                        "uuid": r.uuid,
                        "sampled_at": r.sampled_at,
                        "changed": changed,
                        **r.counters.as_dict(),
                    }
                )
            if not rows:
                return []
            result = conn.execute(sa.insert(samples_t).returning(*samples_t.c), rows)
            return [_row_to_sample(row) for row in result]

    def delete_older_than(self, cutoff: datetime, *, timeout_seconds: float) -> int:
        with unavailable_as_store_error(), self._engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text(f"SET LOCAL statement_timeout = {int(timeout_seconds * 1000)}"))
            result = conn.execute(sa.delete(samples_t).where(samples_t.c.sampled_at < cutoff))
            return int(result.rowcount or 0)

    # -- XID events -----------------------------------------------------------------------------------------

    def insert_xid_events(
        self, events: Sequence[ParsedXid], *, node_id: NodeId, source: Source, received_at: datetime
    ) -> int:
        """Store events once each (re-sent events are ignored); return how many were new."""
        if not events:
            return 0
        rows = [
            {
                "node_id": node_id,
                "gpu_index": e.gpu_index,
                "uuid": e.uuid,
                "xid": e.xid,
                "occurred_at": e.occurred_at,
                "source": source,
                "received_at": received_at,
            }
            for e in events
        ]
        with unavailable_as_store_error(), self._engine.begin() as conn:
            insert: Any = postgresql.insert(xid_t) if conn.dialect.name == "postgresql" else sqlite.insert(xid_t)
            # rowcount is not reliable for a multi-row insert; count what RETURNING gives back
            result = conn.execute(insert.on_conflict_do_nothing().returning(xid_t.c.id), rows)
            return len(result.all())

    # -- read side ------------------------------------------------------------------------------------------

    def card_samples(
        self, *, node_id: NodeId, gpu_index: int, source: Source, since: datetime, limit: int
    ) -> tuple[list[StoredSample], bool]:
        """One card slot's samples since ``since``, ascending; the newest ``limit`` kept when truncated."""
        query = (
            sa.select(samples_t)
            .where(
                samples_t.c.node_id == node_id,
                samples_t.c.gpu_index == gpu_index,
                samples_t.c.source == source,
                samples_t.c.sampled_at >= since,
            )
            .order_by(samples_t.c.sampled_at.desc(), samples_t.c.id.desc())
            .limit(limit + 1)
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            rows = conn.execute(query).all()
        truncated = len(rows) > limit
        return [_row_to_sample(row) for row in reversed(rows[:limit])], truncated

    def capabilities(self, *, scope: NodeScope, source: Source, since: datetime) -> list[CardCapability]:
        """Per card, which counters had a non-NULL value in the period, computed in SQL."""
        columns = [sa.func.count(samples_t.c[name]).label(name) for name in HEALTH_KEYS]
        query = (
            sa.select(
                samples_t.c.node_id,
                samples_t.c.gpu_index,
                samples_t.c.uuid,
                sa.func.min(samples_t.c.sampled_at).label("first_sample_at"),
                sa.func.max(samples_t.c.sampled_at).label("last_sample_at"),
                sa.func.count().label("sample_count"),
                *columns,
            )
            .where(
                samples_t.c.source == source,
                samples_t.c.sampled_at >= since,
                *in_scope(samples_t.c.node_id, scope),
            )
            .group_by(samples_t.c.node_id, samples_t.c.gpu_index, samples_t.c.uuid)
            .order_by(samples_t.c.node_id, samples_t.c.gpu_index, sa.func.max(samples_t.c.sampled_at))
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            rows = conn.execute(query).all()
        return [
            CardCapability(
                node_id=NodeId(row.node_id),
                gpu_index=row.gpu_index,
                uuid=row.uuid,
                collectable={name: getattr(row, name) > 0 for name in HEALTH_KEYS},
                first_sample_at=row.first_sample_at,
                last_sample_at=row.last_sample_at,
                sample_count=row.sample_count,
            )
            for row in rows
        ]


def purge_simulated(engine: Engine) -> dict[str, int]:
    """Delete every simulated row — predictions, samples, XID events, simulated nodes — and nothing real."""
    from heteroflow.storage.schema import predictions

    deleted: dict[str, int] = {}
    with unavailable_as_store_error(), engine.begin() as conn:
        for name, table in (
            ("predictions", predictions),
            ("samples", samples_t),
            ("xid_events", xid_t),
            ("nodes", nodes_t),
        ):
            deleted[name] = int(conn.execute(sa.delete(table).where(table.c.source == "simulated")).rowcount or 0)
    return deleted
