"""Per-card hour and day summaries of the health samples (``gpu_health_card_buckets``): the capability matrix.

Each bucket holds, for one card (source, node, index, uuid) and one UTC hour or day, how many samples it has, its
first and last sample time, the greatest ``semantics_unconfirmed`` value and, per counter, how many samples
carried a non-NULL value. They are written in the samples' own transaction and rebuilt from the samples wherever
retention cuts one, so a bucket always sums exactly the stored samples inside it.

A period [since, until] is read as whole days, then whole hours at both ends, then the raw samples of the
partial hours left: at 1,000 cards, about one row per card and day instead of 288.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection

from heteroflow.health.counters import HEALTH_KEYS
from heteroflow.platform.auth import NodeScope
from heteroflow.storage.db import json_rows
from heteroflow.storage.schema import gpu_health_card_buckets as buckets_t
from heteroflow.storage.schema import gpu_health_samples as samples_t
from heteroflow.storage.schema import nodes as nodes_t
from heteroflow.storage.scope import in_scope

HOUR = 3600
DAY = 86400
SPANS = (HOUR, DAY)
CapabilitySort = Literal["node", "stalled_first", "recent_first"]
CAPABILITY_SORTS: tuple[CapabilitySort, ...] = ("node", "stalled_first", "recent_first")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def floor_to(at: datetime, span: int) -> datetime:
    seconds = int((at - _EPOCH).total_seconds() // span) * span
    return _EPOCH + timedelta(seconds=seconds)


def ceil_to(at: datetime, span: int) -> datetime:
    """The first bucket start at or after ``at``; in the calendar's last bucket, the calendar's end (no whole
    bucket lies after it: the caller reads raw samples there)."""
    floor = floor_to(at, span)
    if floor == at:
        return floor
    try:
        return floor + timedelta(seconds=span)
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)


def bucket_rows(samples: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The bucket increments of sample rows (as inserted): one row per card, span and bucket, in key order."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in samples:
        for span in SPANS:
            key = (
                span,
                row["source"],
                row["node_id"],
                row["gpu_index"],
                row["uuid"] or "",
                floor_to(row["sampled_at"], span),
            )
            at = row["sampled_at"]
            sem = row.get("semantics_unconfirmed")
            current = merged.get(key)
            if current is None:
                merged[key] = {
                    "span_seconds": span,
                    "source": key[1],
                    "node_id": key[2],
                    "gpu_index": key[3],
                    "uuid_key": key[4],
                    "bucket_start": key[5],
                    "first_sample_at": at,
                    "last_sample_at": at,
                    "sample_count": 1,
                    "semantics_unconfirmed": sem,
                    **{name: int(row.get(name) is not None) for name in HEALTH_KEYS},
                }
                continue
            current["first_sample_at"] = min(current["first_sample_at"], at)
            current["last_sample_at"] = max(current["last_sample_at"], at)
            current["sample_count"] += 1
            if sem is not None and (current["semantics_unconfirmed"] is None or sem > current["semantics_unconfirmed"]):
                current["semantics_unconfirmed"] = sem
            for name in HEALTH_KEYS:
                current[name] += int(row.get(name) is not None)
    return [merged[key] for key in sorted(merged, key=lambda k: (k[0], k[1], k[2], k[3], k[4], k[5]))]


def _greater(old: Any, new: Any) -> Any:
    """The greater of two values where NULL is the least (portable: no GREATEST on SQLite)."""
    return sa.case((old.is_(None), new), (new.is_(None), old), (new > old, new), else_=old)


def _pg_bucket_upsert() -> sa.TextClause:
    """PostgreSQL's upsert of bucket increments given as one JSON array (``:rows``), applied in array order.

    One parameter whatever the number of rows: bound one value at a time, the upsert's ~20 parameters per row
    cost psycopg more CPU than PostgreSQL spent on the statement. Same arithmetic as the portable statement
    below (GREATEST and LEAST ignore NULL, as :func:`_greater` does).
    """
    names = [c.name for c in buckets_t.c]
    keys = [c.name for c in buckets_t.primary_key.columns]
    updates = [
        "first_sample_at = LEAST(t.first_sample_at, EXCLUDED.first_sample_at)",
        "last_sample_at = GREATEST(t.last_sample_at, EXCLUDED.last_sample_at)",
        "sample_count = t.sample_count + EXCLUDED.sample_count",
        "semantics_unconfirmed = GREATEST(t.semantics_unconfirmed, EXCLUDED.semantics_unconfirmed)",
        *(f"{name} = t.{name} + EXCLUDED.{name}" for name in HEALTH_KEYS),
    ]
    # every name comes from the schema, none from input
    return sa.text(
        f"INSERT INTO {buckets_t.name} AS t ({', '.join(names)}) "  # noqa: S608
        f"SELECT {', '.join(f'b.{name}' for name in names)} "
        f"FROM json_array_elements(CAST(:rows AS json)) WITH ORDINALITY AS e(value, ord), "
        f"json_populate_record(NULL::{buckets_t.name}, e.value) AS b ORDER BY e.ord "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {', '.join(updates)}"
    )


_PG_BUCKET_UPSERT = _pg_bucket_upsert()


def add_to_buckets(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Add inserted sample rows to their buckets (in key order, so concurrent writers never deadlock)."""
    increments = bucket_rows(rows)
    if not increments:
        return
    if conn.dialect.name == "postgresql":
        for start in range(0, len(increments), 5000):
            conn.execute(_PG_BUCKET_UPSERT, {"rows": json_rows(increments[start : start + 5000])})
        return
    statement = _sqlite_bucket_upsert()
    for start in range(0, len(increments), 5000):
        conn.execute(statement, increments[start : start + 5000])


