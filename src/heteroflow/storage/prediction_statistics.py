"""SQL statistics of predictions (H-50…H-52): counts per band, the exposure, and failure events.

Failure events and exposure are computed in SQL with window functions (H-52), never by reading every card's
series into Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.core.ids import Source
from heteroflow.health.counters import split_keys
from heteroflow.health.predictions import COUNTED_XIDS, FAILURE_COUNTERS
from heteroflow.health.statistics import (
    BandCounts,
    Exposure,
    FailureEvent,
    PredictionWindow,
    first_failures,
    predicted_cards,
)
from heteroflow.platform.auth import NodeScope
from heteroflow.storage.db import unavailable_as_store_error, utc_value
from heteroflow.storage.schema import gpu_health_samples as samples_t
from heteroflow.storage.schema import gpu_xid_events as xid_t
from heteroflow.storage.schema import predictions as predictions_t
from heteroflow.storage.scope import in_scope


def read_statistics(
    engine: Engine, *, source: Source, scope: NodeScope, since: datetime, now: datetime, window_days: Sequence[int]
) -> tuple[dict[int, BandCounts], Exposure]:
    """Counts per band and the shared exposure (H-50…H-52).

    Three statements: prediction counts by band and status; monitorable cards with their first and last
    sample in the period (indexed point lookups per card); failure events (a window function over the
    rows where the uncorrectable-ECC value or the uuid changed, plus counted XIDs). The few failure events
    are then matched with the predictions of the failed cards.

    On PostgreSQL the transaction turns JIT compilation off: the planner prices each per-card point lookup
    as if it could read a whole series, so at 1,000 cards the estimate crosses the JIT thresholds and
    compiling took 0.6-1.9 s of a statement that runs in tens of milliseconds.
    """
    by_status = (
        sa.select(predictions_t.c.window_days, predictions_t.c.status, sa.func.count().label("n"))
        .where(
            predictions_t.c.source == source,
            *in_scope(predictions_t.c.node_id, scope),
            predictions_t.c.t0 >= since,
            predictions_t.c.t0 <= now,
        )
        .group_by(predictions_t.c.window_days, predictions_t.c.status)
    )
    first_ue = _first_uncorrectable(source=source, scope=scope, now=now)
    p = predictions_t
    before_any_ue = (
        sa.select(p.c.window_days, p.c.status, sa.func.count().label("n"))
        .select_from(
            p.outerjoin(
                first_ue,
                sa.and_(
                    first_ue.c.node_id == p.c.node_id,
                    first_ue.c.gpu_index == p.c.gpu_index,
                    first_ue.c.uuid.is_not_distinct_from(p.c.uuid),
                ),
            )
        )
        .where(
            p.c.source == source,
            *in_scope(p.c.node_id, scope),
            p.c.t0 >= since,
            p.c.t0 <= now,
            sa.or_(first_ue.c.first_at.is_(None), first_ue.c.first_at > p.c.t0),
        )
        .group_by(p.c.window_days, p.c.status)
    )
    with unavailable_as_store_error(), engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL jit = off")  # until this read-only transaction ends
        statuses: dict[int, dict[str, int]] = {n: {} for n in window_days}
        for row in conn.execute(by_status):
            if row.window_days in statuses:
                statuses[row.window_days][row.status] = row.n
        first_statuses: dict[int, dict[str, int]] = {n: {} for n in window_days}
        for row in conn.execute(before_any_ue):
            if row.window_days in first_statuses:
                first_statuses[row.window_days][row.status] = row.n
        cards = [
            row
            for row in conn.execute(_cards_in_period(source=source, scope=scope, since=since, now=now))
            if row.first is not None  # no sample in [since, now]
        ]
        monitorable = {(row.node_id, row.gpu_index, row.uuid) for row in cards}
        events = [
            FailureEvent(
                row.node_id,
                row.gpu_index,
                row.uuid,
                utc_value(row.at),
                semantics_unconfirmed="ecc_uncorrected_total" in split_keys(row.unconfirmed),
            )
            for row in conn.execute(failure_events_query(source=source, scope=scope, since=since, now=now))
            if (row.node_id, row.gpu_index, row.uuid) in monitorable
        ]
        windows: list[PredictionWindow] = []
        first_seen: dict[tuple[str, int, str | None], datetime] = {}
        if events:
            failed_nodes = sorted({e.node_id for e in events})
            first_seen = {
                (r.node_id, r.gpu_index, r.uuid): utc_value(r.first_at)
                for r in conn.execute(sa.select(first_ue).where(first_ue.c.node_id.in_(failed_nodes)))
            }
            rows = conn.execute(
                sa.select(p.c.node_id, p.c.gpu_index, p.c.uuid, p.c.window_days, p.c.t0, p.c.window_end).where(
                    p.c.source == source,
                    p.c.window_days.in_(list(window_days)),
                    p.c.node_id.in_(failed_nodes),
                )
            )
            windows = [
                PredictionWindow(r.node_id, r.gpu_index, r.uuid, r.window_days, r.t0, r.window_end) for r in rows
            ]
    failed_cards = len({e.card for e in events})
    confirmed = {e.card for e in events if not e.semantics_unconfirmed}
    unconfirmed_failed_cards = len({e.card for e in events if e.semantics_unconfirmed} - confirmed)
    firsts = first_failures(events, first_seen)
    bands = {
        n: BandCounts(
            window_days=n,
            pending=statuses[n].get("pending", 0),
            hit=statuses[n].get("hit", 0),
            miss=statuses[n].get("miss", 0),
            voided=statuses[n].get("voided", 0),
            failed_cards=failed_cards,
            predicted_cards=len(predicted_cards(events, windows, window_days=n)),
            unconfirmed_failed_cards=unconfirmed_failed_cards,
            first_failure=BandCounts(
                window_days=n,
                pending=first_statuses[n].get("pending", 0),
                hit=first_statuses[n].get("hit", 0),
                miss=first_statuses[n].get("miss", 0),
                voided=first_statuses[n].get("voided", 0),
                failed_cards=len(firsts),
                predicted_cards=len(predicted_cards(firsts, windows, window_days=n)),
                unconfirmed_failed_cards=len({e.card for e in firsts if e.semantics_unconfirmed}),
            ),
        )
        for n in window_days
    }
    return bands, _exposure(cards)


def _first_uncorrectable(*, source: Source, scope: NodeScope, now: datetime) -> sa.Subquery:
    """Each card's first sample with an uncorrectable count above 0 (uncorrectable ECC, or rows remapped after
    uncorrectable errors). Only ``ue_changed`` rows are read: a card's first row is one, and so is every row where
    either count changed, so the first row above 0 is among them (about one row per card)."""
    return (
        sa.select(
            samples_t.c.node_id,
            samples_t.c.gpu_index,
            samples_t.c.uuid,
            sa.func.min(samples_t.c.sampled_at).label("first_at"),
        )
        .where(
            samples_t.c.source == source,
            samples_t.c.ue_changed,
            samples_t.c.sampled_at <= now,
            sa.or_(samples_t.c.ecc_uncorrected_total > 0, samples_t.c.remapped_rows_uncorrectable > 0),
            *in_scope(samples_t.c.node_id, scope),
        )
        .group_by(samples_t.c.node_id, samples_t.c.gpu_index, samples_t.c.uuid)
        .subquery("first_ue")
    )


def failure_events_query(*, source: Source, scope: NodeScope, since: datetime, now: datetime) -> sa.Select[Any]:
    """Failure events of monitorable cards: a strict increase of uncorrectable ECC — or of the rows remapped
    after uncorrectable errors (an extension of the seed's F1) — between consecutive known samples of one card
    (a first sample never is one), or a counted XID; found by scanning samples in SQL.

    Only the ``ue_changed`` rows are scanned: a row without the flag repeats the uuid and the failure counters of
    its slot's previous row, which is then the card's previous known sample with the same values, so it is never
    a step; and each flagged row's predecessor among the flagged rows holds the values its true predecessor
    held. Degrading cards change their corrected-ECC counter every sample, so the broader ``changed`` rows
    would be hundreds of thousands at 1,000 cards; these are about one per card plus one per step."""
    parts = [_counter_steps(key, source=source, scope=scope, since=since, now=now) for key, _ in FAILURE_COUNTERS]
    # XIDs are attributed to the card (node, index, uuid) of the slot; the caller keeps monitorable cards only
    monitorable = (
        sa.select(samples_t.c.node_id, samples_t.c.gpu_index, samples_t.c.uuid)
        .where(samples_t.c.source == source, samples_t.c.ue_changed, samples_t.c.sampled_at <= now)
        .distinct()
        .subquery()
    )
    xid_failures = (
        sa.select(
            monitorable.c.node_id,
            monitorable.c.gpu_index,
            monitorable.c.uuid,
            xid_t.c.occurred_at.label("at"),
            sa.null().label("unconfirmed"),
        )
        .join(
            xid_t,
            sa.and_(
                xid_t.c.node_id == monitorable.c.node_id,
                xid_t.c.gpu_index == monitorable.c.gpu_index,
                sa.or_(xid_t.c.uuid.is_(None), xid_t.c.uuid == monitorable.c.uuid),
            ),
        )
        .where(
            xid_t.c.source == source,
            xid_t.c.xid.in_(sorted(COUNTED_XIDS)),
            xid_t.c.occurred_at >= since,
            xid_t.c.occurred_at <= now,
            *in_scope(xid_t.c.node_id, scope),
        )
    )
    return sa.union_all(*parts, xid_failures).subquery().select()


def _counter_steps(key: str, *, source: Source, scope: NodeScope, since: datetime, now: datetime) -> sa.Select[Any]:
    """Strict increases of one failure counter between consecutive known ``ue_changed`` rows of each card."""
    value = samples_t.c[key]
    steps = (
        sa.select(
            samples_t.c.node_id,
            samples_t.c.gpu_index,
            samples_t.c.uuid,
            samples_t.c.sampled_at,
            samples_t.c.semantics_unconfirmed,
            value.label("v"),
            sa.func.lag(value)
            .over(
                # exactly the order of the partial index of ue_changed rows, so the window needs no sort
                # (two rows of one card never share a sampling time: a collection is one reading)
                partition_by=(samples_t.c.node_id, samples_t.c.gpu_index, samples_t.c.uuid),
                order_by=samples_t.c.sampled_at,
            )
            .label("prev"),
        )
        .where(
            samples_t.c.source == source,
            # a row that repeats its predecessor's uuid and failure counters can never be a step
            samples_t.c.ue_changed,
            value.is_not(None),
            samples_t.c.sampled_at <= now,
            *in_scope(samples_t.c.node_id, scope),
        )
        .subquery()
    )
    unconfirmed = steps.c.semantics_unconfirmed if key == "ecc_uncorrected_total" else sa.null()
    return sa.select(
        steps.c.node_id,
        steps.c.gpu_index,
        steps.c.uuid,
        steps.c.sampled_at.label("at"),
        unconfirmed.label("unconfirmed"),
    ).where(steps.c.prev.is_not(None), steps.c.v > steps.c.prev, steps.c.sampled_at >= since)


def _cards_in_period(*, source: Source, scope: NodeScope, since: datetime, now: datetime) -> sa.Select[Any]:
    """Cards with a sample at or before ``now``, with their first and last sample in [since, now] (NULL when
    they have none there: the caller drops those).

    The card list comes from the ``ue_changed`` rows (every card's first row is one, and there are about
    as many as cards); each card's first and last sample in the period are indexed point lookups, so the
    cost follows the number of cards, not of rows. The list is a materialised CTE on PostgreSQL, planned on
    its own: as a subquery, the planner preferred whichever path promised the fewest cards (each lookup is
    priced high) and, with some ANALYZE samples, took a parallel scan of the whole table (1.5 s at 10 M rows)
    over the partial index.
    """
    cards = (
        sa.select(samples_t.c.node_id, samples_t.c.gpu_index, samples_t.c.uuid)
        .where(
            samples_t.c.source == source,
            samples_t.c.ue_changed,
            samples_t.c.sampled_at <= now,
            *in_scope(samples_t.c.node_id, scope),
        )
        .distinct()
        .cte("cards")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    inner = samples_t.alias("edge")

    def edge(descending: bool) -> sa.ScalarSelect[Any]:
        order = inner.c.sampled_at.desc() if descending else inner.c.sampled_at.asc()
        return (
            sa.select(inner.c.sampled_at)
            .where(
                inner.c.node_id == cards.c.node_id,
                inner.c.gpu_index == cards.c.gpu_index,
                inner.c.uuid.is_not_distinct_from(cards.c.uuid),
                inner.c.source == source,
                inner.c.sampled_at >= since,
                inner.c.sampled_at <= now,
            )
            .order_by(order)
            .limit(1)
            .scalar_subquery()
        )

    return sa.select(
        cards.c.node_id, cards.c.gpu_index, cards.c.uuid, edge(False).label("first"), edge(True).label("last")
    )


def _exposure(cards: Sequence[Any]) -> Exposure:
    """Monitorable cards, card-days from each card's first..last sample in the period, and the span."""
    if not cards:
        return Exposure(monitorable_cards=0, card_days=0.0, span_days=None)
    day = timedelta(days=1)
    first = [utc_value(row.first) for row in cards]
    last = [utc_value(row.last) for row in cards]
    card_days = sum((b - a) / day for a, b in zip(first, last, strict=True))
    return Exposure(monitorable_cards=len(cards), card_days=card_days, span_days=(max(last) - min(first)) / day)
