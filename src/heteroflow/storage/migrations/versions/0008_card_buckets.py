"""Per-card hour and day summaries of the health samples, for the capability matrix

Revision ID: 0008
Revises: 0007

The capability matrix counted, per card, every sample of the retention period: 3.7 s at 1,000 cards and 8 days
on PostgreSQL. ``gpu_health_card_buckets`` keeps, per card and UTC hour and per card and UTC day, the sample count,
the first and last sample time, the greatest ``semantics_unconfirmed`` value and the non-NULL count of each
counter; the store writes them with the samples and rebuilds the one that retention cuts. This migration creates
the table and fills it from the stored samples, one day at a time.
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from alembic import op

import heteroflow.storage.schema
from heteroflow.storage.health_buckets import DAY, floor_to, rebuild_buckets

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# The columns this revision created, pinned: the table must not move with the domain's counter list without a new
# migration (tests/unit/storage/test_bucket_columns.py checks this list against the live schema's).
COUNTERS = (
    "ecc_uncorrected_total",
    "ecc_corrected_total",
    "retired_pages",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "ecc_sram_uncorrected_total",
    "ecc_sram_corrected_total",
)


def upgrade() -> None:
    op.create_table(
        "gpu_health_card_buckets",
        sa.Column("span_seconds", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("uuid_key", sa.String(length=128), nullable=False),
        sa.Column("bucket_start", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("first_sample_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("last_sample_at", heteroflow.storage.schema.UtcDateTime(), nullable=False),
        sa.Column("sample_count", sa.BigInteger(), nullable=False),
        sa.Column("semantics_unconfirmed", sa.String(length=200), nullable=True),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in COUNTERS),
        sa.CheckConstraint("source IN ('real', 'simulated')", name=op.f("ck_gpu_health_card_buckets_source")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_gpu_health_card_buckets_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(
            "span_seconds",
            "source",
            "node_id",
            "gpu_index",
            "uuid_key",
            "bucket_start",
            name=op.f("pk_gpu_health_card_buckets"),
        ),
    )
    op.create_index(
        op.f("ix_gpu_health_card_buckets_span_seconds_source_bucket_start"),
        "gpu_health_card_buckets",
        ["span_seconds", "source", "bucket_start"],
        unique=False,
    )
    conn = op.get_bind()
    samples = sa.table("gpu_health_samples", sa.column("sampled_at", heteroflow.storage.schema.UtcDateTime()))
    first, last = conn.execute(sa.select(sa.func.min(samples.c.sampled_at), sa.func.max(samples.c.sampled_at))).one()
    if first is None:
        return
    day = floor_to(first, DAY)
    while day <= last:  # one day (its day bucket and 24 hour buckets) per statement group
        rebuild_buckets(conn, day, day + timedelta(seconds=DAY))
        day += timedelta(seconds=DAY)


def downgrade() -> None:
    op.drop_index(
        op.f("ix_gpu_health_card_buckets_span_seconds_source_bucket_start"), table_name="gpu_health_card_buckets"
    )
    op.drop_table("gpu_health_card_buckets")
