"""SQL storage of nodes: registration, listing, deletion and the batched liveness flush."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId, Source, TenantId, TokenId
from heteroflow.platform.auth import NodeScope
from heteroflow.platform.nodes import NodeConflictError, NodeCredentialError, NodeQuotaError, NodeRecord, Quota
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
        credential_hash=row.credential_hash,
        registered_by=TokenId(row.registered_by) if row.registered_by is not None else None,
        credential_issued_at=row.credential_issued_at,
        credential_released_at=row.credential_released_at,
    )


@dataclass(frozen=True, slots=True)
class RegisterResult:
    node: NodeRecord
    created: bool
    issued: bool
    """Whether the node's credential was (re)issued by this registration: the caller shows it once."""


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
        token_id: TokenId | None = None,
        presented_hash: str | None = None,
        new_credential_hash: str | None = None,
        reissue: bool = False,
        quota: Quota | None = None,
    ) -> RegisterResult:
        """Register a node by hostname within its tenant; the same hostname again updates it.

        A new node is created with ``new_credential_hash``. An existing one is updated only when the request
        carries its credential (``presented_hash``), when it has none (registered before credentials existed, or
        released by an operator: claimed now by the token that created it), or when ``reissue`` (an
        administrator rotates it); otherwise :class:`NodeCredentialError` — however long the node has been
        silent, since silence can be provoked. ``quota`` bounds what ``token_id`` may create
        (:class:`NodeQuotaError`).
        """
        tenant_key = tenant_id or ""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            row = conn.execute(
                sa.select(nodes_t).where(nodes_t.c.tenant_key == tenant_key, nodes_t.c.name == name)
            ).first()
            if row is not None:
                if row.source != source:
                    raise NodeConflictError(
                        f"hostname {name!r} is registered as {row.source}; a node never switches source"
                    )
                creator = token_id is not None and row.registered_by == token_id
                # no credential: registered before credentials existed (anyone of the tenant claims it), or
                # released by an operator (only the token that created it does)
                unclaimed = row.credential_hash is None and (row.registered_by is None or creator)
                issue = reissue or unclaimed
                if not issue and (presented_hash is None or presented_hash != row.credential_hash):
                    raise NodeCredentialError(
                        f"hostname {name!r} is registered: re-registering it needs its node credential "
                        "(an operator may release the node's credential, or delete the node to register it "
                        "afresh)"
                    )
                if quota is not None and row.registered_by is not None:
                    self._check_cards(conn, row.registered_by, quota, extra=gpu_count - row.gpu_count)
                values: dict[str, Any] = {"vendor": vendor, "model": model, "gpu_count": gpu_count}
                if issue and new_credential_hash is not None:
                    values["credential_hash"] = new_credential_hash
                    values["credential_issued_at"] = now
                conn.execute(sa.update(nodes_t).where(nodes_t.c.id == row.id).values(**values))
                updated = conn.execute(sa.select(nodes_t).where(nodes_t.c.id == row.id)).one()
                return RegisterResult(_record(updated), created=False, issued=issue and new_credential_hash is not None)
            if quota is not None and token_id is not None:
                created_by = int(
                    conn.execute(
                        sa.select(sa.func.count()).select_from(nodes_t).where(nodes_t.c.registered_by == token_id)
                    ).scalar_one()
                )
                if created_by >= quota.max_nodes:
                    raise NodeQuotaError(f"this token has registered its quota of {quota.max_nodes} nodes")
                self._check_cards(conn, token_id, quota, extra=gpu_count)
            node_id = str(uuid.uuid4())
            try:
                conn.execute(
                    sa.insert(nodes_t).values(
                        id=node_id,
                        name=name,
                        vendor=vendor,
                        model=model,
                        gpu_count=gpu_count,
                        source=source,
                        tenant_id=tenant_id,
                        tenant_key=tenant_key,
                        registered_at=now,
                        last_heartbeat_at=None,
                        credential_hash=new_credential_hash,
                        registered_by=token_id,
                        credential_issued_at=now if new_credential_hash is not None else None,
                    )
                )
            except sa.exc.IntegrityError as exc:  # registered by a concurrent request a moment ago
                raise NodeCredentialError(f"hostname {name!r} was registered meanwhile; register again") from exc
            created = conn.execute(sa.select(nodes_t).where(nodes_t.c.id == node_id)).one()
            return RegisterResult(_record(created), created=True, issued=new_credential_hash is not None)

    @staticmethod
    def _check_cards(conn: sa.Connection, token_id: str, quota: Quota, *, extra: int) -> None:
        if extra <= 0:
            return
        cards = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(nodes_t.c.gpu_count), 0)).where(nodes_t.c.registered_by == token_id)
        ).scalar_one()
        if int(cards) + extra > quota.max_cards:
            raise NodeQuotaError(f"this token's nodes would have more than its quota of {quota.max_cards} cards")

    def release_credential(self, node_id: NodeId, *, now: datetime) -> NodeRecord | None:
        """Drop the node's credential (an operator's decision, recorded at ``now``): no one speaks for it until
        the token that created it registers it again and claims a new one (an agent that lost its credential).
        ``None`` when the node does not exist."""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            conn.execute(
                sa.update(nodes_t)
                .where(nodes_t.c.id == node_id)
                .values(credential_hash=None, credential_released_at=now)
            )
            row = conn.execute(sa.select(nodes_t).where(nodes_t.c.id == node_id)).first()
        return _record(row) if row is not None else None

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
        # encoded a thousand nodes at a time: the encoder runs in C without letting go of the interpreter, and a
        # fleet's list at once (10,000 nodes) held the event loop's thread off for 15-20 ms
        items = [
            {"id": node_id, "ts": at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")} for node_id, at in beats.items()
        ]
        chunk = LIVENESS_ENCODE_CHUNK
        payload = "[" + ",".join(json.dumps(items[i : i + chunk])[1:-1] for i in range(0, len(items), chunk)) + "]"
        with unavailable_as_store_error(), self._engine.begin() as conn:
            result = conn.execute(_LIVENESS_SQL[conn.dialect.name], {"beats": payload})
            return {NodeId(row[0]) for row in result}


LIVENESS_ENCODE_CHUNK = 1000
"""Nodes whose newest times are encoded by one call of the JSON encoder (:meth:`SqlNodeStore.record_heartbeats`)."""

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
