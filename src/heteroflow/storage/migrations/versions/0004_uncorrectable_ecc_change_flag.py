"""ue_changed flag on samples: the rows the failure scan and the card lists need

Revision ID: 0004
Revises: 0003

``changed`` marks every change of any counter; a degrading card changes its corrected-ECC counter in every
sample, so at 1,000 cards the failure scan walked ~470,000 changed rows to find ~20 uncorrectable-ECC steps.
``ue_changed`` marks a row whose uuid or uncorrectable-ECC value differs from its slot's previous row (and every
card's first row), computed as the insert computes it, with a partial index in the failure scan's order.

First the oldest row of each slot gets both flags, as retention keeps it from now on (a database whose
retention already removed a slot's first row regains the invariant the scans rely on). Then the backfill reads
only the changed rows: a row that is not changed repeats its predecessor entirely, so its ``ue_changed`` is
false, and a changed row's predecessor holds the same uuid and value as the previous changed row of its slot.
It runs per chunk of nodes so that no statement sorts the whole table.

The column ends with a server default of true (a row written without the flag, by an older server during a
rolling upgrade, is then scanned: safe). PostgreSQL adds it with a default of false — a catalogue change, no
table rewrite — sets the few true rows and then changes the default; SQLite cannot change a default without
copying the table, so it adds the column as true and clears the keepalive rows in batches of ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

NODE_CHUNK = 100
ID_BATCH = 200_000

samples = sa.table(
    "gpu_health_samples",
    sa.column("id", sa.BigInteger()),
    sa.column("node_id", sa.String()),
    sa.column("gpu_index", sa.Integer()),
    sa.column("uuid", sa.String()),
    sa.column("source", sa.String()),
    sa.column("sampled_at", sa.DateTime()),
    sa.column("ecc_uncorrected_total", sa.BigInteger()),
    sa.column("changed", sa.Boolean()),
    sa.column("ue_changed", sa.Boolean()),
)
nodes = sa.table("nodes", sa.column("id", sa.String()))


def upgrade() -> None:
    conn = op.get_bind()
    postgres = conn.dialect.name == "postgresql"
    op.add_column(
        "gpu_health_samples",
        sa.Column("ue_changed", sa.Boolean(), server_default=sa.false() if postgres else sa.true(), nullable=False),
    )
    if not postgres:
        _clear_keepalive_rows(conn)
    node_ids = list(conn.execute(sa.select(nodes.c.id).order_by(nodes.c.id)).scalars())
    for start in range(0, len(node_ids), NODE_CHUNK):
        chunk = node_ids[start : start + NODE_CHUNK]
        # first rows first: a slot whose oldest rows retention removed then compares its first remaining changed
        # row with the (now changed) first row, exactly as the insert compared it with its predecessor
        _flag_first_rows(conn, chunk)
        _flag_changed_rows(conn, chunk, postgres=postgres)
    if postgres:
        op.alter_column("gpu_health_samples", "ue_changed", server_default=sa.true())
    with op.batch_alter_table("gpu_health_samples", schema=None) as batch_op:
        batch_op.create_index(
            "ix_gpu_health_samples_ue_changes",
            ["source", "node_id", "gpu_index", "uuid", "sampled_at"],
            unique=False,
            postgresql_where=sa.text("ue_changed"),
            sqlite_where=sa.text("ue_changed = 1"),
        )


def _clear_keepalive_rows(conn: sa.Connection) -> None:
    """SQLite: a row that repeats its predecessor entirely repeats its uuid and value too."""
    low, high = conn.execute(sa.select(sa.func.min(samples.c.id), sa.func.max(samples.c.id))).one()
    if low is None:
        return
    for first in range(int(low), int(high) + 1, ID_BATCH):
        conn.execute(
            sa.update(samples)
            .where(samples.c.id >= first, samples.c.id < first + ID_BATCH, sa.not_(samples.c.changed))
            .values(ue_changed=False)
        )


def _flag_changed_rows(conn: sa.Connection, node_ids: Sequence[str], *, postgres: bool) -> None:
    """Among the changed rows of these nodes, compare each with the previous changed row of its slot."""
    rows = samples.alias("changed_rows")

    def lag(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        return sa.func.lag(column).over(
            partition_by=(rows.c.source, rows.c.node_id, rows.c.gpu_index), order_by=(rows.c.sampled_at, rows.c.id)
        )

    steps = (
        sa.select(
            rows.c.id,
            rows.c.uuid,
            rows.c.ecc_uncorrected_total.label("ue"),
            lag(rows.c.id).label("prev_id"),
            lag(rows.c.uuid).label("prev_uuid"),
            lag(rows.c.ecc_uncorrected_total).label("prev_ue"),
        )
        .where(rows.c.changed, rows.c.node_id.in_(node_ids))
        .subquery()
    )
    differs = sa.or_(
        steps.c.prev_id.is_(None),
        steps.c.uuid.is_distinct_from(steps.c.prev_uuid),
        steps.c.ue.is_distinct_from(steps.c.prev_ue),
    )
    # PostgreSQL starts from false (set the few that differ), SQLite from true (clear the ones that repeat)
    which = differs if postgres else sa.not_(differs)
    conn.execute(
        sa.update(samples).where(samples.c.id.in_(sa.select(steps.c.id).where(which))).values(ue_changed=postgres)
    )


def _flag_first_rows(conn: sa.Connection, node_ids: Sequence[str]) -> None:
    """The oldest row of each slot of these nodes carries both flags (retention keeps it so from now on)."""
    slot_rows = samples.alias("slot_rows")
    slots = (
        sa.select(slot_rows.c.source, slot_rows.c.node_id, slot_rows.c.gpu_index)
        .where(slot_rows.c.node_id.in_(node_ids))
        .distinct()
        .subquery()
    )
    first_rows = samples.alias("first_rows")
    first = (
        sa.select(first_rows.c.id)
        .where(
            first_rows.c.node_id == slots.c.node_id,
            first_rows.c.gpu_index == slots.c.gpu_index,
            first_rows.c.source == slots.c.source,
        )
        .order_by(first_rows.c.sampled_at, first_rows.c.id)
        .limit(1)
        .scalar_subquery()
    )
    conn.execute(
        sa.update(samples)
        .where(
            samples.c.id.in_(sa.select(first).select_from(slots)),
            sa.not_(sa.and_(samples.c.changed, samples.c.ue_changed)),
        )
        .values(changed=True, ue_changed=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("gpu_health_samples", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_gpu_health_samples_ue_changes",
            postgresql_where=sa.text("ue_changed"),
            sqlite_where=sa.text("ue_changed = 1"),
        )
        batch_op.drop_column("ue_changed")
