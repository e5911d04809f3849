"""The heartbeat's health side path (H-20…H-24): offer, dedupe, write in the background, expire.

The heartbeat handler calls :meth:`HealthIngestor.offer` and returns. Readings that the dedup cache proves
unchanged are dropped on the spot (zero database access); the rest wait, per card, for the writer task,
which decides each against the newest stored row and inserts what must be written in one transaction. A
failed write never reaches the heartbeat: it is logged, counted, and the readings are retried with backoff,
so when the database returns the samples resume. Retention cleanup runs in its own task with its own
timeout once per ``cleanup_every_writes`` written rows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog

from heteroflow.core.clock import Clock
from heteroflow.core.ids import NodeId
from heteroflow.health.dedup import DedupCache
from heteroflow.health.sample_times import after_newest
from heteroflow.health.samples import CardKey, HealthReading, StoredSample
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.health.store import HealthSampleStore, StoreUnavailableError
from heteroflow.health.write_policy import decide_write

_log = structlog.get_logger(__name__)

_RETRY_MIN_SECONDS = 0.2
_RETRY_MAX_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class IngestStatus:
    """A snapshot of the side path, for the status route, metrics and tests."""

    pending_readings: int
    cache_entries: int
    cache_capacity_evictions: int
    offered_total: int
    written_total: int
    skipped_dedup_total: int
    skipped_all_unknown_total: int
    skipped_unchanged_total: int
    dropped_total: int
    write_failures_total: int
    selects_total: int
    cleanup_runs_total: int
    cleanup_failures_total: int
    cleanup_deleted_total: int
    last_cleanup_at: datetime | None
    last_write_error: str | None
    writer_backing_off: bool
    moved_after_newest_total: int = 0
    """Readings whose time was not after their card's newest stored row, written just after it instead."""
    isolated_failures_total: int = 0
    """Readings dropped alone after their batch failed permanently (the batch's other readings were written)."""


@dataclass(frozen=True, slots=True)
class _BatchResult:
    written: list[StoredSample]
    confirmed: list[StoredSample]
    skipped: int
    selects: int
    moved: int


