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
    credential_issued_at: datetime | None = None
    """When the node's credential was last issued: its first registration, or a re-issue after an operator's
    release or by an administrator's token (``None``: before these times were kept)."""
    credential_released_at: datetime | None = None
    """When an operator last released the node's credential (``None``: never)."""

    def credential_changed_since(self, moment: datetime) -> bool:
        """Whether the node's credential was re-issued (not first issued) after ``moment``: who speaks for the
        node may have changed then."""
        issued = self.credential_issued_at
        return issued is not None and issued > self.registered_at and issued > moment


NODE_CREDENTIAL_HEADER = "X-HeteroFlow-Node-Credential"
"""The header an agent sends its node's credential in, on re-registration and on every heartbeat."""


class NodeConflictError(Exception):
    """A registration that contradicts an existing node (its source, or its credential)."""


class NodeCredentialError(NodeConflictError):
    """The hostname is registered in the caller's tenant, and the request does not carry that node's credential.

    Only an operator gives the node a new credential (its ``release``, then the creating token's registration;
    or an administrator's token): a node's silence proves nothing about who is asking, so offline time never
    does (``docs/reliability.md``)."""


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
