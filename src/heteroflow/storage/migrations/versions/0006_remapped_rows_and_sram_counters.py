"""Remapped-row counts and on-die SRAM ECC counts as health counters

Revision ID: 0006
Revises: 0005

On Ampere and later, row remapping is the durable evidence of a failing memory row: ``remapped_rows_correctable``
and ``remapped_rows_uncorrectable`` (nvidia-smi ``remapped_rows.correctable`` / ``.uncorrectable``, NVML
``nvmlDeviceGetRemappedRows``) are stored as counters, NULL = unknown as for every counter. Where the driver
splits ECC counts by location (590-series ``ecc.errors.*.aggregate.dram`` / ``.sram``, NVML memory locations
DRAM and SRAM), ``ecc_*_total`` hold the DRAM (HBM) errors the rules are about and the on-die SRAM errors are kept
apart in ``ecc_sram_uncorrected_total`` / ``ecc_sram_corrected_total``. Nullable columns without defaults: a
catalogue change on PostgreSQL, no table rewrite; existing rows read as unknown.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

COLUMNS = (
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "ecc_sram_uncorrected_total",
    "ecc_sram_corrected_total",
)


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("gpu_health_samples", sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_health_samples", schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.drop_column(name)