@functools.cache
def _sqlite_bucket_upsert() -> Any:
    """SQLite: the buckets' upsert (an increment adds to its bucket), built once. Built per batch it took ~0.4 ms of
    the writer thread's Python and left ~200 objects of cyclic garbage (the ``excluded`` alias, its column proxies)
    for the collector, whose pauses hold the event loop too."""
    insert = sqlite.insert(buckets_t)
    new = insert.excluded
    old = buckets_t.c
    return insert.on_conflict_do_update(
        index_elements=[c.name for c in buckets_t.primary_key.columns],
        set_={
            "first_sample_at": sa.case(
                (new.first_sample_at < old.first_sample_at, new.first_sample_at), else_=old.first_sample_at
            ),
            "last_sample_at": sa.case(
                (new.last_sample_at > old.last_sample_at, new.last_sample_at), else_=old.last_sample_at
            ),
            "sample_count": old.sample_count + new.sample_count,
            "semantics_unconfirmed": _greater(old.semantics_unconfirmed, new.semantics_unconfirmed),
            **{name: old[name] + new[name] for name in HEALTH_KEYS},
        },
    )


def _raw_summary(start: datetime, end: datetime, *, end_inclusive: bool) -> sa.Select[Any]:
    """Bucket-shaped rows of the samples in [start, end) (or [start, end]), one per card."""
    uuid_key = sa.func.coalesce(samples_t.c.uuid, "")
    bound = samples_t.c.sampled_at <= end if end_inclusive else samples_t.c.sampled_at < end
    return (
        sa.select(
            samples_t.c.source,
            samples_t.c.node_id,
            samples_t.c.gpu_index,
            uuid_key.label("uuid_key"),
            sa.func.min(samples_t.c.sampled_at).label("first_sample_at"),
            sa.func.max(samples_t.c.sampled_at).label("last_sample_at"),
            sa.func.count().label("sample_count"),
            sa.func.max(samples_t.c.semantics_unconfirmed).label("semantics_unconfirmed"),
            *(sa.func.count(samples_t.c[name]).label(name) for name in HEALTH_KEYS),
        )
        .where(samples_t.c.sampled_at >= start, bound)
        .group_by(samples_t.c.source, samples_t.c.node_id, samples_t.c.gpu_index, uuid_key)
    )


