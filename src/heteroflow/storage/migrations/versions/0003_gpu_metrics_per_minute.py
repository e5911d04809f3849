"""gpu metrics per minute (heartbeat metrics history, GPU_MEMORY_HIGH)

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import heteroflow.storage.schema

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_metrics_minutes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=128), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("minute", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("temperature_c_min", sa.Float(), nullable=True),
        sa.Column("temperature_c_avg", sa.Float(), nullable=True),
        sa.Column("temperature_c_max", sa.Float(), nullable=True),
        sa.Column("utilization_pct_min", sa.Float(), nullable=True),
        sa.Column("utilization_pct_avg", sa.Float(), nullable=True),
        sa.Column("utilization_pct_max", sa.Float(), nullable=True),
        sa.Column("memory_used_mib_min", sa.Float(), nullable=True),
        sa.Column("memory_used_mib_avg", sa.Float(), nullable=True),
        sa.Column("memory_used_mib_max", sa.Float(), nullable=True),
        sa.Column("memory_total_mib_min", sa.Float(), nullable=True),
        sa.Column("memory_total_mib_avg", sa.Float(), nullable=True),
        sa.Column("memory_total_mib_max", sa.Float(), nullable=True),
        sa.Column("power_w_min", sa.Float(), nullable=True),
        sa.Column("power_w_avg", sa.Float(), nullable=True),
        sa.Column("power_w_max", sa.Float(), nullable=True),
        sa.Column("temperature_c_n", sa.Integer(), nullable=True),
        sa.Column("utilization_pct_n", sa.Integer(), nullable=True),
        sa.Column("memory_used_mib_n", sa.Integer(), nullable=True),
        sa.Column("memory_total_mib_n", sa.Integer(), nullable=True),
        sa.Column("power_w_n", sa.Integer(), nullable=True),
        sa.CheckConstraint("source IN ('real', 'simulated')", name=op.f("ck_gpu_metrics_minutes_source")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_gpu_metrics_minutes_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_metrics_minutes")),
    )
    with op.batch_alter_table("gpu_metrics_minutes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gpu_metrics_minutes_minute"), ["minute"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_gpu_metrics_minutes_node_id_gpu_index_minute"),
            ["node_id", "gpu_index", "minute"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("gpu_metrics_minutes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_metrics_minutes_node_id_gpu_index_minute"))
        batch_op.drop_index(batch_op.f("ix_gpu_metrics_minutes_minute"))

    op.drop_table("gpu_metrics_minutes")
