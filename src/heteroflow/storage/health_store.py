"""SQL storage of GPU health samples and XID events: the ingestion write side and the read queries."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from heteroflow.core.ids import NodeId, Source
from heteroflow.health.counters import HEALTH_KEYS, Counters, join_keys, split_keys
from heteroflow.health.heartbeat import ParsedXid
from heteroflow.health.samples import CardKey, HealthReading, StoredSample
from heteroflow.platform.auth import NodeScope
from heteroflow.storage.db import insert_rows, unavailable_as_store_error
from heteroflow.storage.hardware_events import HardwareEventPage, read_hardware_events
from heteroflow.storage.health_buckets import CapabilityQuery, add_to_buckets, capability_query, cut_buckets
from heteroflow.storage.schema import EXISTING_NODE_IDS
from heteroflow.storage.schema import gpu_health_samples as samples_t
from heteroflow.storage.schema import gpu_xid_events as xid_t
from heteroflow.storage.schema import nodes as nodes_t


@dataclass(frozen=True, slots=True)
class CardCapability:
    """What one card (node, index, uuid, source) reported in a period (H-4, capability matrix)."""

    node_id: NodeId
    gpu_index: int
    uuid: str | None
    collectable: dict[str, bool]
    first_sample_at: datetime
    last_sample_at: datetime
    sample_count: int
    semantics_unconfirmed: tuple[str, ...] = ()
    node_name: str | None = None


@dataclass(frozen=True, slots=True)
class CapabilityPage:
    cards: list[CardCapability]
    total: int
    """Cards matching the filters, before paging."""
    unknown_counts: dict[str, int] = field(default_factory=dict)
    """Per counter, the cards matching the filters other than ``unknown`` that never had it known in the period."""


@dataclass(frozen=True, slots=True)
class XidEventRecord:
    """One stored XID event of a card."""

    gpu_index: int
    uuid: str | None
    xid: int
    occurred_at: datetime
    received_at: datetime


def _row_to_sample(row: Any) -> StoredSample:
    return StoredSample(
        key=CardKey(node_id=NodeId(row.node_id), gpu_index=row.gpu_index, source=row.source),
        uuid=row.uuid,
        sampled_at=row.sampled_at,
        counters=Counters(**{name: getattr(row, name) for name in HEALTH_KEYS}),
        semantics_unconfirmed=split_keys(row.semantics_unconfirmed),
    )


def _latest_query(key: CardKey, *, not_after: datetime | None) -> sa.Select[Any]:
    bound = [] if not_after is None else [samples_t.c.sampled_at <= not_after]
    return (
        sa.select(samples_t)
        .where(
            samples_t.c.node_id == key.node_id,
            samples_t.c.gpu_index == key.gpu_index,
            samples_t.c.source == key.source,
            *bound,
        )
        .order_by(samples_t.c.sampled_at.desc(), samples_t.c.id.desc())
        .limit(1)
    )


def _latest(conn: Connection, key: CardKey, *, not_after: datetime | None = None) -> StoredSample | None:
    row = conn.execute(_latest_query(key, not_after=not_after)).first()
    return _row_to_sample(row) if row is not None else None


LATEST_PER_STATEMENT = 64
"""Card slots whose newest row one statement reads (:meth:`SqlHealthSampleStore.latest_many`)."""


@functools.lru_cache(maxsize=2 * LATEST_PER_STATEMENT)
def _latest_many_query(size: int, *, bounded: bool) -> sa.Select[Any] | sa.CompoundSelect[Any]:
    """The newest row of ``size`` slots (bound parameters ``n<k>``, ``i<k>``, ``s<k>`` and ``not_after``): each
    slot's own indexed ``LIMIT 1`` read, joined by ``UNION ALL``; built once per size, not per batch."""
    branches = []
    for n in range(size):
        bound = [samples_t.c.sampled_at <= sa.bindparam("not_after")] if bounded else []
        branch = (
            sa.select(samples_t)
            .where(
                samples_t.c.node_id == sa.bindparam(f"n{n}"),
                samples_t.c.gpu_index == sa.bindparam(f"i{n}"),
                samples_t.c.source == sa.bindparam(f"s{n}"),
                *bound,
            )
            .order_by(samples_t.c.sampled_at.desc(), samples_t.c.id.desc())
            .limit(1)
        )
        branches.append(sa.select(branch.subquery()))
    return branches[0] if size == 1 else sa.union_all(*branches)


