"""initial schema: tenants, tokens, nodes, health samples, xid events

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import heteroflow.storage.schema

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("scopes", sa.String(length=500), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("revoked_at", heteroflow.storage.schema.UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_tokens_tenant_id_tenants"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("vendor", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=True),
        sa.Column("registered_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("last_heartbeat_at", heteroflow.storage.schema.UtcDateTime(), nullable=True),
        sa.CheckConstraint("source IN ('real', 'simulated')", name=op.f("ck_nodes_source")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_nodes_tenant_id_tenants"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("name", name=op.f("uq_nodes_name")),
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "gpu_health_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=128), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("sampled_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("ecc_uncorrected_total", sa.BigInteger(), nullable=True),
        sa.Column("ecc_corrected_total", sa.BigInteger(), nullable=True),
        sa.Column("retired_pages", sa.BigInteger(), nullable=True),
        sa.Column("remapped_rows_pending", sa.BigInteger(), nullable=True),
        sa.Column("remapped_rows_failure", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("source IN ('real', 'simulated')", name=op.f("ck_gpu_health_samples_source")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_gpu_health_samples_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_health_samples")),
    )
    with op.batch_alter_table("gpu_health_samples", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_gpu_health_samples_node_id_gpu_index_sampled_at"),
            ["node_id", "gpu_index", "sampled_at"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_gpu_health_samples_source_sampled_at"), ["source", "sampled_at"], unique=False
        )

    op.create_table(
        "gpu_xid_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=128), nullable=True),
        sa.Column("xid", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("occurred_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("received_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.CheckConstraint("source IN ('real', 'simulated')", name=op.f("ck_gpu_xid_events_source")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_gpu_xid_events_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_xid_events")),
        sa.UniqueConstraint(
            "node_id",
            "gpu_index",
            "xid",
            "occurred_at",
            name=op.f("uq_gpu_xid_events_node_id_gpu_index_xid_occurred_at"),
        ),
    )
    with op.batch_alter_table("gpu_xid_events", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_gpu_xid_events_source_occurred_at"), ["source", "occurred_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("gpu_xid_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_xid_events_source_occurred_at"))

    op.drop_table("gpu_xid_events")
    with op.batch_alter_table("gpu_health_samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_health_samples_source_sampled_at"))
        batch_op.drop_index(batch_op.f("ix_gpu_health_samples_node_id_gpu_index_sampled_at"))

    op.drop_table("gpu_health_samples")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_nodes_tenant_id"))

    op.drop_table("nodes")
    op.drop_table("api_tokens")
    op.drop_table("tenants")
