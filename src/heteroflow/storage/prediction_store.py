"""SQL storage of predictions, and the reads the rules, the backfill and the statistics need.

The rules need a card's counters at a few boundary instants: each is an indexed point query (the newest
sample of the slot at or before the instant), sent together as one UNION ALL statement, plus one statement
for the newest decrease of each growth counter. The statistics' SQL is in ``prediction_statistics``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from heteroflow.core.ids import NodeId, Source
from heteroflow.health.alerts import AlertedCard, alerted_cards
from heteroflow.health.counters import HEALTH_KEYS, Counters, split_keys
from heteroflow.health.predictions import Judgement, PredictionStatus, XidObservation
from heteroflow.health.rules import GROWTH_KEYS, CardView, RuleParams, boundary_instants
from heteroflow.health.samples import Card, CardKey, StoredSample
from heteroflow.health.statistics import BandCounts, Exposure
from heteroflow.platform.auth import NodeScope
from heteroflow.storage.db import unavailable_as_store_error, utc_value
from heteroflow.storage.prediction_statistics import read_statistics
from heteroflow.storage.schema import gpu_health_samples as samples_t
from heteroflow.storage.schema import gpu_xid_events as xid_t
from heteroflow.storage.schema import nodes as nodes_t
from heteroflow.storage.schema import predictions as predictions_t
from heteroflow.storage.scope import contains_text, in_scope


@dataclass(frozen=True, slots=True)
class PredictionRecord:
    id: str
    card: Card
    rule_version: str
    window_days: int
    t0: datetime
    window_end: datetime
    status: PredictionStatus
    signals: tuple[str, ...]
    evidence: str
    created_at: datetime
    judged_at: datetime | None
    conclusion: str | None
    alert_id: str | None
    failure_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class PredictionFilter:
    source: Source
    scope: NodeScope
    node_id: str | None = None
    gpu_index: int | None = None
    status: PredictionStatus | None = None
    since: datetime | None = None
    until: datetime | None = None
    signals: tuple[str, ...] = ()
    """Any of these signal codes (``uncorrectable_ecc``, …); empty: every prediction."""
    search: str | None = None
    """A card search: part of the card's uuid or of its node's name (case-insensitive)."""


PredictionOrder = Literal["newest", "strong_first", "window_end"]
"""``newest``: t0 descending; ``strong_first``: predictions with a strong signal (uncorrectable ECC, remap
failure: the card is already failing) first, then newest; ``window_end``: the soonest window end first (what
must be looked at this week)."""

STRONG_SIGNALS = ("uncorrectable_ecc", "remap_failure")
"""The rules' strong signal codes (``health.rules``: a value already above 0)."""


def _has_signal(code: str) -> sa.ColumnElement[bool]:
    """``code`` is one element of the comma-separated ``signals`` column (never a substring of another)."""
    return (sa.literal(",") + predictions_t.c.signals + sa.literal(",")).like(f"%,{code},%")


def _record(row: Any) -> PredictionRecord:
    return PredictionRecord(
        id=row.id,
        card=Card(node_id=NodeId(row.node_id), gpu_index=row.gpu_index, uuid=row.uuid, source=row.source),
        rule_version=row.rule_version,
        window_days=row.window_days,
        t0=row.t0,
        window_end=row.window_end,
        status=row.status,
        signals=tuple(s for s in row.signals.split(",") if s),
        evidence=row.evidence,
        created_at=row.created_at,
        judged_at=row.judged_at,
        conclusion=row.conclusion,
        alert_id=row.alert_id,
        failure_at=row.failure_at,
    )


def _sample(row: Any) -> StoredSample:
    return StoredSample(
        key=CardKey(node_id=NodeId(row.node_id), gpu_index=row.gpu_index, source=row.source),
        uuid=row.uuid,
        sampled_at=row.sampled_at,
        counters=Counters(**{name: getattr(row, name) for name in HEALTH_KEYS}),
        semantics_unconfirmed=split_keys(row.semantics_unconfirmed),
    )


def _same_card(table: sa.Table, card: Card) -> list[sa.ColumnElement[bool]]:
    return [
        table.c.node_id == card.node_id,
        table.c.gpu_index == card.gpu_index,
        table.c.uuid.is_not_distinct_from(card.uuid),
        table.c.source == card.source,
    ]


