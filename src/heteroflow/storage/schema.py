"""Tables. Counters are 64-bit, nullable and have no DEFAULT: NULL is unknown and reads back as NULL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from heteroflow.health.counters import HEALTH_KEYS

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UtcDateTime(sa.TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, stored as naive UTC with microseconds.

    Both backends keep microseconds, so a value compares the same before and after the round trip;
    comparisons that matter (H-40) are made on values as read back.
    """

    impl = sa.DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # SQLite through raw SQL
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC)


BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER only
SOURCE_CHECK = "source IN ('real', 'simulated')"

tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(128), nullable=False, unique=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)

api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("scopes", sa.String(500), nullable=False),
    sa.Column("tenant_id", sa.String(36), sa.ForeignKey("tenants.id", ondelete="RESTRICT"), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
)

web_sessions = sa.Table(
    "web_sessions",
    metadata,
    # the SHA-256 of the session secret the browser's cookie holds (the secret itself is never stored)
    sa.Column("session_hash", sa.String(64), primary_key=True),
    sa.Column("token_id", sa.String(36), sa.ForeignKey("api_tokens.id", ondelete="CASCADE"), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
    sa.Index(None, "token_id"),
    sa.Index(None, "expires_at"),  # cleanup of ended sessions
)

nodes = sa.Table(
    "nodes",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(253), nullable=False),
    sa.Column("vendor", sa.String(64), nullable=False),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("gpu_count", sa.Integer(), nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("tenant_id", sa.String(36), sa.ForeignKey("tenants.id", ondelete="RESTRICT"), nullable=True),
    sa.Column("registered_at", UtcDateTime(), nullable=False),
    sa.Column("last_heartbeat_at", UtcDateTime(), nullable=True),
    # the SHA-256 of the node's own credential, issued at its first registration (null: a node registered
    # before credentials existed, claimed by its next registration)
    sa.Column("credential_hash", sa.String(64), nullable=True),
    sa.Column("registered_by", sa.String(36), nullable=True),  # the token that created it (quotas)
    # when the credential was last issued (the first registration, or an operator's re-issue) and released: a
    # node whose credential changed hands is told apart from one that never beat (null: before times were kept)
    sa.Column("credential_issued_at", UtcDateTime(), nullable=True),
    sa.Column("credential_released_at", UtcDateTime(), nullable=True),
    # tenant_id, or '' for the tenant-less nodes: a hostname is unique within a tenant (SQL's unique constraints
    # count NULLs as distinct), so that no tenant can squat on, or learn of, another tenant's hostname
    sa.Column("tenant_key", sa.String(36), nullable=False, server_default=""),
    sa.CheckConstraint(SOURCE_CHECK, name="source"),
    sa.UniqueConstraint("tenant_key", "name"),
    sa.Index(None, "tenant_id"),
    sa.Index(None, "registered_by"),
)

EXISTING_NODE_IDS: Final = sa.select(nodes.c.id).where(nodes.c.id.in_(sa.bindparam("ids", expanding=True)))
"""The ids, among the bound list ``ids``, of nodes that exist: the writers' check that a node was not deleted
meanwhile (perhaps through another server). Built once: built per batch, each left cyclic garbage."""

gpu_health_samples = sa.Table(
    "gpu_health_samples",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("node_id", sa.String(36), sa.ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    sa.Column("gpu_index", sa.Integer(), nullable=False),
    sa.Column("uuid", sa.String(128), nullable=True),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("sampled_at", UtcDateTime(), nullable=False),
    sa.Column("ecc_uncorrected_total", sa.BigInteger(), nullable=True),
    sa.Column("ecc_corrected_total", sa.BigInteger(), nullable=True),
    sa.Column("retired_pages", sa.BigInteger(), nullable=True),
    sa.Column("remapped_rows_pending", sa.BigInteger(), nullable=True),
    sa.Column("remapped_rows_failure", sa.BigInteger(), nullable=True),
    sa.Column("remapped_rows_correctable", sa.BigInteger(), nullable=True),
    sa.Column("remapped_rows_uncorrectable", sa.BigInteger(), nullable=True),
    sa.Column("ecc_sram_uncorrected_total", sa.BigInteger(), nullable=True),
    sa.Column("ecc_sram_corrected_total", sa.BigInteger(), nullable=True),
    # False for a row that repeats its slot's previous row (a keepalive row): scans that look for changes
    # (failure events, the capability matrix) read the changed rows only
    sa.Column("changed", sa.Boolean(), nullable=False, server_default=sa.true()),
    # False for a row whose uuid and uncorrectable-ECC value repeat its slot's previous row: the failure scan
    # (H-50) and the card lists need only these few rows, while `changed` also marks every corrected-ECC step
    # of a degrading card (most changed rows). Every card's first row carries both flags (retention keeps it so).
    sa.Column("ue_changed", sa.Boolean(), nullable=False, server_default=sa.true()),
    # keys whose meaning the vendor has not confirmed (comma-separated; NULL = none): cnmon's Ecc-Error column
    sa.Column("semantics_unconfirmed", sa.String(200), nullable=True),
    sa.CheckConstraint(SOURCE_CHECK, name="source"),
    # one card's series, read back in time order
    sa.Index(None, "node_id", "gpu_index", "sampled_at"),
    # the source filter (H-20), and retention cleanup by time
    sa.Index(None, "source"),
    sa.Index(None, "sampled_at"),
    # the changed rows only: failure scans, decreases and the capability matrix read a small fraction of the table
    sa.Index(
        "ix_gpu_health_samples_changes",
        "source",
        "node_id",
        "gpu_index",
        "uuid",
        "sampled_at",
        postgresql_where=sa.text("changed"),
        sqlite_where=sa.text("changed = 1"),
    ),
    # the uuid or uncorrectable-ECC changes only, in the failure scan's window order: the failure scan and the
    # distinct card lists read about one row per card
    sa.Index(
        "ix_gpu_health_samples_ue_changes",
        "source",
        "node_id",
        "gpu_index",
        "uuid",
        "sampled_at",
        postgresql_where=sa.text("ue_changed"),
        sqlite_where=sa.text("ue_changed = 1"),
    ),
)

# Per card and hour, and per card and UTC day: how many samples, when, and how many carried each counter. Written
# with the samples (and rebuilt where retention cuts a bucket), so the capability matrix reads about one row per
# card and day instead of every sample of the retention period.
gpu_health_card_buckets = sa.Table(
    "gpu_health_card_buckets",
    metadata,
    sa.Column("span_seconds", sa.Integer(), primary_key=True),  # 3600 or 86400
    sa.Column("source", sa.String(16), primary_key=True),
    sa.Column("node_id", sa.String(36), sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("gpu_index", sa.Integer(), primary_key=True),
    sa.Column("uuid_key", sa.String(128), primary_key=True),  # the card's uuid; '' for an unknown uuid
    sa.Column("bucket_start", UtcDateTime(), primary_key=True),
    sa.Column("first_sample_at", UtcDateTime(), nullable=False),
    sa.Column("last_sample_at", UtcDateTime(), nullable=False),
    sa.Column("sample_count", sa.BigInteger(), nullable=False),
    sa.Column("semantics_unconfirmed", sa.String(200), nullable=True),  # the greatest value in the bucket
    *(sa.Column(name, sa.BigInteger(), nullable=False) for name in HEALTH_KEYS),  # non-NULL values; 0008 pins them
    sa.CheckConstraint(SOURCE_CHECK, name="source"),
    # the capability matrix: one span, one source, a range of buckets
    sa.Index(None, "span_seconds", "source", "bucket_start"),
)

gpu_xid_events = sa.Table(
    "gpu_xid_events",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("node_id", sa.String(36), sa.ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    sa.Column("gpu_index", sa.Integer(), nullable=False),
    sa.Column("uuid", sa.String(128), nullable=True),
    sa.Column("xid", sa.Integer(), nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("occurred_at", UtcDateTime(), nullable=False),
    sa.Column("received_at", UtcDateTime(), nullable=False),
    sa.CheckConstraint(SOURCE_CHECK, name="source"),
    # an agent re-sends unacknowledged events; the same event is stored once
    sa.UniqueConstraint("node_id", "gpu_index", "xid", "occurred_at"),
    sa.Index(None, "source", "occurred_at"),
)

predictions = sa.Table(
    "gpu_fault_predictions",
    metadata,
    # derived from (node, index, uuid, source, rule version, window, t0): overlapping workers insert one row
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("node_id", sa.String(36), sa.ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    sa.Column("gpu_index", sa.Integer(), nullable=False),
    sa.Column("uuid", sa.String(128), nullable=True),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("rule_version", sa.String(32), nullable=False),
    sa.Column("window_days", sa.Integer(), nullable=False),
    sa.Column("t0", UtcDateTime(), nullable=False),
    sa.Column("window_end", UtcDateTime(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("signals", sa.String(200), nullable=False),
    sa.Column("evidence", sa.Text(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("judged_at", UtcDateTime(), nullable=True),
    sa.Column("conclusion", sa.Text(), nullable=True),
    sa.Column("failure_at", UtcDateTime(), nullable=True),
    sa.Column("alert_id", sa.String(36), nullable=True),
    sa.CheckConstraint(SOURCE_CHECK, name="source"),
    sa.CheckConstraint("status IN ('pending', 'hit', 'miss', 'voided')", name="status"),
    sa.Index(None, "node_id", "gpu_index", "source", "t0"),
    sa.Index(None, "status", "window_end"),
    sa.Index(None, "source", "window_days", "t0"),
)

alerts = sa.Table(
    "alerts",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("severity", sa.String(16), nullable=False),
    # no foreign key: an alert outlives its node as history; deleting the node resolves it (orphan sweep)
    sa.Column("node_id", sa.String(36), nullable=False),
    sa.Column("node_name", sa.String(253), nullable=False),
    sa.Column("tenant_id", sa.String(36), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("message", sa.Text(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("resolved_at", UtcDateTime(), nullable=True),
    sa.Column("resolved_by", sa.String(200), nullable=True),
    sa.Column("resolution", sa.Text(), nullable=True),
    sa.Column("backlog_since", UtcDateTime(), nullable=True),
    sa.CheckConstraint("status IN ('open', 'resolved')", name="status"),
    sa.Index(None, "status", "created_at"),
    sa.Index(None, "node_id", "type"),
    # node-scoped dedup: at most one open alert of a type per node, whoever races to create it
    sa.Index(
        "uq_alerts_open_per_node",
        "node_id",
        "type",
        unique=True,
        postgresql_where=sa.text("status = 'open'"),
        sqlite_where=sa.text("status = 'open'"),
    ),
)

alert_events = sa.Table(
    "alert_events",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("alert_id", sa.String(36), sa.ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False),
    sa.Column("at", UtcDateTime(), nullable=False),
    sa.Column("actor", sa.String(200), nullable=False),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("note", sa.Text(), nullable=False),
    sa.Index(None, "alert_id", "at"),
)

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("holder", sa.String(128), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
)

#: per-minute aggregates of the heartbeat's GPU metrics (short retention; the job's business, not the card's health)
METRIC_COLUMNS = ("temperature_c", "utilization_pct", "memory_used_mib", "memory_total_mib", "power_w")

gpu_metrics_minutes = sa.Table(
    "gpu_metrics_minutes",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("node_id", sa.String(36), sa.ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    sa.Column("gpu_index", sa.Integer(), nullable=False),
    sa.Column("uuid", sa.String(128), nullable=True),
    sa.Column("source", sa.String(16), nullable=False),
    # the minute's start; no unique key: beats of one minute that reached two servers make two rows, reads merge
    sa.Column("minute", UtcDateTime(), nullable=False),
    sa.Column("samples", sa.Integer(), nullable=False),
    *[
        sa.Column(f"{name}_{part}", sa.Float(), nullable=True)  # NULL = unknown all minute, never 0
        for name in METRIC_COLUMNS
        for part in ("min", "avg", "max")
    ],
    *[sa.Column(f"{name}_n", sa.Integer(), nullable=True) for name in METRIC_COLUMNS],
    sa.CheckConstraint(SOURCE_CHECK, name="source"),
    sa.Index(None, "node_id", "gpu_index", "minute"),
    sa.Index(None, "minute"),  # retention cleanup
)
