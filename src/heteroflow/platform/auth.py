"""API tokens, scopes and tenant scoping.

Tokens are 256-bit random strings shown once and stored as their SHA-256. A slow password hash buys
nothing for secrets of that entropy, and a fast one lets the server verify a token without a database
round trip once it is cached (the heartbeat path must make no statement of its own).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

from heteroflow.core.ids import NodeId, TenantId, TokenId

TOKEN_PREFIX = "hf_"  # noqa: S105 - a prefix that makes leaked tokens greppable, not a secret


class Scope(StrEnum):
    NODES_READ = "nodes:read"
    NODES_WRITE = "nodes:write"
    AGENT = "agent"
    ALERTS_WRITE = "alerts:write"
    METRICS_READ = "metrics:read"
    SERVING_READ = "serving:read"
    """Watch serving fault tolerance (the platform server's read-only proxy to the controller); cluster-wide."""
    INFERENCE = "inference"
    """An API key of the Coordinator's OpenAI routes (and nothing else on the platform)."""
    ADMIN = "admin"


class InvalidScopeError(ValueError):
    """A scope name that the platform does not know."""


def parse_scopes(text: str) -> frozenset[Scope]:
    """Scopes from a comma-separated list; unknown names raise :class:`InvalidScopeError`."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise InvalidScopeError("at least one scope is required")
    known = {scope.value: scope for scope in Scope}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise InvalidScopeError(f"unknown scope(s): {', '.join(unknown)}; known: {', '.join(known)}")
    return frozenset(known[name] for name in names)


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def same_secret(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def bearer_value(authorization: str | None) -> str | None:
    """The credential of ``Authorization: Bearer <value>``, or ``None`` when there is none."""
    scheme, _, value = (authorization or "").partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value else None


def bearer_matches(authorization: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>`` with exactly this token (constant-time compare)."""
    value = bearer_value(authorization)
    return value is not None and same_secret(value, token)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a token's id, its scopes and its tenant (``None`` = every node)."""

    token_id: TokenId
    scopes: frozenset[Scope]
    tenant_id: TenantId | None
    tenant_name: str | None = None
    token_name: str = ""

    @property
    def actor(self) -> str:
        """How audit trails name this caller: the token's label and id, never the token."""
        return f"token:{self.token_name or '-'}:{self.token_id}"

    def has(self, scope: Scope) -> bool:
        return scope in self.scopes or Scope.ADMIN in self.scopes

    def sees_node(self, node_tenant: TenantId | None) -> bool:
        """A tenant sees only its own nodes; a token without a tenant sees every node."""
        return self.tenant_id is None or self.tenant_id == node_tenant


@dataclass(frozen=True, slots=True)
class NodeScope:
    """The node filter a query applies: ``tenant_id`` None means all nodes."""

    tenant_id: TenantId | None

    @classmethod
    def of(cls, principal: Principal) -> NodeScope:
        return cls(tenant_id=principal.tenant_id)


__all__ = [
    "InvalidScopeError",
    "NodeId",
    "NodeScope",
    "Principal",
    "Scope",
    "generate_token",
    "hash_token",
    "parse_scopes",
    "same_secret",
]
