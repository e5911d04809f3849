"""The prediction worker: backfill, then predict, then the alert upkeep — on the elected leader only (H-35).

Each tick loads what it needs, calls the pure core (:mod:`heteroflow.health.rules`,
:mod:`heteroflow.health.predictions`, :mod:`heteroflow.health.alerts`) and applies the result. Backfill runs
first, so that a card whose window expired this tick is judged before "no second prediction while a window is
open" is checked. Storage idempotency (a derived primary key; judgements as ``UPDATE … WHERE
status='pending'``) makes an overlap of two leaders during a hand-over harmless; the lease keeps it rare.
Real and simulated series are evaluated separately; simulated predictions never alert.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import structlog

from heteroflow.core.clock import Clock
from heteroflow.core.errors import StoreUnavailableError
from heteroflow.core.ids import SOURCES, Source
from heteroflow.health.alerts import (
    GPU_FAULT_PREDICTED,
    PredictedFault,
    predicted_fault_message,
    resolution_by_backfill,
    severity_of,
)
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.predictions import PredictionStatus, judge, prediction_id, window_end, window_over_at
from heteroflow.health.rules import RULE_VERSION, RuleParams, Signal, evaluate
from heteroflow.health.samples import Card
from heteroflow.health.weak_signals import WeakSignalParams, weak_signals
from heteroflow.platform_server.alert_delivery import AlertNotifier, EventKind
from heteroflow.storage.alert_store import CARD_ADDED, CARD_PREDICTED_AGAIN, SYSTEM, AlertRecord, SqlAlertStore
from heteroflow.storage.lease_store import SqlLeaseStore
from heteroflow.storage.metrics_store import SqlGpuMetricsStore
from heteroflow.storage.node_store import SqlNodeStore
from heteroflow.storage.prediction_store import PredictionRecord, SqlPredictionStore

_log = structlog.get_logger(__name__)

LEASE_NAME = "gpu-fault-prediction-worker"


@contextlib.contextmanager
def _one_card(card: Card, tally: _Tally, *, step: str) -> Iterator[None]:
    """One card's failure (an odd stored value the core cannot take) is logged and skipped: it never takes the
    tick down for every other card. A database that is unavailable still fails the tick (retried next tick)."""
    try:
        yield
    except StoreUnavailableError:
        raise
    except Exception as exc:
        tally.failed += 1
        _log.warning(
            "prediction.card_failed",
            step=step,
            node_id=card.node_id,
            gpu_index=card.gpu_index,
            error=f"{type(exc).__name__}: {exc}"[:300],
        )


MAX_FLOODS = 100_000
"""Cards whose flood the worker keeps in memory at most."""


@dataclass(frozen=True, slots=True)
class CardFlood:
    """A card whose corrected ECC grew faster than the flood rate at its last evaluation."""

    evidence: str
    since: datetime
    """The t0 of the first evaluation in a row that found the flood."""
    at: datetime
    """The t0 of the newest evaluation that found it."""


def rule_params(settings: PredictionSettings) -> RuleParams:
    return RuleParams(
        growth_window=timedelta(hours=settings.growth_window_hours),
        consecutive_windows=settings.consecutive_windows,
        baseline=timedelta(days=settings.baseline_days),
        ratio=settings.ratio,
        min_increase=settings.min_increase,
        observation=timedelta(days=settings.observation_days),
        staleness=timedelta(minutes=settings.boundary_staleness_minutes),
        ce_flood_per_sec=settings.ce_flood_per_second,
    )


@dataclass(frozen=True, slots=True)
class TickReport:
    started_at: datetime
    seconds: float
    cards_evaluated: dict[str, int]
    predictions_created: dict[str, int]
    judged: dict[str, int]
    alerts_raised: int
    alerts_resolved: int
    alerts_backlogged: int
    cards_failed: int = 0
    """Cards (or due predictions) whose evaluation raised: each is logged and skipped, the tick goes on."""
    cards_stale: int = 0
    """Cards not predicted because their newest sample is older than the window (shown stalled instead)."""


@dataclass(frozen=True, slots=True)
class SkippedTick:
    """A tick that was due on the lease holder and did not run."""

    at: datetime
    """When the skip was decided (the worker's clock)."""
    reason: str


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    leader: bool
    holder: str
    ticks_total: int
    tick_failures_total: int
    last_tick: TickReport | None
    last_error: str | None
    ticks_skipped_total: int = 0
    """Ticks that were due while the lease could not be checked (the database was unavailable)."""
    last_skip: SkippedTick | None = None


@dataclass
class _Tally:
    evaluated: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    created: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    judged: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    raised: int = 0
    resolved: int = 0
    backlogged: int = 0
    failed: int = 0
    stale: int = 0


class PredictionWorker:
    def __init__(
        self,
        *,
        predictions: SqlPredictionStore,
        alerts: SqlAlertStore,
        nodes: SqlNodeStore,
        leases: SqlLeaseStore,
        settings: PredictionSettings,
        clock: Clock,
        notifier: AlertNotifier | None = None,
        metrics: SqlGpuMetricsStore | None = None,
        weak_params: WeakSignalParams | None = None,
    ) -> None:
        self._predictions = predictions
        self._alerts = alerts
        self._nodes = nodes
        self._leases = leases
        self._settings = settings
        self._clock = clock
        self._notifier = notifier
        self._metrics = metrics
        self._weak_params = weak_params or WeakSignalParams()
        self._params = rule_params(settings)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._leader = False
        self._ticks = 0
        self._failures = 0
        self._last: TickReport | None = None
        self._last_error: str | None = None
        self._skipped = 0
        self._last_skip: SkippedTick | None = None
        self._floods: dict[Card, CardFlood] = {}

    def flood(self, card: Card) -> CardFlood | None:
        """The card's correctable-error flood as of this worker's last evaluation of it (weak evidence, shown on
        the card; never a prediction by itself), or ``None``. Known to the worker holding the lease only."""
        return self._floods.get(card)

    def status(self) -> WorkerStatus:
        return WorkerStatus(
            leader=self._leader,
            holder=self.holder,
            ticks_total=self._ticks,
            tick_failures_total=self._failures,
            last_tick=self._last,
            last_error=self._last_error,
            ticks_skipped_total=self._skipped,
            last_skip=self._last_skip,
        )

    # -- one tick (blocking: the async shell runs it in a thread) ---------------------------------------------

    def tick(self) -> TickReport:
        started = self._clock.now()
        began = time.perf_counter()
        tally = _Tally()
        self._predictions.refresh_statistics()
        for source in SOURCES:
            self._backfill(source, started, tally)
            self._predict(source, started, tally)
        self._alert_upkeep(started, tally)
        report = TickReport(
            started_at=started,
            seconds=time.perf_counter() - began,
            cards_evaluated=dict(tally.evaluated),
            predictions_created=dict(tally.created),
            judged=dict(tally.judged),
            alerts_raised=tally.raised,
            alerts_resolved=tally.resolved,
            alerts_backlogged=tally.backlogged,
            cards_failed=tally.failed,
            cards_stale=tally.stale,
        )
        self._ticks += 1
        self._last = report
        _log.info(
            "prediction.tick",
            seconds=round(report.seconds, 3),
            created=report.predictions_created,
            judged=report.judged,
        )
        return report

    def _note_flood(self, card: Card, signals: tuple[Signal, ...], *, t0: datetime) -> None:
        flood = next((signal for signal in signals if signal.code == "corrected_ecc_flood"), None)
        if flood is None:
            self._floods.pop(card, None)
            return
        if len(self._floods) >= MAX_FLOODS and card not in self._floods:
            return
        known = self._floods.get(card)
        self._floods[card] = CardFlood(evidence=flood.evidence, since=known.since if known else t0, at=t0)

    def _backfill(self, source: Source, now: datetime, tally: _Tally) -> None:
        for record in self._predictions.due(source=source, now=now):
            with _one_card(record.card, tally, step="backfill"):
                self._backfill_one(record, now, tally)

    def _backfill_one(self, record: PredictionRecord, now: datetime, tally: _Tally) -> None:
        samples = self._predictions.window_samples(record.card, t0=record.t0, end=record.window_end)
        xids = self._predictions.window_xids(record.card, t0=record.t0, end=record.window_end)
        judgement = judge(card=record.card, t0=record.t0, end=record.window_end, now=now, samples=samples, xids=xids)
        if judgement is not None and self._predictions.record_judgement(record.id, judgement, now=now):
            tally.judged[judgement.status] += 1

    def _predict(self, source: Source, now: datetime, tally: _Tally) -> None:
        for card in self._predictions.evaluation_cards(source=source, now=now):
            with _one_card(card, tally, step="predict"):
                self._predict_one(card, source, now, tally)

    def _predict_one(self, card: Card, source: Source, now: datetime, tally: _Tally) -> None:
        window_days = self._settings.window_days
        if self._predictions.has_open_window(card, now=now):
            return
        view = self._predictions.card_view(card, now=now, params=self._params)
        if view is None:
            return
        if window_over_at(view.t0, window_days, now=now):
            tally.stale += 1  # no prediction whose window is over at creation
            return
        tally.evaluated[source] += 1
        evaluation = evaluate(view, self._params)
        self._note_flood(card, evaluation.signals, t0=view.t0)
        if not evaluation.predicts:
            return  # weak signals could not change that (the gate), so their history is not even read
        weak = self._weak_signals(card, t0=view.t0)
        if weak:
            evaluation = evaluate(view, self._params, weak_signals=weak)
        record = PredictionRecord(
            id=prediction_id(card, rule_version=RULE_VERSION, window_days=window_days, t0=view.t0),
            card=card,
            rule_version=RULE_VERSION,
            window_days=window_days,
            t0=view.t0,
            window_end=window_end(view.t0, window_days),
            status="pending",
            signals=tuple(signal.code for signal in evaluation.signals),
            evidence=evaluation.evidence,
            created_at=now,
            judged_at=None,
            conclusion=None,
            alert_id=None,
        )
        if not self._predictions.insert(record):
            return  # another worker created it: it raises the alert, not us
        tally.created[source] += 1
        if source == "real" and self._settings.alert_enabled:
            self._raise_alert(record, now, tally)

    def _weak_signals(self, card: Card, *, t0: datetime) -> list[Signal]:
        """Temperature and power anomalies of the card from the metrics history: supporting evidence only."""
        if self._metrics is None:
            return []
        try:
            rows = self._metrics.read(
                node_id=card.node_id,
                gpu_index=card.gpu_index,
                source=card.source,
                since=t0 - self._weak_params.history,
                until=t0 + timedelta(minutes=1),
            )
        except Exception as exc:  # evidence is optional: the prediction stands without it
            _log.warning("prediction.weak_signals_failed", error=f"{type(exc).__name__}: {exc}"[:300])
            return []
        return weak_signals(rows, uuid=card.uuid, t0=t0, params=self._weak_params)

    def _raise_alert(self, record: PredictionRecord, now: datetime, tally: _Tally) -> None:
        node = self._nodes.get(record.card.node_id)
        if node is None:
            return
        message = predicted_fault_message(
            PredictedFault(
                node_name=node.name,
                gpu_index=record.card.gpu_index,
                uuid=record.card.uuid,
                window_days=record.window_days,
                rule_version=record.rule_version,
                evidence=record.evidence,
            )
        )
        severity = severity_of(record.signals)
        alert, created = self._alerts.raise_alert(
            type=GPU_FAULT_PREDICTED,
            severity=severity,
            node_id=node.id,
            node_name=node.name,
            tenant_id=node.tenant_id,
            message=message,
            now=now,
        )
        if created:
            self._predictions.attach_alert(record.id, alert.id)
            tally.raised += 1
            self._notify("raised", alert)
            return
        # the node's alert is open: the card joins it, in its history (a card already in it: a new prediction of
        # it, after its earlier window), and a stronger signal raises the alert's severity
        known = {r.card.gpu_index for r in self._predictions.node_predictions(alert.node_id, alert_id=alert.id)}
        self._predictions.attach_alert(record.id, alert.id)
        action = CARD_PREDICTED_AGAIN if record.card.gpu_index in known else CARD_ADDED
        joined = self._alerts.join(alert.id, severity=severity, note=message, now=now, action=action)
        if joined is not None:
            self._notify("card_added", joined.alert, previous_severity=joined.previous_severity, at=now)

    def _notify(
        self, kind: EventKind, alert: AlertRecord, *, previous_severity: str | None = None, at: datetime | None = None
    ) -> None:
        if self._notifier is None:
            return
        cards = self._predictions.alert_cards({alert.id: alert.node_id}).get(alert.id, [])
        self._notifier.submit(kind, alert, cards=cards, previous_severity=previous_severity, at=at)

    def _alert_upkeep(self, now: datetime, tally: _Tally) -> None:
        for alert in self._alerts.open_alerts(GPU_FAULT_PREDICTED):
            records = self._predictions.node_predictions(alert.node_id, alert_id=alert.id)
            latest: dict[int, PredictionRecord] = {}
            for record in records:
                if record.card.gpu_index not in latest or record.t0 > latest[record.card.gpu_index].t0:
                    latest[record.card.gpu_index] = record
            by_slot: dict[int, PredictionStatus] = {index: r.status for index, r in latest.items()}
            reason = resolution_by_backfill(by_slot, any_hit=any(r.status == "hit" for r in records))
            if reason is not None and self._alerts.resolve(alert.id, by=SYSTEM, reason=reason, now=now):
                tally.resolved += 1
                if (resolved := self._alerts.get(alert.id)) is not None:
                    self._notify("resolved", resolved)
        older_than = now - timedelta(hours=self._settings.backlog_hours)
        for alert in self._alerts.flag_backlog(older_than=older_than, now=now):
            tally.backlogged += 1
            self._notify("backlog", alert)

    # -- the leader loop ----------------------------------------------------------------------------------------

    async def _tick_holding_the_lease(self, ttl: timedelta) -> None:
        """One tick, renewing the lease every third of its TTL while it runs: a tick longer than the lease must
        not let another server take the lease and tick the same data as well."""
        tick = asyncio.ensure_future(asyncio.to_thread(self.tick))
        while True:
            done, _ = await asyncio.wait({tick}, timeout=self._settings.lease_seconds / 3)
            if done:
                tick.result()
                return
            try:
                await asyncio.to_thread(
                    self._leases.acquire, LEASE_NAME, holder=self.holder, now=self._clock.now(), ttl=ttl
                )
            except Exception as exc:  # the tick goes on; an overlap with a new holder is harmless (H-35)
                _log.warning("prediction.lease_renewal_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    async def run(self) -> None:
        """Hold the lease and tick every ``tick_minutes`` while leader; retry the lease every third of its TTL.

        A holder that cannot check its lease (the database is unavailable) neither ticks nor keeps counting
        itself leader; each tick period that passes that way is reported as a skipped tick (status, log), and the
        overdue tick runs as soon as the lease can be checked again.
        """
        ttl = timedelta(seconds=self._settings.lease_seconds)
        tick_every = self._settings.tick_minutes * 60
        last_tick = float("-inf")
        last_skip = float("-inf")
        held_before_outage = False
        try:
            while True:
                try:
                    leader = await asyncio.to_thread(
                        self._leases.acquire, LEASE_NAME, holder=self.holder, now=self._clock.now(), ttl=ttl
                    )
                    lease_error = None
                except Exception as exc:
                    leader = False
                    lease_error = f"{type(exc).__name__}: {exc}"[:300]
                    self._last_error = f"lease: {lease_error}"[:300]
                # only the holder had a tick to skip: a follower would not have ticked anyway
                held_before_outage = lease_error is not None and (self._leader or held_before_outage)
                if leader != self._leader:
                    _log.info("prediction.leadership", leader=leader, holder=self.holder)
                self._leader = leader
                now = self._clock.monotonic()
                due = now - last_tick >= tick_every
                if held_before_outage and due and now - last_skip >= tick_every:
                    last_skip = now
                    self._skip(f"the lease could not be checked: {lease_error}")
                if leader and due:
                    last_tick = now
                    try:
                        await self._tick_holding_the_lease(ttl)
                        self._last_error = None
                    except Exception as exc:
                        self._failures += 1
                        self._last_error = f"{type(exc).__name__}: {exc}"[:300]
                        _log.warning("prediction.tick_failed", error=self._last_error)
                await asyncio.sleep(self._settings.lease_seconds / 3)
        finally:
            if self._leader:
                try:
                    await asyncio.to_thread(self._leases.release, LEASE_NAME, holder=self.holder)
                except Exception as exc:  # the lease expires by itself
                    _log.warning("prediction.lease_release_failed", error=str(exc)[:200])

    def _skip(self, reason: str) -> None:
        self._skipped += 1
        self._last_skip = SkippedTick(at=self._clock.now(), reason=reason[:300])
        _log.warning("prediction.tick_skipped", reason=self._last_skip.reason, skipped_total=self._skipped)