def _pg_latest_many(*, bounded: bool) -> sa.TextualSelect:
    """PostgreSQL: the newest row of each slot of the JSON array ``:slots`` (``n``, ``i``, ``s``), each slot's own
    indexed ``LIMIT 1`` read (a lateral join), rows at or before ``:not_after`` when ``bounded``."""
    bound = "AND g.sampled_at <= :not_after " if bounded else ""
    statement = sa.text(
        # the table's name comes from the schema, none from input
        "SELECT g.* FROM json_to_recordset(CAST(:slots AS json)) AS k(n text, i int, s text) "  # noqa: S608
        f"CROSS JOIN LATERAL (SELECT * FROM {samples_t.name} AS g "
        f"WHERE g.node_id = k.n AND g.gpu_index = k.i AND g.source = k.s {bound}"
        "ORDER BY g.sampled_at DESC, g.id DESC LIMIT 1) AS g"
    )
    if bounded:
        statement = statement.bindparams(sa.bindparam("not_after", type_=samples_t.c.sampled_at.type))
    return statement.columns(*samples_t.c)


_PG_LATEST_MANY = {bounded: _pg_latest_many(bounded=bounded) for bounded in (False, True)}


class SqlHealthSampleStore:
    """Implements :class:`heteroflow.health.store.HealthSampleStore` and the read side of the API."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # -- write side ---------------------------------------------------------------------------------------

    def latest(self, key: CardKey, *, not_after: datetime | None = None) -> StoredSample | None:
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return _latest(conn, key, not_after=not_after)

    def latest_many(
        self, keys: Sequence[CardKey], *, not_after: datetime | None = None
    ) -> dict[CardKey, StoredSample | None]:
        """The newest stored row of each slot, as :meth:`latest` gives it, on one connection: on PostgreSQL one
        statement for all slots (their keys one JSON parameter, each slot's own indexed ``LIMIT 1`` read in a
        lateral join), elsewhere one per :data:`LATEST_PER_STATEMENT` slots (the same reads joined by ``UNION
        ALL``): the first beats of a fleet are thousands of slots, and a statement each cost more than the write."""
        found: dict[CardKey, StoredSample | None] = dict.fromkeys(keys)
        wanted = list(found)
        with unavailable_as_store_error(), self._engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                # every slot in one statement, its keys one JSON parameter: 64 slots bound one value at a time
                # cost psycopg more than the reads
                slots = json.dumps([{"n": k.node_id, "i": k.gpu_index, "s": k.source} for k in wanted])
                bound: dict[str, object] = {"slots": slots}
                if not_after is not None:
                    bound["not_after"] = not_after
                for row in conn.execute(_PG_LATEST_MANY[not_after is not None], bound):
                    sample = _row_to_sample(row)
                    found[sample.key] = sample
                return found
            for start in range(0, len(wanted), LATEST_PER_STATEMENT):
                chunk = wanted[start : start + LATEST_PER_STATEMENT]
                params: dict[str, object] = {} if not_after is None else {"not_after": not_after}
                for n, key in enumerate(chunk):
                    params[f"n{n}"], params[f"i{n}"], params[f"s{n}"] = key.node_id, key.gpu_index, key.source
                for row in conn.execute(_latest_many_query(len(chunk), bounded=not_after is not None), params):
                    sample = _row_to_sample(row)
                    found[sample.key] = sample
        return found

    def insert(
        self, readings: Sequence[HealthReading], *, previous: Mapping[CardKey, StoredSample | None] | None = None
    ) -> list[StoredSample]:
        """Insert in one transaction; each row records whether it differs from its slot's previous row.

        ``previous`` is the newest stored row of each slot before this batch, when the caller knows it (the
        ingestion writer always does); otherwise it is read, once per slot. Rows that repeat their
        predecessor (keepalive rows) carry ``changed = false``: the decrease check reads only the changed rows,
        a small fraction of the table, and loses nothing by it. Rows whose uuid and uncorrectable-ECC value
        repeat their predecessor carry ``ue_changed = false`` too (a degrading card's corrected-ECC steps are
        changes, but never failures): the failure scan and the card lists read only the ``ue_changed`` rows —
        each card's first row, and every step of its uncorrectable-ECC value, unknown (NULL) included.
        """
        if not readings:
            return []
        node_ids = {r.key.node_id for r in readings}
        with unavailable_as_store_error(), self._engine.begin() as conn:
            # a node deleted meanwhile (perhaps through another server) loses its readings, not the batch
            existing = set(conn.scalars(EXISTING_NODE_IDS, {"ids": list(node_ids)}))
            chain: dict[CardKey, tuple[str | None, Counters] | None] = {}
            rows = []
            stored = []
            for r in readings:
                if r.key.node_id not in existing:
                    continue
                if r.key not in chain:
                    before = previous[r.key] if previous is not None and r.key in previous else _latest(conn, r.key)
                    chain[r.key] = (before.uuid, before.counters) if before is not None else None
                before_reading = chain[r.key]
                changed = before_reading != (r.uuid, r.counters)
                # the failure counters (uncorrectable ECC, rows remapped after uncorrectable errors): their steps
                ue_changed = before_reading is None or (
                    before_reading[0] != r.uuid
                    or before_reading[1].ecc_uncorrected_total != r.counters.ecc_uncorrected_total
                    or before_reading[1].remapped_rows_uncorrectable != r.counters.remapped_rows_uncorrectable
                )
                chain[r.key] = (r.uuid, r.counters)
                sampled_at = r.sampled_at.astimezone(UTC)
                semantics = join_keys(r.semantics_unconfirmed)
                # the row as it reads back (what RETURNING gave before): UTC, the stored form of the keys
                stored.append(
                    StoredSample(
                        key=r.key,
                        uuid=r.uuid,
                        sampled_at=sampled_at,
                        counters=r.counters,
                        semantics_unconfirmed=split_keys(semantics),
                    )
                )
                rows.append(
                    {
                        "node_id": r.key.node_id,
                        "gpu_index": r.key.gpu_index,
                        "source": r.key.source,
                        "uuid": r.uuid,
                        "sampled_at": sampled_at,
                        "changed": changed,
                        "ue_changed": ue_changed,
                        "semantics_unconfirmed": semantics,
                        **r.counters.as_dict(),
                    }
                )
            if not rows:
                return []
            # no RETURNING: a row reads back as it was given (its id is nobody's business here), and on
            # PostgreSQL the rows go through COPY instead of one bound parameter per value
            insert_rows(conn, samples_t, rows)
            add_to_buckets(conn, rows)
            return stored

    def delete_older_than(self, cutoff: datetime, *, timeout_sec: float) -> int:
        """Delete the rows older than ``cutoff``; first flag the row that becomes each slot's oldest.

        The scans that read flagged rows only rely on every card's first stored row carrying both flags: it
        names the card (a healthy card's later rows are all keepalive rows, so without it the card would drop
        out of the capability matrix and the statistics once its first row expired) and it holds the value the
        card's next uncorrectable-ECC step is compared with. Flagging more rows than needed is always safe.
        A slot with expiring rows has its (flagged) first row among them, so the flagged rows find the slots.
        """
        older = samples_t.alias("older")
        slots = (
            sa.select(older.c.source, older.c.node_id, older.c.gpu_index)
            .where(older.c.ue_changed, older.c.sampled_at < cutoff)
            .distinct()
            .subquery()
        )
        kept = samples_t.alias("kept")
        new_first = (
            sa.select(kept.c.id)
            .where(
                kept.c.node_id == slots.c.node_id,
                kept.c.gpu_index == slots.c.gpu_index,
                kept.c.source == slots.c.source,
                kept.c.sampled_at >= cutoff,
            )
            .order_by(kept.c.sampled_at, kept.c.id)
            .limit(1)
            .scalar_subquery()
        )
        reflag = (
            sa.update(samples_t)
            .where(
                samples_t.c.id.in_(sa.select(new_first).select_from(slots)),
                sa.not_(sa.and_(samples_t.c.changed, samples_t.c.ue_changed)),
            )
            .values(changed=True, ue_changed=True)
        )
        with unavailable_as_store_error(), self._engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text(f"SET LOCAL statement_timeout = {int(timeout_sec * 1000)}"))
            conn.execute(reflag)
            result = conn.execute(sa.delete(samples_t).where(samples_t.c.sampled_at < cutoff))
            cut_buckets(conn, cutoff)
            return int(result.rowcount or 0)

    # -- XID events -----------------------------------------------------------------------------------------

    def xid_events(
        self, *, node_id: NodeId, source: Source, gpu_index: int | None, since: datetime, limit: int
    ) -> tuple[list[XidEventRecord], bool]:
        """A node's (or one card's) XID events since ``since``, newest first; truncated when more than ``limit``."""
        conditions = [xid_t.c.node_id == node_id, xid_t.c.source == source, xid_t.c.occurred_at >= since]
        if gpu_index is not None:
            conditions.append(xid_t.c.gpu_index == gpu_index)
        query = (
            sa.select(xid_t).where(*conditions).order_by(xid_t.c.occurred_at.desc(), xid_t.c.id.desc()).limit(limit + 1)
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            rows = conn.execute(query).all()
        events = [
            XidEventRecord(
                gpu_index=r.gpu_index, uuid=r.uuid, xid=r.xid, occurred_at=r.occurred_at, received_at=r.received_at
            )
            for r in rows[:limit]
        ]
        return events, len(rows) > limit

    def insert_xid_events(
        self, events: Sequence[ParsedXid], *, node_id: NodeId, source: Source, received_at: datetime
    ) -> int:
        """Store events once each (re-sent events are ignored); return how many were new."""
        if not events:
            return 0
        rows = [
            {
                "node_id": node_id,
                "gpu_index": e.gpu_index,
                "uuid": e.uuid,
                "xid": e.xid,
                "occurred_at": e.occurred_at,
                "source": source,
                "received_at": received_at,
            }
            for e in events
        ]
        with unavailable_as_store_error(), self._engine.begin() as conn:
            insert: Any = postgresql.insert(xid_t) if conn.dialect.name == "postgresql" else sqlite.insert(xid_t)
            # rowcount is not reliable for a multi-row insert; count what RETURNING gives back
            result = conn.execute(insert.on_conflict_do_nothing().returning(xid_t.c.id), rows)
            return len(result.all())

    # -- read side ------------------------------------------------------------------------------------------

    def card_samples(
        self, *, node_id: NodeId, gpu_index: int, source: Source, since: datetime, limit: int
    ) -> tuple[list[StoredSample], bool]:
        """One card slot's samples since ``since``, ascending; the newest ``limit`` kept when truncated."""
        query = (
            sa.select(samples_t)
            .where(
                samples_t.c.node_id == node_id,
                samples_t.c.gpu_index == gpu_index,
                samples_t.c.source == source,
                samples_t.c.sampled_at >= since,
            )
            .order_by(samples_t.c.sampled_at.desc(), samples_t.c.id.desc())
            .limit(limit + 1)
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            rows = conn.execute(query).all()
        truncated = len(rows) > limit
        return [_row_to_sample(row) for row in reversed(rows[:limit])], truncated

    def capabilities(
        self, *, scope: NodeScope, source: Source, since: datetime, until: datetime | None = None
    ) -> list[CardCapability]:
        """Per card, which counters had a non-NULL value in the period (all cards, by node and index)."""
        far = until if until is not None else datetime.max.replace(tzinfo=UTC)
        return self.capability_page(CapabilityQuery(scope=scope, source=source, since=since, until=far)).cards

    def capability_page(self, query: CapabilityQuery) -> CapabilityPage:
        """The capability matrix's cards: filtered, ordered and paged in SQL, from the hour and day buckets.

        ``until`` leaves out rows stamped later (a row further ahead of the server than any agent clock is
        believed would hide a stalled card behind a last sample in the future).
        """
        with unavailable_as_store_error(), self._engine.connect() as conn:
            rows = conn.execute(capability_query(query)).all()
            total = int(rows[0].total) if rows else 0
            counted = rows[0] if rows else None
            if not rows and query.offset > 0:  # past the end: the total from the first row
                first = conn.execute(capability_query(replace(query, offset=0, limit=1))).first()
                total, counted = (int(first.total), first) if first is not None else (0, None)
            if counted is None and query.unknown is not None and query.count_unknowns:  # none matched: count all
                counted = conn.execute(capability_query(replace(query, unknown=None, offset=0, limit=1))).first()
        cards = [
            CardCapability(
                node_id=NodeId(row.node_id),
                gpu_index=row.gpu_index,
                uuid=row.uuid_key or None,
                collectable={name: int(getattr(row, name)) > 0 for name in HEALTH_KEYS},
                first_sample_at=row.first_sample_at,
                last_sample_at=row.last_sample_at,
                sample_count=int(row.sample_count),
                semantics_unconfirmed=split_keys(row.semantics_unconfirmed),
                node_name=row.node_name,
            )
            for row in rows
        ]
        if query.count_unknowns:
            counts = {
                name: int(getattr(counted, f"unknown_{name}") or 0) if counted is not None else 0
                for name in HEALTH_KEYS
            }
        elif query.unknown is None and query.limit is None and query.offset == 0:  # every matching card is here
            counts = {name: sum(not card.collectable[name] for card in cards) for name in HEALTH_KEYS}
        else:
            counts = {}
        return CapabilityPage(cards=cards, total=total, unknown_counts=counts)

    def hardware_events(
        self,
        *,
        scope: NodeScope,
        source: Source,
        after: tuple[int, int] | None,
        since: datetime | None,
        limit: int,
    ) -> HardwareEventPage:
        """XID events and uncorrectable-ECC / remap-failure increases from a cursor (:func:`read_hardware_events`)."""
        return read_hardware_events(self._engine, scope=scope, source=source, after=after, since=since, limit=limit)


def purge_simulated(engine: Engine) -> dict[str, int]:
    """Delete every simulated row — predictions, samples, XID events, simulated nodes — and nothing real."""
    from heteroflow.storage.schema import predictions

    deleted: dict[str, int] = {}
    with unavailable_as_store_error(), engine.begin() as conn:
        for name, table in (
            ("predictions", predictions),
            ("samples", samples_t),
            ("xid_events", xid_t),
            ("nodes", nodes_t),
        ):
            deleted[name] = int(conn.execute(sa.delete(table).where(table.c.source == "simulated")).rowcount or 0)
    return deleted
