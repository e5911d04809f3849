"""semantics_unconfirmed on samples: counters whose meaning the vendor has not confirmed

Revision ID: 0005
Revises: 0004

Cambricon's ``cnmon`` prints one ``Ecc-Error`` column without saying whether it counts correctable errors,
uncorrectable errors or both; it is stored as ``ecc_uncorrected_total`` and the agent marks that key
"semantics unconfirmed". The mark is kept with every row (a comma-separated list of keys, NULL for the usual
case of none), so the rules' evidence, the alerts, the recall figures and the capability matrix can say so.
A nullable column without a default: a catalogue change on PostgreSQL, no table rewrite.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("gpu_health_samples", sa.Column("semantics_unconfirmed", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_health_samples", schema=None) as batch_op:
        batch_op.drop_column("semantics_unconfirmed")
