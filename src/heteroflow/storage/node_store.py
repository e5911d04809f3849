"""SQL storage of nodes: registration, listing, deletion and the batched liveness flush."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId, Source, TenantId
from heteroflow.platform.auth import NodeScope
from heteroflow.platform.nodes import NodeConflictError, NodeRecord
from heteroflow.storage.db import unavailable_as_store_error
from heteroflow.storage.schema import nodes as nodes_t


def _record(row: Any) -> NodeRecord:
    return NodeRecord(
        id=NodeId(row.id),
        name=row.name,
        vendor=row.vendor,
        model=row.model,
        gpu_count=row.gpu_count,
        source=row.source,
        tenant_id=TenantId(row.tenant_id) if row.tenant_id is not None else None,
        registered_at=row.registered_at,
        last_heartbeat_at=row.last_heartbeat_at,
    )


class SqlNodeStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def register(
        self,
        *,
        name: str,
        vendor: str,
        model: str,
        gpu_count: int,
        source: Source,
        tenant_id: TenantId | None,
        now: datetime,
    ) -> tuple[NodeRecord, bool]:
        """Register a node by hostname; the same hostname again updates it. Returns (node, created)."""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            row = conn.execute(sa.select(nodes_t).where(nodes_t.c.name == name)).first()
            if row is not None:
                if row.tenant_id != tenant_id:
                    raise NodeConflictError(f"hostname {name!r} is registered in another scope")
                if row.source != source:
                    raise NodeConflictError(
                        f"hostname {name!r} is registered as {row.source}; a node never switches source"
                    )
                conn.execute(
                    sa.update(nodes_t)
                    .where(nodes_t.c.id == row.id)
                    .values(vendor=vendor, model=model, gpu_count=gpu_count)
                )
                updated = conn.execute(sa.select(nodes_t).where(nodes_t.c.id == row.id)).one()
                return _record(updated), False
            node_id = str(uuid.uuid4())
            conn.execute(
                sa.insert(nodes_t).values(
                    id=node_id,
                    name=name,
                    vendor=vendor,
                    model=model,
                    gpu_count=gpu_count,
                    source=source,
                    tenant_id=tenant_id,
                    registered_at=now,
                    last_heartbeat_at=None,
                )
            )
            created = conn.execute(sa.select(nodes_t).where(nodes_t.c.id == node_id)).one()
            return _record(created), True

    def get(self, node_id: NodeId) -> NodeRecord | None:
        with unavailable_as_store_error(), self._engine.connect() as conn:
            row = conn.execute(sa.select(nodes_t).where(nodes_t.c.id == node_id)).first()
        return _record(row) if row is not None else None

    def names(self, node_ids: Iterable[NodeId]) -> dict[NodeId, str]:
        """The names of these nodes (one statement); an id that no longer exists is left out."""
        wanted = sorted(set(node_ids))
        if not wanted:
            return {}
        query = sa.select(nodes_t.c.id, nodes_t.c.name).where(nodes_t.c.id.in_(wanted))
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return {NodeId(row.id): str(row.name) for row in conn.execute(query)}

    def list(self, *, scope: NodeScope, limit: int, offset: int) -> tuple[list[NodeRecord], int]:
        query = sa.select(nodes_t)
        count = sa.select(sa.func.count()).select_from(nodes_t)
        if scope.tenant_id is not None:
            query = query.where(nodes_t.c.tenant_id == scope.tenant_id)
            count = count.where(nodes_t.c.tenant_id == scope.tenant_id)
        query = query.order_by(nodes_t.c.name, nodes_t.c.id).limit(limit).offset(offset)
        with unavailable_as_store_error(), self._engine.connect() as conn:
            rows = conn.execute(query).all()
            total = int(conn.execute(count).scalar_one())
        return [_record(row) for row in rows], total

    def delete(self, node_id: NodeId) -> bool:
        """Delete a node with its samples and events (cascade); False if it did not exist."""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            result = conn.execute(sa.delete(nodes_t).where(nodes_t.c.id == node_id))
        return bool(result.rowcount)

    def record_heartbeats(self, beats: dict[NodeId, datetime]) -> set[NodeId]:
        """One UPDATE for every node: raise last_heartbeat_at, never lower it (several servers write).

        Returns the ids of the nodes that exist.
        """
        if not beats:
            return set()
        payload = json.dumps(
            [
                {"id": node_id, "ts": at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")}
                for node_id, at in beats.items()
            ]
        )
        with unavailable_as_store_error(), self._engine.begin() as conn:
            result = conn.execute(_LIVENESS_SQL[conn.dialect.name], {"beats": payload})
            return {NodeId(row[0]) for row in result}


# Newest times arrive as one JSON parameter: a single statement whatever the number of nodes, and no
# bind-parameter limit to chunk around. Times are naive UTC, as the column stores them. Every existing
# node is updated (to the newer of both times) so that RETURNING names exactly the nodes that exist.
_LIVENESS_SQL = {
    "postgresql": sa.text(
        "UPDATE nodes SET last_heartbeat_at = CASE "
        "  WHEN nodes.last_heartbeat_at IS NULL OR nodes.last_heartbeat_at < b.ts THEN b.ts "
        "  ELSE nodes.last_heartbeat_at END "
        "FROM json_to_recordset(CAST(:beats AS json)) AS b(id text, ts timestamp) "
        "WHERE nodes.id = b.id RETURNING nodes.id"
    ),
    "sqlite": sa.text(
        "UPDATE nodes SET last_heartbeat_at = CASE "
        "  WHEN nodes.last_heartbeat_at IS NULL OR nodes.last_heartbeat_at < b.ts THEN b.ts "
        "  ELSE nodes.last_heartbeat_at END "
        "FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.ts') AS ts "
        "      FROM json_each(:beats)) AS b "
        "WHERE nodes.id = b.id RETURNING nodes.id"
    ),
}
