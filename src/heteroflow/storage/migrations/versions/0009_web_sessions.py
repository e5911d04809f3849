"""browser sessions of the web UI

Revision ID: 0009
Revises: 0008

A browser signs in once by exchanging an API token for a session cookie (HttpOnly, SameSite=Strict). The
session is a row here, stored as the SHA-256 of the cookie's secret like a token: signing out deletes it,
revoking the token ends it (the lookup joins the live token), and every server process sees the same sessions.
Deleting a token deletes its sessions.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import heteroflow.storage.schema

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("session_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("expires_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["token_id"], ["api_tokens.id"], name=op.f("fk_web_sessions_token_id_api_tokens"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("session_hash", name=op.f("pk_web_sessions")),
    )
    op.create_index(op.f("ix_web_sessions_token_id"), "web_sessions", ["token_id"], unique=False)
    op.create_index(op.f("ix_web_sessions_expires_at"), "web_sessions", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_web_sessions_expires_at"), table_name="web_sessions")
    op.drop_index(op.f("ix_web_sessions_token_id"), table_name="web_sessions")
    op.drop_table("web_sessions")
