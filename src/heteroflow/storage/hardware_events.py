"""The serving controller's hardware fault source, read from the health tables: XID events and increases of a
card's uncorrectable-ECC or row-remap-failure counter, page by page from a cursor (``engine-protocol.md``,
"Hardware fault source 2"; served by ``platform_server/routes/hardware_events.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId, Source
from heteroflow.platform.auth import NodeScope
from heteroflow.storage.db import unavailable_as_store_error
from heteroflow.storage.schema import gpu_health_samples as samples_t
from heteroflow.storage.schema import gpu_xid_events as xid_t
from heteroflow.storage.schema import nodes as nodes_t
from heteroflow.storage.scope import in_scope

HardwareEventKind = Literal["xid", "ecc_uncorrected", "remap_failure"]


@dataclass(frozen=True, slots=True)
class CardHardwareEvent:
    """One XID event, or one increase of a card's uncorrectable-ECC or row-remap-failure counter (the
    controller's hardware fault source; ``engine-protocol.md``, "Hardware fault source 2")."""

    node_id: NodeId
    node_name: str
    gpu_index: int
    uuid: str | None
    kind: HardwareEventKind
    value: int
    """The XID code, or the counter's new value."""
    previous: int | None
    """The counter's value before the increase (``None`` for an XID)."""
    at: datetime
    """When it happened: the XID's time, or the sample that showed the increase."""
    tenant_id: str | None = None
    """The node's tenant (``None``: a node without one)."""
    card_known: bool = True
    """Whether the node reported this card (its uuid) in a health reading before: an XID naming a uuid the node
    never reported is no evidence about any card the serving plane runs on."""
    reported_at: datetime | None = None
    """When the server got it: the XID's receive time, or the sample's time (``None``: not known)."""
    speaker_since: datetime | None = None
    """When the node's credential was last re-issued (after its registration): who speaks for the node changed
    then. ``None`` when it never was."""


@dataclass(frozen=True, slots=True)
class HardwareEventPage:
    events: list[CardHardwareEvent]
    xid_cursor: int
    """Every XID row up to this id has been read (or was invisible to the caller)."""
    sample_cursor: int
    """Every health-sample row up to this id has been read (or was invisible to the caller)."""
    more: bool
    """A page limit was reached: ask again from the cursors at once."""