def rebuild_buckets(conn: Connection, start: datetime, end: datetime, *, spans: Sequence[int] = SPANS) -> None:
    """Recompute every bucket of ``spans`` that overlaps [start, end) from the samples (a bulk load, a cut)."""
    for span in spans:
        first = floor_to(start, span)
        conn.execute(
            sa.delete(buckets_t).where(
                buckets_t.c.span_seconds == span, buckets_t.c.bucket_start >= first, buckets_t.c.bucket_start < end
            )
        )
        at = first
        while at < end:
            upper = at + timedelta(seconds=span)
            summary = _raw_summary(at, upper, end_inclusive=False).subquery()
            conn.execute(
                sa.insert(buckets_t).from_select(
                    ["span_seconds", "bucket_start", *(c.name for c in summary.c)],
                    sa.select(
                        sa.literal(span, sa.Integer()), sa.literal(at, buckets_t.c.bucket_start.type), *summary.c
                    ),
                )
            )
            at = upper


def cut_buckets(conn: Connection, cutoff: datetime) -> None:
    """After the samples older than ``cutoff`` were deleted: drop the buckets wholly before it and rebuild the
    one of each span that it cuts through."""
    for span in SPANS:
        width = timedelta(seconds=span)
        conn.execute(
            sa.delete(buckets_t).where(buckets_t.c.span_seconds == span, buckets_t.c.bucket_start <= cutoff - width)
        )
        if floor_to(cutoff, span) < cutoff:
            rebuild_buckets(conn, cutoff, floor_to(cutoff, span) + width, spans=(span,))


@dataclass(frozen=True, slots=True)
class CapabilityQuery:
    """Which cards of the capability matrix, in which order, which page."""

    scope: NodeScope
    source: str
    since: datetime
    until: datetime
    stalled_before: datetime | None = None
    """Cards whose last sample is before this are stalled (needed by ``stalled`` and the sort)."""
    stalled: bool | None = None
    node_id: str | None = None
    q: str | None = None
    sort: CapabilitySort = "node"
    limit: int | None = None
    offset: int = 0
    count_unknowns: bool = True
    """Count, per counter, the matching cards that never had it known (window sums over every matching card). A
    caller that reads every matching card anyway counts them itself, cheaper."""
    unknown: str | None = None
    """``any``: cards with at least one counter never known in the period; a counter's key: cards for which that
    counter was never known. None: every card."""


def _pieces(since: datetime, until: datetime) -> list[sa.Select[Any]]:
    """Days, then hours at the ends, then raw samples of the partial hours: the period as bucket-shaped rows."""
    selects: list[sa.Select[Any]] = []

    def buckets(span: int, start: datetime, end: datetime) -> None:
        selects.append(
            sa.select(
                *(
                    buckets_t.c[c]
                    for c in (
                        "source",
                        "node_id",
                        "gpu_index",
                        "uuid_key",
                        "first_sample_at",
                        "last_sample_at",
                        "sample_count",
                        "semantics_unconfirmed",
                        *HEALTH_KEYS,
                    )
                )
            ).where(buckets_t.c.span_seconds == span, buckets_t.c.bucket_start >= start, buckets_t.c.bucket_start < end)
        )

    def raw(start: datetime, end: datetime, *, end_inclusive: bool) -> None:
        if start < end or (end_inclusive and start == end):
            selects.append(_raw_summary(start, end, end_inclusive=end_inclusive))

    def hours(start: datetime, end: datetime, *, end_inclusive: bool) -> None:
        first, last = ceil_to(start, HOUR), floor_to(end, HOUR)
        if first < last:
            buckets(HOUR, first, last)
            raw(start, first, end_inclusive=False)
            raw(last, end, end_inclusive=end_inclusive)
        else:
            raw(start, end, end_inclusive=end_inclusive)

    first_day, last_day = ceil_to(since, DAY), floor_to(until, DAY)
    if first_day < last_day:
        buckets(DAY, first_day, last_day)
        hours(since, first_day, end_inclusive=False)
        hours(last_day, until, end_inclusive=True)
    else:
        hours(since, until, end_inclusive=True)
    return selects


def _source_is(column: sa.ColumnElement[Any], source: str) -> sa.ColumnElement[bool]:
    """The source filter of a piece. On the samples table it is an expression, not the bare column: SQLite, without
    ANALYZE statistics, would otherwise read the partial hours' samples through the source index (one value for
    nearly every row) instead of the sampled_at range — every sample of every card, 1.6 s at 1,000 cards."""
    if column is samples_t.c.source:
        return sa.func.coalesce(column, "") == source
    return column == source


