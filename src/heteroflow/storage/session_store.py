"""SQL storage of the web UI's browser sessions (stored as the SHA-256 of the cookie's secret, never in clear).

A session belongs to one API token and carries exactly its scopes and tenant: the lookup joins the live token,
so revoking the token ends every session made from it at the next request, on every server process.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import TokenId
from heteroflow.platform.auth import Principal
from heteroflow.storage.db import unavailable_as_store_error
from heteroflow.storage.schema import api_tokens, tenants, web_sessions
from heteroflow.storage.token_store import principal_from_row


class SqlSessionStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def create(self, session_hash: str, *, token_id: TokenId, now: datetime, expires_at: datetime) -> None:
        with unavailable_as_store_error(), self._engine.begin() as conn:
            conn.execute(
                sa.insert(web_sessions).values(
                    session_hash=session_hash, token_id=token_id, created_at=now, expires_at=expires_at
                )
            )

    def principal(self, session_hash: str, *, now: datetime) -> tuple[Principal, datetime] | None:
        """The principal of a live session (not expired, its token not revoked) and the session's end, or None."""
        query = (
            sa.select(
                api_tokens.c.id,
                api_tokens.c.name.label("token_name"),
                api_tokens.c.scopes,
                api_tokens.c.tenant_id,
                tenants.c.name.label("tenant_name"),
                web_sessions.c.expires_at,
            )
            .select_from(
                web_sessions.join(api_tokens, api_tokens.c.id == web_sessions.c.token_id).outerjoin(
                    tenants, tenants.c.id == api_tokens.c.tenant_id
                )
            )
            .where(
                web_sessions.c.session_hash == session_hash,
                web_sessions.c.expires_at > now,
                api_tokens.c.revoked_at.is_(None),
            )
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        expires_at: datetime = row.expires_at
        return principal_from_row(row), expires_at

    def delete(self, session_hash: str) -> bool:
        with unavailable_as_store_error(), self._engine.begin() as conn:
            result = conn.execute(sa.delete(web_sessions).where(web_sessions.c.session_hash == session_hash))
        return bool(result.rowcount)

    def delete_ended(self, *, now: datetime) -> int:
        """Delete the expired sessions and those of revoked tokens; returns how many."""
        revoked = sa.select(api_tokens.c.id).where(api_tokens.c.revoked_at.is_not(None))
        with unavailable_as_store_error(), self._engine.begin() as conn:
            result = conn.execute(
                sa.delete(web_sessions).where(
                    sa.or_(web_sessions.c.expires_at <= now, web_sessions.c.token_id.in_(revoked))
                )
            )
        return int(result.rowcount or 0)