def read_hardware_events(
    engine: Engine,
    *,
    scope: NodeScope,
    source: Source,
    after: tuple[int, int] | None,
    since: datetime | None,
    limit: int,
) -> HardwareEventPage:
    """XID events and uncorrectable-ECC / remap-failure increases, oldest row first, from a cursor.

    ``after`` is (last XID id, last sample id) already read; without it, rows since ``since`` (XIDs by
    receive time, samples by sample time); without either, nothing: the cursors of the tables' current ends.
    At most ``limit`` rows of each table are read per page. An increase compares a changed sample with its
    slot's previous sample, only when both values are known and the card (uuid) is the same: unknown is never
    0 (H-1), and a swapped card is a new card, not a failing one. Ids above the ceiling read first are left
    for the next page, so rows committed during the call are never skipped by the cursor.
    """
    with unavailable_as_store_error(), engine.connect() as conn:
        # the ends of the caller's own rows: another tenant's activity never moves a tenant's cursor
        xid_ceiling = int(conn.scalar(sa.select(sa.func.max(xid_t.c.id)).where(*in_scope(xid_t.c.node_id, scope))) or 0)
        sample_ceiling = int(
            conn.scalar(sa.select(sa.func.max(samples_t.c.id)).where(*in_scope(samples_t.c.node_id, scope))) or 0
        )
        if after is None and since is None:
            return HardwareEventPage(events=[], xid_cursor=xid_ceiling, sample_cursor=sample_ceiling, more=False)
        xid_start = xid_t.c.id > after[0] if after is not None else xid_t.c.received_at >= since
        seen = samples_t.alias("seen")
        card_known = sa.or_(
            xid_t.c.uuid.is_(None),
            sa.exists().where(seen.c.node_id == xid_t.c.node_id, seen.c.uuid == xid_t.c.uuid, seen.c.ue_changed),
        )  # every card's first row is ue_changed: one indexed probe per event
        xid_query = (
            sa.select(
                xid_t,
                nodes_t.c.name.label("node_name"),
                nodes_t.c.tenant_id.label("tenant_id"),
                card_known.label("card_known"),
                nodes_t.c.registered_at.label("node_registered_at"),
                nodes_t.c.credential_issued_at.label("credential_issued_at"),
            )
            .join(nodes_t, nodes_t.c.id == xid_t.c.node_id)
            .where(
                xid_t.c.source == source,
                xid_t.c.id <= xid_ceiling,
                xid_start,
                *in_scope(xid_t.c.node_id, scope),
            )
            .order_by(xid_t.c.id)
            .limit(limit + 1)
        )
        xid_rows = conn.execute(xid_query).all()
        prev = samples_t.alias("prev")

        def previous(column: str) -> sa.ScalarSelect[Any]:
            return (
                sa.select(prev.c[column])
                .where(
                    prev.c.node_id == samples_t.c.node_id,
                    prev.c.gpu_index == samples_t.c.gpu_index,
                    prev.c.source == samples_t.c.source,
                    sa.or_(
                        prev.c.sampled_at < samples_t.c.sampled_at,
                        sa.and_(prev.c.sampled_at == samples_t.c.sampled_at, prev.c.id < samples_t.c.id),
                    ),
                )
                .order_by(prev.c.sampled_at.desc(), prev.c.id.desc())
                .limit(1)
                .scalar_subquery()
            )

        sample_start = samples_t.c.id > after[1] if after is not None else samples_t.c.sampled_at >= since
        sample_query = (
            sa.select(
                samples_t.c.id,
                samples_t.c.node_id,
                nodes_t.c.name.label("node_name"),
                nodes_t.c.tenant_id.label("tenant_id"),
                nodes_t.c.registered_at.label("node_registered_at"),
                nodes_t.c.credential_issued_at.label("credential_issued_at"),
                samples_t.c.gpu_index,
                samples_t.c.uuid,
                samples_t.c.sampled_at,
                samples_t.c.ecc_uncorrected_total,
                samples_t.c.remapped_rows_failure,
                previous("uuid").label("prev_uuid"),
                previous("ecc_uncorrected_total").label("prev_ecc_uncorrected_total"),
                previous("remapped_rows_failure").label("prev_remapped_rows_failure"),
            )
            .join(nodes_t, nodes_t.c.id == samples_t.c.node_id)
            .where(
                samples_t.c.changed,  # a keepalive row repeats its predecessor: never an increase
                samples_t.c.source == source,
                samples_t.c.id <= sample_ceiling,
                sample_start,
                *in_scope(samples_t.c.node_id, scope),
            )
            .order_by(samples_t.c.id)
            .limit(limit + 1)
        )
        sample_rows = conn.execute(sample_query).all()
    xid_more, sample_more = len(xid_rows) > limit, len(sample_rows) > limit
    xid_rows, sample_rows = xid_rows[:limit], sample_rows[:limit]
    events = [
        CardHardwareEvent(
            node_id=NodeId(r.node_id),
            node_name=r.node_name,
            gpu_index=r.gpu_index,
            uuid=r.uuid,
            kind="xid",
            value=r.xid,
            previous=None,
            at=r.occurred_at,
            tenant_id=r.tenant_id,
            card_known=bool(r.card_known),
            reported_at=r.received_at,
            speaker_since=_speaker_since(r),
        )
        for r in xid_rows
    ]
    for r in sample_rows:
        if r.prev_uuid != r.uuid:
            continue
        kinds: tuple[tuple[HardwareEventKind, str], ...] = (
            ("ecc_uncorrected", "ecc_uncorrected_total"),
            ("remap_failure", "remapped_rows_failure"),
        )
        for kind, column in kinds:
            value, before = getattr(r, column), getattr(r, f"prev_{column}")
            if value is not None and before is not None and value > before:
                events.append(
                    CardHardwareEvent(
                        node_id=NodeId(r.node_id),
                        node_name=r.node_name,
                        gpu_index=r.gpu_index,
                        uuid=r.uuid,
                        kind=kind,
                        value=value,
                        previous=before,
                        at=r.sampled_at,
                        tenant_id=r.tenant_id,
                        reported_at=r.sampled_at,
                        speaker_since=_speaker_since(r),
                    )
                )
    events.sort(key=lambda e: e.at)
    return HardwareEventPage(
        events=events,
        xid_cursor=int(xid_rows[-1].id) if xid_more else xid_ceiling,
        sample_cursor=int(sample_rows[-1].id) if sample_more else sample_ceiling,
        more=xid_more or sample_more,
    )


def _speaker_since(row: Any) -> datetime | None:
    """The node's credential's last re-issue (after its registration), from a row with the node's columns."""
    issued: datetime | None = row.credential_issued_at
    return issued if issued is not None and issued > row.node_registered_at else None
