"""The heartbeat's metrics side path: aggregate per minute in memory, flush in batches, alert on full memory.

The heartbeat handler calls :meth:`GpuMetricsRecorder.offer` and returns: no statement per beat. Every
``flush_seconds`` a background task writes the minutes that closed, a slice of rows per transaction spread over
``flush_spread_seconds`` (a fleet's minute never holds the event loop or the interpreter in one stretch), decides
GPU_MEMORY_HIGH per node (raise after the card stayed full for the configured time, resolve as soon as no card
of the node is full) and, after rows were written, runs retention cleanup once per interval. A failed write
keeps the rows (bounded) for the next flush and never reaches the heartbeat.

The recorder also keeps the newest known values of every card (the five counters and the metrics) for the
Prometheus exposition: what is unknown — or no longer reported — has no series, never a 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import structlog

from heteroflow.core.clock import Clock
from heteroflow.core.ids import NodeId, TenantId
from heteroflow.health.counters import Counters
from heteroflow.health.gpu_metrics import (
    GPU_MEMORY_HIGH,
    MEMORY_HIGH_RESOLUTION,
    NO_METRIC_VALUES,
    ClosedMinute,
    FlatRow,
    MemoryHighTracker,
    MetricReading,
    MinuteAggregator,
    flat_row,
    memory_high_message,
    read_metric_values,
)
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.platform.nodes import NodeRecord
from heteroflow.platform_server.alert_delivery import AlertNotifier
from heteroflow.platform_server.metrics import NO_METRICS, FlatCards
from heteroflow.storage.alert_store import SYSTEM, AlertRecord, SqlAlertStore
from heteroflow.storage.metrics_store import SqlGpuMetricsStore

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class MetricsRecorderStatus:
    open_minutes: int
    pending_rows: int
    readings_total: int
    rows_written_total: int
    rows_dropped_total: int
    flushes_total: int
    write_failures_total: int
    cleanup_runs_total: int
    cleanup_deleted_total: int
    alerts_raised_total: int
    alerts_resolved_total: int
    alert_failures_total: int
    last_error: str | None


@dataclass(slots=True)
class _Known:
    node_name: str
    tenant_id: TenantId | None
    uuid: str | None = None
    counters: Counters | None = None
    counters_at: float = 0.0
    metrics: bytearray = field(default_factory=functools.partial(bytearray, NO_METRIC_VALUES))
    """The newest metrics as plain bytes, a copy of those the minute bucket took (``MinuteAggregator.add_beat``),
    written in place by every beat: a fleet's newest values are no object that the collector tracks, and no object
    made by a beat outlives it. As one object per card and beat they were tens of thousands of new objects every few
    seconds, each living until its card's next beat, which every young collection walked and promoted
    (docs/benchmarks.md)."""
    metrics_at: float = -math.inf


class GpuMetricsRecorder:
    def __init__(
        self,
        *,
        store: SqlGpuMetricsStore,
        alerts: SqlAlertStore,
        clock: Clock,
        settings: GpuMetricsSettings,
        notifier: AlertNotifier | None = None,
    ) -> None:
        self._store = store
        self._alerts = alerts
        self._clock = clock
        self._settings = settings
        self._notifier = notifier
        self._aggregator = MinuteAggregator()
        self._tracker = MemoryHighTracker(settings.memory_high)
        self._known: dict[CardKey, _Known] = {}
        self._alerting_nodes: dict[NodeId, tuple[str, TenantId | None]] = {}
        # closed minute rows, oldest first: built ones (a failed write keeps them), then the closed minutes whose
        # buckets are not built yet, each minute's dict emptied a bucket at a time as its rows are built (an item
        # per bucket made at once, a fleet's minute of them, set the young collections off in one stretch)
        self._pending: deque[FlatRow] = deque()
        self._unbuilt: deque[ClosedMinute] = deque()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._last_cleanup: datetime | None = None
        self._written_since_cleanup = 0
        self._readings = 0
        self._written = 0
        self._dropped = 0
        self._flushes = 0
        self._write_failures = 0
        self._cleanup_runs = 0
        self._cleanup_deleted = 0
        self._raised = 0
        self._resolved = 0
        self._alert_failures = 0
        self._last_error: str | None = None

    # -- the heartbeat side ------------------------------------------------------------------------------

    def offer(self, node: NodeRecord, *, metrics: Sequence[MetricReading], health: Sequence[HealthReading]) -> None:
        """Take one beat's metrics (and health counters, for /metrics). Never raises, never touches the database."""
        now = self._clock.monotonic()
        self._readings += len(metrics)
        packed = self._aggregator.add_beat(metrics)
        find = self._known.get  # a steady card is found, not built: one lookup per card and side path
        for (key, uuid, _, _, _), values in zip(metrics, packed, strict=True):
            known = find(key) or self._known_card(node, key)
            known.uuid, known.metrics_at = uuid, now
            known.metrics[:] = values
        if metrics and node.source == "real":  # simulated data never alerts
            observe = self._tracker.observe
            for reading in metrics:
                observe(reading)
            self._alerting_nodes[node.id] = (node.name, node.tenant_id)
        for key, uuid, _, counters, _, _ in health:  # unpacked: no attribute lookups
            if counters.all_unknown:
                continue
            known = find(key) or self._known_card(node, key)
            known.uuid, known.counters, known.counters_at = uuid, counters, now

    def _known_card(self, node: NodeRecord, key: CardKey) -> _Known:
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = _Known(node_name=node.name, tenant_id=node.tenant_id)
        return known

    def forget_node(self, node_id: NodeId) -> None:
        """Drop everything kept for a deleted node (its series disappear from /metrics at once)."""
        for key in [key for key in self._known if key.node_id == node_id]:
            del self._known[key]
        self._aggregator.forget_node(node_id)
        self._tracker.forget_node(node_id)
        self._alerting_nodes.pop(node_id, None)
        self._pending = deque(row for row in self._pending if row[0] != node_id)
        for _, group in self._unbuilt:
            for slot in [slot for slot in group if slot[0] == node_id]:
                del group[slot]

    def latest(self, *, slice_cards: int = 2_000) -> Iterator[FlatCards]:
        """The newest values of every card heard of recently, ``slice_cards`` at a time, as :data:`FlatCards`
        (the cards' own values, no object per card); stale parts are ``None`` (no series). The card table is copied
        at the first step (its keys and its values: two lists), so a scrape may copy one slice, let the event loop
        answer what is ready, and copy the next."""
        cutoff = self._clock.monotonic() - self._settings.export_stale_seconds
        for keys, cards in self._known_slices(slice_cards):
            yield self._latest_cards(keys, cards, cutoff)

    def _known_slices(self, size: int) -> Iterator[tuple[list[CardKey], list[_Known]]]:
        """The card table copied at the first step (its keys and its values: two lists), then ``size`` cards at a
        time: the caller may let the event loop run between slices."""
        keys, cards = list(self._known), list(self._known.values())
        for start in range(0, len(keys), size):
            yield keys[start : start + size], cards[start : start + size]

    @staticmethod
    def _latest_cards(keys: list[CardKey], cards: list[_Known], cutoff: float) -> FlatCards:
        flat: FlatCards = []
        for key, known in zip(keys, cards, strict=True):
            counters = known.counters if known.counters_at >= cutoff else None
            if known.metrics_at >= cutoff:  # the values are added to the list one by one: no object per card
                flat += (known.node_name, key.gpu_index, known.uuid, counters, *read_metric_values(known.metrics))
            elif counters is not None:
                flat += (known.node_name, key.gpu_index, known.uuid, counters, *NO_METRICS)
        return flat

    def status(self) -> MetricsRecorderStatus:
        return MetricsRecorderStatus(
            open_minutes=len(self._aggregator),
            pending_rows=len(self._pending) + self._unbuilt_rows(),
            readings_total=self._readings,
            rows_written_total=self._written,
            rows_dropped_total=self._dropped,
            flushes_total=self._flushes,
            write_failures_total=self._write_failures,
            cleanup_runs_total=self._cleanup_runs,
            cleanup_deleted_total=self._cleanup_deleted,
            alerts_raised_total=self._raised,
            alerts_resolved_total=self._resolved,
            alert_failures_total=self._alert_failures,
            last_error=self._last_error,
        )

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gpu-metrics-flush")

    async def stop(self) -> None:
        """Stop the loop and write every open minute (best effort)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.flush(final=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._settings.flush_seconds)
            try:
                await self.flush(paced=True)
            except Exception as exc:  # pragma: no cover - flush logs its own failures
                _log.warning("gpu_metrics.flush_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    async def flush(self, *, final: bool = False, paced: bool = False) -> None:
        """Write the closed minutes, decide GPU_MEMORY_HIGH, expire old rows when due.

        The rows are built and written a slice at a time (``flush_slice_rows``, one transaction each); ``paced``
        (the background loop) spreads the slices over ``flush_spread_seconds``, so that a fleet's minute never
        holds the event loop or the interpreter for long. ``final`` writes every open minute, without pauses.
        """
        async with self._lock:
            self._flushes += 1
            now = self._clock.now()
            taken = self._aggregator.take_closed(now=None if final else now)
            self._unbuilt.extend(taken)
            self._drop_overflow()
            if self._pending or self._unbuilt:
                await self._write(paced=paced and not final)
            if self._settings.memory_high_alerts and not final:
                await self._alert_upkeep(now)
            if self._written_since_cleanup and self._cleanup_due(now) and not final:
                await self._cleanup(now)
            await self._forget_silent_cards()

    def _drop_overflow(self) -> None:
        overflow = len(self._pending) + self._unbuilt_rows() - self._settings.max_pending_rows
        while overflow > 0 and self._pending:
            self._pending.popleft()
            self._dropped += 1
            overflow -= 1
        while overflow > 0 and self._unbuilt:
            _, group = self._unbuilt[0]
            for slot in list(itertools.islice(group, overflow)):
                del group[slot]
                self._dropped += 1
                overflow -= 1
            if not group:
                self._unbuilt.popleft()

    def _unbuilt_rows(self) -> int:
        return sum(len(group) for _, group in self._unbuilt)

    def _build(self, count: int) -> list[FlatRow]:
        """Up to ``count`` rows of the oldest buckets not built yet, in the order their cards first reported; each
        bucket leaves its minute as its row is built."""
        rows: list[FlatRow] = []
        while len(rows) < count and self._unbuilt:
            minute, group = self._unbuilt[0]
            for slot in list(itertools.islice(group, count - len(rows))):
                rows.append(flat_row((minute, (slot, group.pop(slot)))))
            if not group:
                self._unbuilt.popleft()
        return rows

    async def _forget_silent_cards(self, *, slice_cards: int = 5_000) -> None:
        """Drop the newest values of cards silent for ten export periods (memory stays bounded by the fleet),
        ``slice_cards`` at a time, the event loop answering between slices (a fleet's 80,000 cards at once held it
        for 25-50 ms)."""
        cutoff = self._clock.monotonic() - 10 * self._settings.export_stale_seconds
        for number, (keys, cards) in enumerate(self._known_slices(slice_cards)):
            if number:
                await asyncio.sleep(0)
            for key, known in zip(keys, cards, strict=True):
                if max(known.counters_at, known.metrics_at) < cutoff and self._known.get(key) is known:
                    del self._known[key]

    async def _write(self, *, paced: bool) -> None:
        # a slice at a time: a fleet's minute (24,000 cards) built at once took ~0.4 s of Python in one stretch,
        # and its rows' parameters at once a transient ~100 MiB peak the allocator kept as resident memory
        size = self._settings.flush_slice_rows
        slices = -(-(len(self._pending) + self._unbuilt_rows()) // size)
        pause = self._settings.flush_spread_seconds / slices if paced else 0.0
        while self._pending or self._unbuilt:
            missing = size - len(self._pending)
            if missing > 0 and self._unbuilt:
                self._pending.extend(self._build(missing))
            if not self._pending:  # only emptied minutes were left
                break
            batch = [self._pending[i] for i in range(min(size, len(self._pending)))]
            try:
                written = await asyncio.to_thread(self._store.insert_flat, batch)
            except Exception as exc:  # kept for the next flush; the heartbeat never notices
                self._write_failures += 1
                self._last_error = f"{type(exc).__name__}: {exc}"[:500]
                _log.warning(
                    "gpu_metrics.write_failed", error=self._last_error, rows=len(self._pending) + self._unbuilt_rows()
                )
                return
            # the written rows leave the front; a node deleted meanwhile (forget_node) took its rows out already,
            # so the batch's rows still there are counted by identity, never by the batch's length
            sent = {id(row) for row in batch}
            while self._pending and id(self._pending[0]) in sent:
                self._pending.popleft()
            self._written += written
            self._written_since_cleanup += written
            self._last_error = None
            if pause and (self._pending or self._unbuilt):
                await self._clock.sleep(pause)

    async def _alert_upkeep(self, now: datetime) -> None:
        if not self._alerting_nodes:
            return
        try:
            opened = await asyncio.to_thread(self._alerts.open_alerts, GPU_MEMORY_HIGH)
        except Exception as exc:
            self._note_alert_failure(exc)
            return
        # only nodes this server hears from: another server owns the beats (and the verdict) of the others
        open_here = {alert.node_id: alert for alert in opened if alert.node_id in self._alerting_nodes}
        stale = timedelta(seconds=self._settings.export_stale_seconds)
        decision = self._tracker.decide(now=now, stale=stale, open_on=open_here)
        params = self._settings.memory_high
        for node_id, cards in decision.raise_for.items():
            name, tenant_id = self._alerting_nodes[node_id]
            message = memory_high_message(
                node_name=name, gpu_indexes=cards, share=params.share, duration=params.duration
            )
            try:
                alert, created = await asyncio.to_thread(
                    self._alerts.raise_alert,
                    type=GPU_MEMORY_HIGH,
                    severity="WARN",
                    node_id=node_id,
                    node_name=name,
                    tenant_id=tenant_id,
                    message=message,
                    now=now,
                )
            except Exception as exc:
                self._note_alert_failure(exc)
                continue
            if created:
                self._raised += 1
                if self._notifier is not None:
                    self._notifier.submit("raised", alert)
        for node_id in decision.resolve:
            if await self._resolve(open_here[node_id], now):
                self._resolved += 1

    async def _resolve(self, alert: AlertRecord, now: datetime) -> bool:
        try:
            resolved = await asyncio.to_thread(
                self._alerts.resolve, alert.id, by=SYSTEM, reason=MEMORY_HIGH_RESOLUTION, now=now
            )
            record = await asyncio.to_thread(self._alerts.get, alert.id) if resolved else None
        except Exception as exc:
            self._note_alert_failure(exc)
            return False
        if record is not None and self._notifier is not None:
            self._notifier.submit("resolved", record)
        return resolved

    def _note_alert_failure(self, exc: Exception) -> None:
        self._alert_failures += 1
        self._last_error = f"{type(exc).__name__}: {exc}"[:500]
        _log.warning("gpu_metrics.alert_failed", error=self._last_error)

    def _cleanup_due(self, now: datetime) -> bool:
        interval = timedelta(seconds=self._settings.cleanup_interval_seconds)
        return self._last_cleanup is None or now - self._last_cleanup >= interval

    async def _cleanup(self, now: datetime) -> None:
        cutoff = now - timedelta(days=self._settings.retention_days)
        timeout = self._settings.cleanup_timeout_seconds
        self._cleanup_runs += 1
        self._last_cleanup = now
        try:
            deleted = await asyncio.wait_for(
                asyncio.to_thread(self._store.delete_older_than, cutoff, timeout_sec=timeout), timeout
            )
        except Exception as exc:
            self._last_error = f"{type(exc).__name__}: {exc}"[:500]
            _log.warning("gpu_metrics.cleanup_failed", error=self._last_error)
            return
        self._written_since_cleanup = 0
        self._cleanup_deleted += deleted
