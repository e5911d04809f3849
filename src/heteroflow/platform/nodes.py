"""Nodes: what an agent registers, and what the platform knows of each node."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta

from heteroflow.core.ids import NodeId, Source, TenantId, TokenId


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
    credential_hash: str | None = None
    """SHA-256 of the node's own credential; ``None`` for a node registered before credentials existed."""
    registered_by: TokenId | None = None
    """The token that created the node (the per-token quotas count by it)."""


NODE_CREDENTIAL_HEADER = "X-HeteroFlow-Node-Credential"
"""The header an agent sends its node's credential in, on re-registration and on every heartbeat."""


class NodeConflictError(Exception):
    """A registration that contradicts an existing node (its source, or its credential)."""


class NodeCredentialError(NodeConflictError):
    """The hostname is registered in the caller's tenant, and the request does not carry that node's credential.

    The caller's token may reclaim the node once it has been offline long enough, if it created it (``last_seen``)."""

    def __init__(self, message: str, *, last_seen: datetime | None = None) -> None:
        super().__init__(message)
        self.last_seen = last_seen
        """When the node was last alive (its newest beat, or its registration), if the caller created it:
        the caller may reclaim the node once that is old enough; ``None`` when the caller never may."""


@dataclass(frozen=True, slots=True)
class Quota:
    """Per-token limits on registration: nodes a token may create, and cards (``gpu_count``) across them."""

    max_nodes: int
    max_cards: int


class NodeQuotaError(Exception):
    """The token has registered as many nodes, or cards, as its quota allows."""


def speaks_for(node: NodeRecord, credential_hash: str | None) -> bool:
    """Whether a request carrying ``credential_hash`` may speak for ``node`` (beat, report its XID events).
    A node without a credential accepts any caller of its tenant when it was registered before credentials
    existed (no ``registered_by``), and no one when an operator released its credential (its creating token
    claims a new one at its next registration). Purely computational; constant-time compare."""
    if node.credential_hash is None:
        return node.registered_by is None
    return credential_hash is not None and hmac.compare_digest(node.credential_hash, credential_hash)


def is_online(last_heartbeat_at: datetime | None, *, now: datetime, offline_after: timedelta) -> bool:
    """A node is online when its newest heartbeat is no older than ``offline_after``."""
    return last_heartbeat_at is not None and now - last_heartbeat_at <= offline_after


def newest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)
