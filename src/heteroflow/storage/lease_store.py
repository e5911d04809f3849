"""A leader lease in a database row: works on SQLite and PostgreSQL alike."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from heteroflow.storage.db import unavailable_as_store_error
from heteroflow.storage.schema import leases


class SqlLeaseStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def acquire(self, name: str, *, holder: str, now: datetime, ttl: timedelta) -> bool:
        """Take or renew the lease: granted when free, expired, or already ours. One winner per race."""
        expires = now + ttl
        with unavailable_as_store_error(), self._engine.begin() as conn:
            insert: Any = postgresql.insert(leases) if conn.dialect.name == "postgresql" else sqlite.insert(leases)
            created = conn.execute(
                insert.values(name=name, holder=holder, expires_at=expires)
                .on_conflict_do_nothing()
                .returning(leases.c.name)
            ).first()
            if created is not None:
                return True
            result = conn.execute(
                sa.update(leases)
                .where(leases.c.name == name, sa.or_(leases.c.holder == holder, leases.c.expires_at < now))
                .values(holder=holder, expires_at=expires)
            )
            return bool(result.rowcount)

    def release(self, name: str, *, holder: str) -> None:
        with unavailable_as_store_error(), self._engine.begin() as conn:
            conn.execute(sa.delete(leases).where(leases.c.name == name, leases.c.holder == holder))

    def holder(self, name: str, *, now: datetime) -> str | None:
        with unavailable_as_store_error(), self._engine.connect() as conn:
            row = conn.execute(sa.select(leases).where(leases.c.name == name, leases.c.expires_at >= now)).first()
        return row.holder if row is not None else None
