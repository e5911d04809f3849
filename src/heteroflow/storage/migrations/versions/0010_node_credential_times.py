"""when a node's credential was issued and released

Revision ID: 0010
Revises: 0009

A node's credential is issued at its first registration and again only by an operator (an administrator's
token, or a ``release`` claimed by the token that created the node): ``credential_issued_at`` and
``credential_released_at`` record when, so that a node whose credential changed hands is told apart from one that
never beat, and hardware evidence reported just after such a change is held for an operator. Existing nodes keep
null (issued before the times were kept).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import heteroflow.storage.schema

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMN on both databases: no copy of the nodes table (on SQLite a copy with foreign keys on would
    # cascade into every node's samples)
    op.add_column("nodes", sa.Column("credential_issued_at", heteroflow.storage.schema.UtcDateTime(), nullable=True))
    op.add_column("nodes", sa.Column("credential_released_at", heteroflow.storage.schema.UtcDateTime(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE … DROP COLUMN (SQLite 3.35 and later, PostgreSQL): again no copy of the table
    op.execute("ALTER TABLE nodes DROP COLUMN credential_released_at")
    op.execute("ALTER TABLE nodes DROP COLUMN credential_issued_at")