class HealthIngestor:
    def __init__(
        self,
        *,
        store: HealthSampleStore,
        clock: Clock,
        settings: HealthStorageSettings,
    ) -> None:
        self._store = store
        self._clock = clock
        self._settings = settings
        self._keepalive = timedelta(seconds=settings.keepalive_seconds)
        self._max_ahead = timedelta(seconds=settings.clock_skew_seconds)
        self._cache = DedupCache(
            keepalive=self._keepalive,
            max_entries=settings.dedup_cache_entries,
            idle_sec=settings.dedup_idle_seconds,
        )
        self._pending: OrderedDict[CardKey, deque[HealthReading]] = OrderedDict()
        self._pending_count = 0
        self._in_flight: set[CardKey] = set()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._cleanup: asyncio.Task[None] | None = None
        self._writes_since_cleanup = 0
        self._backing_off = False
        self._idle_drained = asyncio.Event()
        self._idle_drained.set()
        # counters behind IngestStatus
        self._offered = 0
        self._written = 0
        self._skipped_dedup = 0
        self._skipped_unknown = 0
        self._skipped_unchanged = 0
        self._dropped = 0
        self._write_failures = 0
        self._selects = 0
        self._moved = 0
        self._isolated = 0
        self._cleanup_runs = 0
        self._cleanup_failures = 0
        self._cleanup_deleted = 0
        self._last_cleanup_at: datetime | None = None
        self._last_write_error: str | None = None

    # -- the heartbeat side ------------------------------------------------------------------------------

    def offer(self, readings: Iterable[HealthReading]) -> None:
        """Take one heartbeat's readings. Never raises, never touches the database."""
        now = self._clock.monotonic()
        pending, in_flight, can_skip = self._pending, self._in_flight, self._cache.can_skip
        offered = skipped = 0  # counted once per beat, not once per card
        for reading in readings:
            offered += 1
            if reading.counters.all_unknown:
                self._skipped_unknown += 1
                continue
            key = reading.key
            queue = pending.get(key)
            # while a batch holding this card is being written, the cache may not show its newest row yet,
            # so only the writer (which sees the batch's outcome) may decide to skip
            if queue is None:
                if key not in in_flight and can_skip(reading, now=now):
                    skipped += 1
                    continue
            elif _same_values(queue[-1], reading):
                skipped += 1  # already waiting with these values
                continue
            if self._pending_count >= self._settings.max_pending_readings:
                self._dropped += 1
                continue
            if queue is None:
                queue = self._pending[reading.key] = deque()
            queue.append(reading)
            self._pending_count += 1
            self._idle_drained.clear()
            self._wake.set()
        self._offered += offered
        self._skipped_dedup += skipped

    def forget_node(self, node_id: NodeId) -> None:
        """Drop everything cached or waiting for a deleted node."""
        self._cache.forget_node(node_id)
        for key in [key for key in self._pending if key.node_id == node_id]:
            self._pending_count -= len(self._pending.pop(key))

    def status(self) -> IngestStatus:
        return IngestStatus(
            pending_readings=self._pending_count,
            cache_entries=len(self._cache),
            cache_capacity_evictions=self._cache.capacity_evictions,
            offered_total=self._offered,
            written_total=self._written,
            skipped_dedup_total=self._skipped_dedup,
            skipped_all_unknown_total=self._skipped_unknown,
            skipped_unchanged_total=self._skipped_unchanged,
            dropped_total=self._dropped,
            write_failures_total=self._write_failures,
            selects_total=self._selects,
            cleanup_runs_total=self._cleanup_runs,
            cleanup_failures_total=self._cleanup_failures,
            cleanup_deleted_total=self._cleanup_deleted,
            last_cleanup_at=self._last_cleanup_at,
            last_write_error=self._last_write_error,
            writer_backing_off=self._backing_off,
            moved_after_newest_total=self._moved,
            isolated_failures_total=self._isolated,
        )

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._writer is None:
            self._writer = asyncio.create_task(self._run_writer(), name="health-writer")

    async def stop(self, *, drain_timeout: float = 5.0) -> None:
        """Write what is waiting (bounded by ``drain_timeout``), then stop the tasks."""
        if self._writer is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.drained(), drain_timeout)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._cleanup is not None:
            self._cleanup.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cleanup
            self._cleanup = None

    async def drained(self) -> None:
        """Wait until no reading is waiting for the writer (tests and shutdown use this)."""
        await self._idle_drained.wait()

    async def cleanup_finished(self) -> None:
        """Wait for a running retention cleanup, if any."""
        if self._cleanup is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._cleanup)

    # -- the writer ---------------------------------------------------------------------------------------

    async def _run_writer(self) -> None:
        delay = _RETRY_MIN_SECONDS
        while True:
            if not self._pending:
                self._idle_drained.set()
                self._cache.evict_idle(now=self._clock.monotonic())
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._take_batch()
            known = {r.key: s for r in batch if (s := self._cache.get(r.key, now=self._clock.monotonic()))}
            self._in_flight = {r.key for r in batch}
            failed = 0
            try:
                result = await asyncio.to_thread(self._write_batch, batch, known)
            except StoreUnavailableError as exc:
                # transient: keep the readings, back off, try again
                self._in_flight = set()
                self._note_failure(exc, readings=len(batch), retrying=True)
                self._requeue(batch)
                self._backing_off = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_SECONDS)
                continue
            except Exception as exc:
                # Permanent for this batch: one bad reading must not take the other cards down with it, so the
                # batch is written again one reading at a time and only the readings that fail are dropped. The
                # cache was not confirmed for those, so the agent's next beat re-offers the same counters.
                self._note_failure(exc, readings=len(batch), retrying=False)
                try:
                    result, failed = await asyncio.to_thread(self._write_each, batch)
                except StoreUnavailableError:  # the database went away meanwhile: keep them all, as above
                    self._in_flight = set()
                    self._requeue(batch)
                    self._backing_off = True
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _RETRY_MAX_SECONDS)
                    continue
                self._dropped += failed
                self._isolated += failed
                if failed == len(batch):
                    self._in_flight = set()
                    continue
            delay = _RETRY_MIN_SECONDS
            self._backing_off = False
            if not failed:
                self._last_write_error = None
            now = self._clock.monotonic()
            for sample in result.confirmed:
                self._cache.confirm(sample, now=now)
            self._in_flight = set()
            self._selects += result.selects
            self._skipped_unchanged += result.skipped
            self._moved += result.moved
            self._written += len(result.written)
            self._count_writes(len(result.written))

    def _note_failure(self, exc: Exception, *, readings: int, retrying: bool) -> None:
        self._write_failures += 1
        self._last_write_error = f"{type(exc).__name__}: {exc}"[:500]
        _log.warning("health.write_failed", error=self._last_write_error, readings=readings, retrying=retrying)

    def _take_batch(self) -> list[HealthReading]:
        batch: list[HealthReading] = []
        while self._pending and len(batch) < self._settings.write_batch_size:
            key, queue = next(iter(self._pending.items()))
            batch.append(queue.popleft())
            self._pending_count -= 1
            if not queue:
                del self._pending[key]
            else:
                self._pending.move_to_end(key)
        return batch

    def _requeue(self, batch: Sequence[HealthReading]) -> None:
        """Put a failed batch back in front of newer readings of the same cards (order kept)."""
        for reading in reversed(batch):
            queue = self._pending.get(reading.key)
            if queue is None:
                queue = self._pending[reading.key] = deque()
                self._pending.move_to_end(reading.key, last=False)
            queue.appendleft(reading)
            self._pending_count += 1

    def _write_each(self, batch: Sequence[HealthReading]) -> tuple[_BatchResult, int]:
        """Runs in a worker thread: the batch one reading per transaction; the readings that still fail are counted.

        Every reading is decided against the database (no cache entry is trusted: earlier readings of the same card
        may just have been written). A transient failure propagates: the caller keeps the whole batch.
        """
        written: list[StoredSample] = []
        confirmed: list[StoredSample] = []
        skipped = selects = moved = failed = 0
        for reading in batch:
            try:
                one = self._write_batch([reading], {})
            except StoreUnavailableError:
                raise
            except Exception as exc:
                failed += 1
                self._last_write_error = f"{type(exc).__name__}: {exc}"[:500]
                _log.warning("health.reading_dropped", node_id=reading.key.node_id, gpu_index=reading.key.gpu_index)
                continue
            written += one.written
            confirmed += one.confirmed
            skipped, selects, moved = skipped + one.skipped, selects + one.selects, moved + one.moved
        result = _BatchResult(written=written, confirmed=confirmed, skipped=skipped, selects=selects, moved=moved)
        return result, failed

    def _write_batch(self, batch: Sequence[HealthReading], known: dict[CardKey, StoredSample]) -> _BatchResult:
        """Runs in a worker thread: decide every reading against the newest stored row, insert, read back."""
        latest: dict[CardKey, StoredSample | None] = dict(known)
        # A stored row further ahead of this server's clock than any agent time is believed (written before that
        # check existed, or by a server with another clock) is not the card's newest: judged against it, no
        # keepalive would be due until the skew passed.
        not_after = self._clock.now() + self._max_ahead
        selects = 0
        moved = 0
        confirmed: list[StoredSample] = []
        to_write: list[HealthReading] = []
        before_batch: dict[CardKey, StoredSample | None] = {}
        skipped = 0
        read: set[CardKey] = set()
        # The cache only ever proves a skip. A write is decided against what the database holds now: another
        # server behind the same load balancer may have stored this change or keepalive since this cache was
        # filled, and must not be written twice. Every slot the cache does not prove is read up front, in as few
        # statements as the store can (a fleet's first beats are thousands of slots): until this batch is
        # inserted nothing else writes them from here, so the reads are what each reading would have read.
        unproven_keys = {
            reading.key: None
            for reading in batch
            if reading.key not in known
            or decide_write(reading, known[reading.key], keepalive=self._keepalive) is not None
        }
        fetched = self._store.latest_many(list(unproven_keys), not_after=not_after) if unproven_keys else {}
        for reading in batch:
            unproven = reading.key not in latest or (
                decide_write(reading, latest[reading.key], keepalive=self._keepalive) is not None
            )
            if unproven and reading.key not in read:
                selects += 1
                stored = (
                    fetched[reading.key]
                    if reading.key in fetched
                    else self._store.latest(reading.key, not_after=not_after)
                )
                latest[reading.key] = stored
                read.add(reading.key)
                if stored is not None:
                    confirmed.append(stored)
            if decide_write(reading, latest.get(reading.key), keepalive=self._keepalive) is None:
                skipped += 1
                continue
            newest = latest.get(reading.key)
            if reading.key not in before_batch:
                before_batch[reading.key] = newest
            sampled_at, fix = after_newest(reading.sampled_at, newest=newest.sampled_at if newest else None)
            if fix is not None:
                # the agent's clock stepped back (within the tolerance): written before the newest row, the reading
                # would never become the newest, and a changed card would be written again on every beat
                moved += 1
                reading = reading._replace(sampled_at=sampled_at, time_fix=fix)
            to_write.append(reading)
            # later readings of this card in the batch are judged against this one
            latest[reading.key] = StoredSample(
                key=reading.key, uuid=reading.uuid, sampled_at=reading.sampled_at, counters=reading.counters
            )
        written = self._store.insert(to_write, previous=before_batch) if to_write else []
        return _BatchResult(
            written=written, confirmed=confirmed + written, skipped=skipped, selects=selects, moved=moved
        )

    # -- retention ----------------------------------------------------------------------------------------

    def _count_writes(self, count: int) -> None:
        self._writes_since_cleanup += count
        if self._writes_since_cleanup < self._settings.cleanup_every_writes:
            return
        if self._cleanup is not None and not self._cleanup.done():
            return  # one cleanup at a time; the count keeps growing and triggers the next one
        self._writes_since_cleanup = 0
        self._cleanup = asyncio.create_task(self._run_cleanup(), name="health-cleanup")

    async def _run_cleanup(self) -> None:
        cutoff = self._clock.now() - timedelta(days=self._settings.retention_days)
        timeout = self._settings.cleanup_timeout_seconds
        self._cleanup_runs += 1
        try:
            deleted = await asyncio.wait_for(
                asyncio.to_thread(self._store.delete_older_than, cutoff, timeout_sec=timeout),
                timeout,
            )
        except Exception as exc:
            self._cleanup_failures += 1
            _log.warning("health.cleanup_failed", error=f"{type(exc).__name__}: {exc}"[:500])
            return
        self._cleanup_deleted += deleted
        self._last_cleanup_at = self._clock.now()
        _log.info("health.cleanup", deleted=deleted, cutoff=cutoff.isoformat())


def _same_values(a: HealthReading, b: HealthReading) -> bool:
    # a steady card's counters are one shared object (counters.interned_counters): compared by identity first
    return a.uuid == b.uuid and (a.counters is b.counters or a.counters == b.counters)
