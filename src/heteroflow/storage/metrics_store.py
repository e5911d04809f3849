"""SQL storage of the per-minute GPU metrics: batched writes of plain-value rows, range reads, retention."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId, Source
from heteroflow.health.gpu_metrics import METRIC_KEYS, Aggregate, FlatRow, MinuteRow, flat_of
from heteroflow.health.samples import CardKey
from heteroflow.storage.db import insert_rows, unavailable_as_store_error
from heteroflow.storage.schema import EXISTING_NODE_IDS
from heteroflow.storage.schema import gpu_metrics_minutes as minutes_t

_COLUMNS: Final = (
    "node_id",
    "gpu_index",
    "source",
    "uuid",
    "minute",
    "samples",
    *(f"{name}_{part}" for name in METRIC_KEYS for part in ("min", "avg", "max", "n")),
)
"""The table's columns in :data:`~heteroflow.health.gpu_metrics.FlatRow` order."""


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
        """Insert closed minutes in one transaction (:meth:`insert_flat`). Rows of deleted nodes are skipped."""
        return self.insert_flat([flat_of(row) for row in rows])

    def insert_flat(self, rows: Sequence[FlatRow]) -> int:
        """Insert closed minutes given as plain values in one transaction (one JSON parameter on PostgreSQL,
        else one executemany: :func:`~heteroflow.storage.db.insert_rows`). Rows of deleted nodes are skipped."""
        if not rows:
            return 0
        with unavailable_as_store_error(), self._engine.begin() as conn:
            node_ids = {row[0] for row in rows}
            live = set(conn.scalars(EXISTING_NODE_IDS, {"ids": list(node_ids)}))
            kept = [dict(zip(_COLUMNS, row, strict=True)) for row in rows if row[0] in live]
            insert_rows(conn, minutes_t, kept)
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
