"""node credentials, hostnames unique per tenant

Revision ID: 0007
Revises: 0006

Every node gets its own credential at its first registration (stored as its SHA-256): re-registering the
hostname, beating and reporting XID events for the node need it, so one agent token no longer speaks for every
node. ``registered_by`` keeps the token that created a node, for the per-token quotas. A hostname becomes
unique within a tenant instead of across the platform, so that a tenant can neither squat on another tenant's
hostname nor learn that it exists. Existing nodes keep a null credential until their next registration claims
one.

SQLite recreates the table to drop the old unique constraint; ``upgrade_database`` runs SQLite migrations with
foreign keys off, so that the copy does not cascade into the samples.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("credential_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("registered_by", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("tenant_key", sa.String(length=36), nullable=False, server_default=""))
        batch_op.drop_constraint("uq_nodes_name", type_="unique")
        batch_op.create_index("ix_nodes_registered_by", ["registered_by"], unique=False)
    op.execute("UPDATE nodes SET tenant_key = tenant_id WHERE tenant_id IS NOT NULL")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_unique_constraint("uq_nodes_tenant_key_name", ["tenant_key", "name"])


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_constraint("uq_nodes_tenant_key_name", type_="unique")
        batch_op.drop_index("ix_nodes_registered_by")
        batch_op.drop_column("tenant_key")
        batch_op.create_unique_constraint("uq_nodes_name", ["name"])
        batch_op.drop_column("registered_by")
        batch_op.drop_column("credential_hash")