def capability_query(query: CapabilityQuery) -> sa.Select[Any]:
    """One row per card in the period, filtered, ordered and paged, with ``total`` (the count before paging)."""
    pieces = [
        piece.where(
            _source_is(piece.selected_columns.source, query.source),
            *in_scope(piece.selected_columns.node_id, query.scope),
        )
        for piece in _pieces(query.since, query.until)
    ]
    if not pieces:
        pieces = [_raw_summary(query.since, query.since, end_inclusive=False)]
    union = sa.union_all(*pieces).subquery("periods")
    last = sa.func.max(union.c.last_sample_at)
    cards = sa.select(
        union.c.node_id,
        union.c.gpu_index,
        union.c.uuid_key,
        sa.func.min(union.c.first_sample_at).label("first_sample_at"),
        last.label("last_sample_at"),
        sa.func.sum(union.c.sample_count).label("sample_count"),
        sa.func.max(union.c.semantics_unconfirmed).label("semantics_unconfirmed"),
        *(sa.func.sum(union.c[name]).label(name) for name in HEALTH_KEYS),
    ).group_by(union.c.node_id, union.c.gpu_index, union.c.uuid_key)
    if query.node_id is not None:
        cards = cards.where(union.c.node_id == query.node_id)
    if query.stalled is not None and query.stalled_before is not None:
        cards = cards.having(last < query.stalled_before if query.stalled else last >= query.stalled_before)
    grouped = cards.subquery("cards")
    joined = grouped.join(nodes_t, nodes_t.c.id == grouped.c.node_id, isouter=True)
    conditions = []
    needle = (query.q or "").strip().lower()
    if needle:
        pattern = "%" + needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        conditions.append(
            sa.or_(
                sa.func.lower(grouped.c.uuid_key).like(pattern, escape="\\"),
                sa.func.lower(sa.func.coalesce(nodes_t.c.name, "")).like(pattern, escape="\\"),
            )
        )
    # per counter, how many of the cards matching the other filters never had it known: counted before the
    # ``unknown`` filter, so that the counts are the fleet's whatever the filter shows
    unknown_counts = [
        sa.func.sum(sa.case((grouped.c[name] == 0, 1), else_=0)).over().label(f"unknown_{name}") for name in HEALTH_KEYS
    ]
    matching_select = (
        sa.select(*grouped.c, nodes_t.c.name.label("node_name"), *unknown_counts).select_from(joined).where(*conditions)
    )
    if query.unknown is None:
        # no unknown filter: one level, ordered on the join itself (as fast as the matrix was without counts)
        by_node = (nodes_t.c.name, grouped.c.node_id, grouped.c.gpu_index, grouped.c.last_sample_at)
        order = {
            "node": by_node,
            "stalled_first": (grouped.c.last_sample_at, *by_node),
            "recent_first": (grouped.c.last_sample_at.desc(), *by_node),
        }[query.sort]
        page = matching_select.add_columns(sa.func.count().over().label("total")).order_by(*order).offset(query.offset)
        return page.limit(query.limit) if query.limit is not None else page
    # the counts are of every card the other filters keep: the unknown filter applies one level up
    matching = matching_select.subquery("matching")
    unknown_filter = (
        sa.or_(*(matching.c[name] == 0 for name in HEALTH_KEYS))
        if query.unknown == "any"
        else matching.c[query.unknown] == 0
    )
    by_matching = (matching.c.node_name, matching.c.node_id, matching.c.gpu_index, matching.c.last_sample_at)
    matching_order = {
        "node": by_matching,
        "stalled_first": (matching.c.last_sample_at, *by_matching),
        "recent_first": (matching.c.last_sample_at.desc(), *by_matching),
    }[query.sort]
    filtered = (
        sa.select(*matching.c, sa.func.count().over().label("total"))
        .where(unknown_filter)
        .order_by(*matching_order)
        .offset(query.offset)
    )
    return filtered.limit(query.limit) if query.limit is not None else filtered