def _slot(card: Card) -> list[sa.ColumnElement[bool]]:
    return [
        samples_t.c.node_id == card.node_id,
        samples_t.c.gpu_index == card.gpu_index,
        samples_t.c.source == card.source,
    ]


class SqlPredictionStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # -- what the rules read ------------------------------------------------------------------------------

    def evaluation_cards(self, *, source: Source, now: datetime) -> list[Card]:
        """The capability matrix: every card that reported a counter (a stored sample is never all-unknown).

        Read from the ``ue_changed`` rows only (about one per card): every card's first row is one.
        """
        query = (
            sa.select(samples_t.c.node_id, samples_t.c.gpu_index, samples_t.c.uuid)
            .where(samples_t.c.source == source, samples_t.c.ue_changed, samples_t.c.sampled_at <= now)
            .group_by(samples_t.c.node_id, samples_t.c.gpu_index, samples_t.c.uuid)
            .order_by(samples_t.c.node_id, samples_t.c.gpu_index)
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return [
                Card(node_id=NodeId(r.node_id), gpu_index=r.gpu_index, uuid=r.uuid, source=source)
                for r in conn.execute(query)
            ]

    def card_view(self, card: Card, *, now: datetime, params: RuleParams) -> CardView | None:
        """The card's newest sample at or before ``now`` (H-34: never a future-dated one) and its boundaries."""
        with unavailable_as_store_error(), self._engine.connect() as conn:
            latest_row = conn.execute(
                sa.select(samples_t)
                .where(*_slot(card), samples_t.c.uuid.is_not_distinct_from(card.uuid), samples_t.c.sampled_at <= now)
                .order_by(samples_t.c.sampled_at.desc(), samples_t.c.id.desc())
                .limit(1)
            ).first()
            if latest_row is None:
                return None
            latest = _sample(latest_row)
            instants = boundary_instants(latest.sampled_at, params)
            predicted_t0 = conn.execute(
                sa.select(sa.func.max(predictions_t.c.t0)).where(
                    *_same_card(predictions_t, card), predictions_t.c.t0 < latest.sampled_at
                )
            ).scalar()
            last_predicted_t0 = utc_value(predicted_t0) if predicted_t0 is not None else None
            if last_predicted_t0 is not None and last_predicted_t0 not in instants:
                instants = sorted([*instants, last_predicted_t0])
            boundaries = self._as_of(conn, card, instants)
            start = instants[0] - params.staleness
            decreases = self._last_decreases(conn, card, start=start, end=latest.sampled_at)
        return CardView(
            card=card,
            latest=latest,
            boundaries=boundaries,
            last_decrease=decreases,
            last_predicted_t0=last_predicted_t0,
        )

    def _as_of(self, conn: Connection, card: Card, instants: Sequence[datetime]) -> dict[datetime, StoredSample | None]:
        parts = []
        for position, instant in enumerate(instants):
            inner = (
                sa.select(*samples_t.c, sa.literal(position).label("boundary"))
                .where(*_slot(card), samples_t.c.sampled_at <= instant)
                .order_by(samples_t.c.sampled_at.desc(), samples_t.c.id.desc())
                .limit(1)
                .subquery()
            )
            parts.append(sa.select(inner))
        found: dict[datetime, StoredSample | None] = dict.fromkeys(instants)
        for row in conn.execute(sa.union_all(*parts)):
            found[instants[row.boundary]] = _sample(row)
        return found

    def _last_decreases(
        self, conn: Connection, card: Card, *, start: datetime, end: datetime
    ) -> dict[str, datetime | None]:
        """Per growth counter, the newest sample of this card lower than the one before it (within the range)."""
        columns = []
        for key in GROWTH_KEYS:
            value = samples_t.c[key]
            steps = (
                sa.select(
                    samples_t.c.sampled_at,
                    value.label("v"),
                    sa.func.lag(value).over(order_by=(samples_t.c.sampled_at, samples_t.c.id)).label("prev"),
                )
                .where(
                    *_slot(card),
                    samples_t.c.uuid.is_not_distinct_from(card.uuid),  # other cards' values are unknown anyway
                    samples_t.c.changed,  # a decrease is a change: keepalive rows never hold one
                    value.is_not(None),
                    samples_t.c.sampled_at >= start,
                    samples_t.c.sampled_at <= end,
                )
                .subquery()
            )
            columns.append(
                sa.select(sa.func.max(steps.c.sampled_at)).where(steps.c.v < steps.c.prev).scalar_subquery().label(key)
            )
        row = conn.execute(sa.select(*columns)).one()
        return {key: utc_value(getattr(row, key)) if getattr(row, key) is not None else None for key in GROWTH_KEYS}

    def refresh_statistics(self) -> None:
        """Keep the query planner's statistics fresh. PostgreSQL's autovacuum does this by itself; SQLite keeps
        none unless told, and then prefers the (source, sampled_at) index over the small partial index of changed
        rows. A bounded ANALYZE costs about a millisecond."""
        if self._engine.dialect.name != "sqlite":
            return
        with unavailable_as_store_error(), self._engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA analysis_limit=1000")
            conn.exec_driver_sql("ANALYZE gpu_health_samples")

    # -- predictions ----------------------------------------------------------------------------------------

    def has_open_window(self, card: Card, *, now: datetime) -> bool:
        query = (
            sa.select(predictions_t.c.id)
            .where(
                *_same_card(predictions_t, card), predictions_t.c.status == "pending", predictions_t.c.window_end > now
            )
            .limit(1)
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return conn.execute(query).first() is not None

    def insert(self, record: PredictionRecord) -> bool:
        """Insert once: True only for the process whose INSERT created the row (a key conflict is False)."""
        row = {
            "id": record.id,
            "node_id": record.card.node_id,
            "gpu_index": record.card.gpu_index,
            "uuid": record.card.uuid,
            "source": record.card.source,
            "rule_version": record.rule_version,
            "window_days": record.window_days,
            "t0": record.t0,
            "window_end": record.window_end,
            "status": record.status,
            "signals": ",".join(record.signals),
            "evidence": record.evidence,
            "created_at": record.created_at,
            "judged_at": None,
            "conclusion": None,
            "failure_at": None,
            "alert_id": record.alert_id,
        }
        with unavailable_as_store_error(), self._engine.begin() as conn:
            insert: Any = (
                postgresql.insert(predictions_t) if conn.dialect.name == "postgresql" else sqlite.insert(predictions_t)
            )
            created = conn.execute(insert.values(**row).on_conflict_do_nothing().returning(predictions_t.c.id)).first()
        return created is not None

    def attach_alert(self, prediction_id: str, alert_id: str) -> None:
        with unavailable_as_store_error(), self._engine.begin() as conn:
            conn.execute(sa.update(predictions_t).where(predictions_t.c.id == prediction_id).values(alert_id=alert_id))

    def due(self, *, source: Source, now: datetime) -> list[PredictionRecord]:
        query = (
            sa.select(predictions_t)
            .where(
                predictions_t.c.source == source, predictions_t.c.status == "pending", predictions_t.c.window_end <= now
            )
            .order_by(predictions_t.c.window_end)
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return [_record(row) for row in conn.execute(query)]

    def window_samples(self, card: Card, *, t0: datetime, end: datetime) -> list[StoredSample]:
        """The slot's samples with t0 <= sampled_at <= end, compared on the stored (read-back) values."""
        query = (
            sa.select(samples_t)
            .where(*_slot(card), samples_t.c.sampled_at >= t0, samples_t.c.sampled_at <= end)
            .order_by(samples_t.c.sampled_at, samples_t.c.id)
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return [_sample(row) for row in conn.execute(query)]

    def window_xids(self, card: Card, *, t0: datetime, end: datetime) -> list[XidObservation]:
        query = sa.select(xid_t).where(
            xid_t.c.node_id == card.node_id,
            xid_t.c.gpu_index == card.gpu_index,
            xid_t.c.source == card.source,
            xid_t.c.occurred_at > t0,
            xid_t.c.occurred_at <= end,
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return [
                XidObservation(gpu_index=r.gpu_index, uuid=r.uuid, xid=r.xid, occurred_at=r.occurred_at)
                for r in conn.execute(query)
            ]

    def record_judgement(self, prediction_id: str, judgement: Judgement, *, now: datetime) -> bool:
        """Compare-and-set on ``status='pending'``: exactly one worker's judgement takes effect."""
        with unavailable_as_store_error(), self._engine.begin() as conn:
            result = conn.execute(
                sa.update(predictions_t)
                .where(predictions_t.c.id == prediction_id, predictions_t.c.status == "pending")
                .values(
                    status=judgement.status,
                    judged_at=now,
                    conclusion=judgement.conclusion,
                    failure_at=judgement.failure_at,
                )
            )
        return bool(result.rowcount)

    def alert_cards(self, nodes_by_alert: Mapping[str, str]) -> dict[str, list[AlertedCard]]:
        """Each alert's predicted cards (newest prediction per card, the most severe first), one query for all.

        ``nodes_by_alert``: alert id → its node id (the node narrows the query to the predictions' node index)."""
        if not nodes_by_alert:
            return {}
        found: dict[str, list[AlertedCard]] = {}
        query = sa.select(predictions_t).where(
            predictions_t.c.node_id.in_(sorted(set(nodes_by_alert.values()))),
            predictions_t.c.alert_id.in_(list(nodes_by_alert)),
        )
        with unavailable_as_store_error(), self._engine.connect() as conn:
            for row in conn.execute(query):
                record = _record(row)
                found.setdefault(row.alert_id, []).append(
                    AlertedCard(
                        gpu_index=record.card.gpu_index,
                        uuid=record.card.uuid,
                        source=record.card.source,
                        prediction_id=record.id,
                        signals=record.signals,
                        status=record.status,
                        t0=record.t0,
                        evidence=record.evidence,
                    )
                )
        return {alert_id: alerted_cards(cards) for alert_id, cards in found.items()}

    def node_predictions(self, node_id: NodeId, *, alert_id: str) -> list[PredictionRecord]:
        query = sa.select(predictions_t).where(predictions_t.c.node_id == node_id, predictions_t.c.alert_id == alert_id)
        with unavailable_as_store_error(), self._engine.connect() as conn:
            return [_record(row) for row in conn.execute(query)]

    def list(
        self, flt: PredictionFilter, *, limit: int, offset: int, order: PredictionOrder = "newest"
    ) -> tuple[list[PredictionRecord], int]:
        conditions = [predictions_t.c.source == flt.source, *in_scope(predictions_t.c.node_id, flt.scope)]
        if flt.signals:
            conditions.append(sa.or_(*(_has_signal(code) for code in flt.signals)))
        if flt.search:
            named = sa.select(nodes_t.c.id).where(contains_text(nodes_t.c.name, flt.search))
            conditions.append(
                sa.or_(
                    contains_text(sa.func.coalesce(predictions_t.c.uuid, ""), flt.search),
                    predictions_t.c.node_id.in_(named),
                )
            )
        if flt.node_id is not None:
            conditions.append(predictions_t.c.node_id == flt.node_id)
        if flt.gpu_index is not None:
            conditions.append(predictions_t.c.gpu_index == flt.gpu_index)
        if flt.status is not None:
            conditions.append(predictions_t.c.status == flt.status)
        if flt.since is not None:
            conditions.append(predictions_t.c.t0 >= flt.since)
        if flt.until is not None:
            conditions.append(predictions_t.c.t0 <= flt.until)
        strong = sa.case((sa.or_(*(_has_signal(code) for code in STRONG_SIGNALS)), 0), else_=1)
        ordering: list[sa.ColumnElement[Any]]
        if order == "strong_first":
            ordering = [strong, predictions_t.c.t0.desc()]
        elif order == "window_end":
            ordering = [predictions_t.c.window_end, strong]
        else:
            ordering = [predictions_t.c.t0.desc()]
        query = (
            sa.select(predictions_t)
            .where(*conditions)
            .order_by(*ordering, predictions_t.c.id)
            .limit(limit)
            .offset(offset)
        )
        count = sa.select(sa.func.count()).select_from(predictions_t).where(*conditions)
        with unavailable_as_store_error(), self._engine.connect() as conn:
            rows = [_record(row) for row in conn.execute(query)]
            total = int(conn.execute(count).scalar_one())
        return rows, total

    # -- statistics (H-50…H-52) -------------------------------------------------------------------------------

    def statistics(
        self, *, source: Source, scope: NodeScope, since: datetime, now: datetime, window_days: Sequence[int]
    ) -> tuple[dict[int, BandCounts], Exposure]:
        """Counts per band and the shared exposure (H-50…H-52); see ``prediction_statistics``."""
        return read_statistics(self._engine, source=source, scope=scope, since=since, now=now, window_days=window_days)
