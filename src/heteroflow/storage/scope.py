"""The conditions read queries share: the tenant scope every query of node-owned rows carries, and the
case-insensitive substring match of the list filters."""

from __future__ import annotations

import sqlalchemy as sa

from heteroflow.platform.auth import NodeScope
from heteroflow.storage.schema import nodes as nodes_t


def in_scope(column: sa.ColumnElement[str], scope: NodeScope) -> list[sa.ColumnElement[bool]]:
    """The condition that keeps ``column`` (a node id) inside a tenant's nodes; nothing for an unscoped caller.

    No condition at all rather than ``IN (all nodes)``: the extra term costs nothing in meaning but can turn a
    planner away from the best index.
    """
    if scope.tenant_id is None:
        return []
    return [column.in_(sa.select(nodes_t.c.id).where(nodes_t.c.tenant_id == scope.tenant_id))]


def contains_text(column: sa.ColumnElement[str], text: str) -> sa.ColumnElement[bool]:
    """``column`` contains ``text``, case-insensitively, with LIKE's wildcards in ``text`` matched literally."""
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return sa.func.lower(column).like(f"%{escaped}%", escape="\\")
