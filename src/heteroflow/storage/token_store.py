"""SQL storage of tenants and API tokens (tokens are stored as their SHA-256, never in clear)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import TenantId, TokenId
from heteroflow.platform.auth import Principal, Scope, generate_token, hash_token
from heteroflow.storage.db import unavailable_as_store_error
from heteroflow.storage.schema import api_tokens, tenants

_CHUNK = 1000


def principal_from_row(row: Any) -> Principal:
    """The principal of a row with the token's id, token_name, scopes, tenant_id and tenant_name."""
    known = {scope.value: scope for scope in Scope}
    return Principal(
        token_id=TokenId(row.id),
        scopes=frozenset(known[name] for name in row.scopes.split(",") if name in known),
        tenant_id=TenantId(row.tenant_id) if row.tenant_id is not None else None,
        tenant_name=row.tenant_name,
        token_name=row.token_name,
    )


class SqlTokenStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def ensure_tenant(self, name: str, *, now: datetime) -> tuple[TenantId, bool]:
        """The tenant's id, creating it if needed. Returns (id, created)."""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            row = conn.execute(sa.select(tenants.c.id).where(tenants.c.name == name)).first()
            if row is not None:
                return TenantId(row.id), False
            tenant_id = str(uuid.uuid4())
            conn.execute(sa.insert(tenants).values(id=tenant_id, name=name, created_at=now))
            return TenantId(tenant_id), True

    def create_token(
        self, *, name: str, scopes: frozenset[Scope], tenant_id: TenantId | None, now: datetime
    ) -> tuple[TokenId, str]:
        """Create a token; returns (id, the token in clear — shown once, never stored)."""
        token = generate_token()
        token_id = str(uuid.uuid4())
        with unavailable_as_store_error(), self._engine.begin() as conn:
            conn.execute(
                sa.insert(api_tokens).values(
                    id=token_id,
                    token_hash=hash_token(token),
                    name=name,
                    scopes=",".join(sorted(scopes)),
                    tenant_id=tenant_id,
                    created_at=now,
                    revoked_at=None,
                )
            )
        return TokenId(token_id), token

    def principal(self, token_hash: str) -> Principal | None:
        """The principal of a live token by its hash, or None (unknown or revoked)."""
        return self.principals([token_hash]).get(token_hash)

    def principals(self, token_hashes: Sequence[str]) -> dict[str, Principal]:
        """The live tokens among ``token_hashes`` (revoked and unknown ones are absent)."""
        found: dict[str, Principal] = {}
        for start in range(0, len(token_hashes), _CHUNK):
            query = (
                sa.select(
                    api_tokens.c.token_hash,
                    api_tokens.c.id,
                    api_tokens.c.name.label("token_name"),
                    api_tokens.c.scopes,
                    api_tokens.c.tenant_id,
                    tenants.c.name.label("tenant_name"),
                )
                .select_from(api_tokens.outerjoin(tenants, tenants.c.id == api_tokens.c.tenant_id))
                .where(
                    api_tokens.c.token_hash.in_(token_hashes[start : start + _CHUNK]),
                    api_tokens.c.revoked_at.is_(None),
                )
            )
            with unavailable_as_store_error(), self._engine.connect() as conn:
                for row in conn.execute(query):
                    found[row.token_hash] = principal_from_row(row)
        return found

    def revoke(self, token_id: TokenId, *, now: datetime) -> bool:
        with unavailable_as_store_error(), self._engine.begin() as conn:
            result = conn.execute(
                sa.update(api_tokens)
                .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
                .values(revoked_at=now)
            )
        return bool(result.rowcount)
