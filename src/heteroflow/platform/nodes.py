"""Nodes: what an agent registers, and what the platform knows of each node."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from heteroflow.core.ids import NodeId, Source, TenantId


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A registered node. ``source`` is fixed at registration: a heartbeat never switches it (H-17)."""

    id: NodeId
    name: str
    vendor: str
    model: str
    gpu_count: int
    source: Source
    tenant_id: TenantId | None
    registered_at: datetime
    last_heartbeat_at: datetime | None


class NodeConflictError(Exception):
    """A registration that contradicts an existing node (another scope, or another source)."""


def is_online(last_heartbeat_at: datetime | None, *, now: datetime, offline_after: timedelta) -> bool:
    """A node is online when its newest heartbeat is no older than ``offline_after``."""
    return last_heartbeat_at is not None and now - last_heartbeat_at <= offline_after


def newest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)
