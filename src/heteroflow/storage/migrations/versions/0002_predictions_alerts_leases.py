"""predictions, alerts, leases; changed flag on samples

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import heteroflow.storage.schema

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_health_samples", schema=None) as batch_op:
        # a (source, sampled_at) index lured SQLite's planner away from the partial index of changed rows
        batch_op.drop_index("ix_gpu_health_samples_source_sampled_at")
        batch_op.create_index("ix_gpu_health_samples_source", ["source"], unique=False)
        batch_op.create_index("ix_gpu_health_samples_sampled_at", ["sampled_at"], unique=False)
        batch_op.add_column(sa.Column("changed", sa.Boolean(), server_default=sa.true(), nullable=False))
        batch_op.create_index(
            "ix_gpu_health_samples_changes",
            ["source", "node_id", "gpu_index", "uuid", "sampled_at"],
            unique=False,
            postgresql_where=sa.text("changed"),
            sqlite_where=sa.text("changed = 1"),
        )
    op.create_table(
        "alerts",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("node_name", sa.String(length=253), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("resolved_at", heteroflow.storage.schema.UtcDateTime(), nullable=True),
        sa.Column("resolved_by", sa.String(length=200), nullable=True),
        sa.Column("resolution", sa.Text(), nullable=True),
        sa.Column("backlog_since", heteroflow.storage.schema.UtcDateTime(), nullable=True),
        sa.CheckConstraint("status IN ('open', 'resolved')", name=op.f("ck_alerts_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_alerts_node_id_type"), ["node_id", "type"], unique=False)
        batch_op.create_index(batch_op.f("ix_alerts_status_created_at"), ["status", "created_at"], unique=False)
        batch_op.create_index(
            "uq_alerts_open_per_node",
            ["node_id", "type"],
            unique=True,
            postgresql_where=sa.text("status = 'open'"),
            sqlite_where=sa.text("status = 'open'"),
        )

    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("expires_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )
    op.create_table(
        "alert_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("alert_id", sa.String(length=36), nullable=False),
        sa.Column("at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["alert_id"], ["alerts.id"], name=op.f("fk_alert_events_alert_id_alerts"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_events")),
    )
    with op.batch_alter_table("alert_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_alert_events_alert_id_at"), ["alert_id", "at"], unique=False)

    op.create_table(
        "gpu_fault_predictions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=128), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("rule_version", sa.String(length=32), nullable=False),
        sa.Column("window_days", sa.Integer(), nullable=False),
        sa.Column("t0", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("window_end", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("signals", sa.String(length=200), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("created_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("judged_at", heteroflow.storage.schema.UtcDateTime(), nullable=True),
        sa.Column("conclusion", sa.Text(), nullable=True),
        sa.Column("failure_at", heteroflow.storage.schema.UtcDateTime(), nullable=True),
        sa.Column("alert_id", sa.String(length=36), nullable=True),
        sa.CheckConstraint("source IN ('real', 'simulated')", name=op.f("ck_gpu_fault_predictions_source")),
        sa.CheckConstraint(
            "status IN ('pending', 'hit', 'miss', 'voided')", name=op.f("ck_gpu_fault_predictions_status")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_gpu_fault_predictions_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_fault_predictions")),
    )
    with op.batch_alter_table("gpu_fault_predictions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_gpu_fault_predictions_node_id_gpu_index_source_t0"),
            ["node_id", "gpu_index", "source", "t0"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_gpu_fault_predictions_source_window_days_t0"), ["source", "window_days", "t0"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_gpu_fault_predictions_status_window_end"), ["status", "window_end"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("gpu_fault_predictions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_fault_predictions_status_window_end"))
        batch_op.drop_index(batch_op.f("ix_gpu_fault_predictions_source_window_days_t0"))
        batch_op.drop_index(batch_op.f("ix_gpu_fault_predictions_node_id_gpu_index_source_t0"))

    op.drop_table("gpu_fault_predictions")
    with op.batch_alter_table("alert_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_alert_events_alert_id_at"))

    op.drop_table("alert_events")
    op.drop_table("leases")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_alerts_open_per_node",
            postgresql_where=sa.text("status = 'open'"),
            sqlite_where=sa.text("status = 'open'"),
        )
        batch_op.drop_index(batch_op.f("ix_alerts_status_created_at"))
        batch_op.drop_index(batch_op.f("ix_alerts_node_id_type"))

    op.drop_table("alerts")
    with op.batch_alter_table("gpu_health_samples", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_gpu_health_samples_changes", postgresql_where=sa.text("changed"), sqlite_where=sa.text("changed = 1")
        )
        batch_op.drop_column("changed")
        batch_op.drop_index("ix_gpu_health_samples_sampled_at")
        batch_op.drop_index("ix_gpu_health_samples_source")
        batch_op.create_index("ix_gpu_health_samples_source_sampled_at", ["source", "sampled_at"], unique=False)
