"""SQL storage of the per-minute GPU metrics: one batched write per flush, range reads, retention."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId, Source
from heteroflow.health.gpu_metrics import METRIC_KEYS, Aggregate, MinuteRow
from heteroflow.health.samples import CardKey
from heteroflow.storage.db import insert_rows, unavailable_as_store_error
from heteroflow.storage.schema import gpu_metrics_minutes as minutes_t
from heteroflow.storage.schema import nodes as nodes_t


def _values(row: MinuteRow) -> dict[str, Any]:
    values: dict[str, Any] = {
        "node_id": row.key.node_id,
        "gpu_index": row.key.gpu_index,
        "source": row.key.source,
        "uuid": row.uuid,
        "minute": row.minute,
        "samples": row.samples,
    }
    for name in METRIC_KEYS:
        agg = row.values.get(name)
        values[f"{name}_min"] = agg.min if agg else None
        values[f"{name}_avg"] = agg.avg if agg else None
        values[f"{name}_max"] = agg.max if agg else None
        values[f"{name}_n"] = agg.count if agg else None
    return values


def _row(row: Any) -> MinuteRow:
    values: dict[str, Aggregate | None] = {}
    for name in METRIC_KEYS:
        count = getattr(row, f"{name}_n")
        values[name] = (
            Aggregate(
                min=getattr(row, f"{name}_min"),
                avg=getattr(row, f"{name}_avg"),
                max=getattr(row, f"{name}_max"),
                count=count,
            )
            if count
            else None
        )
    return MinuteRow(
        key=CardKey(node_id=NodeId(row.node_id), gpu_index=row.gpu_index, source=row.source),
        uuid=row.uuid,
        minute=row.minute,
        samples=row.samples,
        values=values,
    )


class SqlGpuMetricsStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def insert(self, rows: Sequence[MinuteRow]) -> int:
        """Insert closed minutes in one transaction (one JSON parameter on PostgreSQL, else one executemany:
        :func:`~heteroflow.storage.db.insert_rows`). Rows of deleted nodes are skipped."""
        if not rows:
            return 0
        with unavailable_as_store_error(), self._engine.begin() as conn:
            node_ids = {row.key.node_id for row in rows}
            live = set(conn.scalars(sa.select(nodes_t.c.id).where(nodes_t.c.id.in_(node_ids))))
            kept = [_values(row) for row in rows if row.key.node_id in live]
            insert_rows(conn, minutes_t, kept)  # a fleet's minute is 24,000 rows
        return len(kept)

    def read(
        self, *, node_id: NodeId, gpu_index: int | None, source: Source, since: datetime, until: datetime
    ) -> list[MinuteRow]:
        """Minute rows of a node (or one card) with ``since <= minute < until``, by card then time."""
        conditions = [
            minutes_t.c.node_id == node_id,
            minutes_t.c.source == source,
            minutes_t.c.minute >= since,
            minutes_t.c.minute < until,
        ]
        if gpu_index is not None:
            conditions.append(minutes_t.c.gpu_index == gpu_index)
        query = sa.select(minutes_t).where(*conditions).order_by(minutes_t.c.gpu_index, minutes_t.c.minute)
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return [_row(row) for row in conn.execute(query)]

    def delete_older_than(self, cutoff: datetime, *, timeout_sec: float) -> int:
        with unavailable_as_store_error(), self._engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text(f"SET LOCAL statement_timeout = {int(timeout_sec * 1000)}"))
            result = conn.execute(sa.delete(minutes_t).where(minutes_t.c.minute < cutoff))
            return int(result.rowcount or 0)
