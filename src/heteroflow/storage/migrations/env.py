"""Alembic environment: runs against the connection HeteroFlow hands over (see storage.db)."""

from __future__ import annotations

from alembic import context

from heteroflow.storage.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    engine = context.config.attributes["engine"]
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
