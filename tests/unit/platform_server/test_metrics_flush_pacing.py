"""The GPU metrics flush writes a closed minute in slices, paced by the clock, and loses nothing."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from heteroflow.core.ids import NodeId
from heteroflow.core.testing import FakeClock
from heteroflow.health.gpu_metrics import FlatRow, GpuMetrics, MetricReading
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.samples import CardKey
from heteroflow.platform.nodes import NodeRecord
from heteroflow.platform_server.gpu_metrics import GpuMetricsRecorder
from heteroflow.storage.alert_store import SqlAlertStore
from heteroflow.storage.metrics_store import SqlGpuMetricsStore

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NODES, CARDS = 25, 8  # 200 cards: one row each per minute


class PausesClock(FakeClock):
    """A fake clock whose sleeps are recorded and pass at once (the clock moves by them)."""

    def __init__(self) -> None:
        super().__init__(T0)
        self.pauses: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.advance(max(seconds, 0.0))
        await asyncio.sleep(0)


class FakeStore(SqlGpuMetricsStore):
    def __init__(self, *, fail_calls: Sequence[int] = ()) -> None:
        self.batches: list[list[FlatRow]] = []
        self.calls = 0
        self._fail_calls = set(fail_calls)

    def insert_flat(self, rows: Sequence[FlatRow]) -> int:
        self.calls += 1
        if self.calls in self._fail_calls:
            raise ConnectionError("database unavailable")
        self.batches.append(list(rows))
        return len(rows)

    def written(self) -> list[tuple[Any, ...]]:
        return [(row[0], row[1], row[4]) for batch in self.batches for row in batch]


class NoAlerts(SqlAlertStore):
    def __init__(self) -> None:
        pass


def settings(**values: Any) -> GpuMetricsSettings:
    return GpuMetricsSettings.load(**{"memory_high_alerts": False, "flush_slice_rows": 30, **values})


def recorder(clock: FakeClock, store: FakeStore, **values: Any) -> GpuMetricsRecorder:
    return GpuMetricsRecorder(store=store, alerts=NoAlerts(), clock=clock, settings=settings(**values))


def node(n: int) -> NodeRecord:
    return NodeRecord(
        id=NodeId(f"node-{n:03d}"),
        name=f"node-{n:03d}",
        vendor="nvidia",
        model="H200",
        gpu_count=CARDS,
        source="real",
        tenant_id=None,
        registered_at=T0,
        last_heartbeat_at=None,
    )


def beat_fleet(rec: GpuMetricsRecorder, clock: FakeClock) -> None:
    """One beat of every node in the minute now open."""
    for n in range(NODES):
        record = node(n)
        readings = [
            MetricReading(
                key=CardKey(node_id=record.id, gpu_index=g, source="real"),
                uuid=f"GPU-{n}-{g}",
                sampled_at=clock.now(),
                metrics=GpuMetrics(40.0 + g, 50.0, 1000.0, 80_000.0, 300.0),
            )
            for g in range(CARDS)
        ]
        rec.offer(record, metrics=readings, health=[])


def fleet_cards(minute: datetime) -> set[tuple[Any, ...]]:
    return {(NodeId(f"node-{n:03d}"), g, minute) for n in range(NODES) for g in range(CARDS)}


def test_a_paced_flush_writes_the_minute_in_bounded_slices_spread_over_the_setting() -> None:
    clock, store = PausesClock(), FakeStore()
    rec = recorder(clock, store, flush_slice_rows=30, flush_spread_seconds=20)
    beat_fleet(rec, clock)
    clock.advance(65)
    asyncio.run(rec.flush(paced=True))
    sizes = [len(batch) for batch in store.batches]
    assert sizes == [30] * 6 + [20]  # 200 rows, no slice above the setting
    written = store.written()
    assert len(written) == len(set(written))
    assert set(written) == fleet_cards(T0)
    assert clock.pauses == [pytest.approx(20 / 7)] * 6  # between the slices, not after the last
    assert sum(clock.pauses) <= 20
    assert rec.status().pending_rows == 0
    assert rec.status().rows_written_total == NODES * CARDS


def test_a_direct_flush_and_the_final_flush_write_everything_without_pauses() -> None:
    clock, store = PausesClock(), FakeStore()
    rec = recorder(clock, store, flush_slice_rows=30, flush_spread_seconds=20)

    async def main() -> None:
        beat_fleet(rec, clock)
        clock.advance(65)
        await rec.flush()  # not the background loop: back to back
        beat_fleet(rec, clock)  # the minute now open: written by the final flush, still open or not
        await rec.stop()

    asyncio.run(main())
    assert clock.pauses == []
    assert max(len(batch) for batch in store.batches) == 30
    assert set(store.written()) == fleet_cards(T0) | fleet_cards(T0 + timedelta(minutes=1))
    assert len(store.written()) == 2 * NODES * CARDS


def test_a_failed_slice_keeps_its_rows_and_the_unbuilt_ones_for_the_next_flush() -> None:
    clock, store = PausesClock(), FakeStore(fail_calls=[3])
    rec = recorder(clock, store, flush_slice_rows=30, flush_spread_seconds=20)
    beat_fleet(rec, clock)
    clock.advance(65)
    asyncio.run(rec.flush(paced=True))
    status = rec.status()
    assert status.write_failures_total == 1
    assert status.rows_written_total == 60
    assert status.pending_rows == NODES * CARDS - 60
    assert status.last_error is not None
    asyncio.run(rec.flush(paced=True))
    written = store.written()
    assert len(written) == len(set(written))
    assert set(written) == fleet_cards(T0)
    assert rec.status().pending_rows == 0
    assert max(len(batch) for batch in store.batches) == 30


def test_rows_beyond_max_pending_are_dropped_oldest_first_built_or_not() -> None:
    clock, store = PausesClock(), FakeStore(fail_calls=[1])
    rec = recorder(clock, store, flush_slice_rows=30, max_pending_rows=250)
    beat_fleet(rec, clock)
    clock.advance(65)
    asyncio.run(rec.flush(paced=True))  # the first slice fails: 30 built rows and 170 buckets kept
    assert rec.status().pending_rows == NODES * CARDS
    beat_fleet(rec, clock)
    clock.advance(60)
    store._fail_calls.add(2)  # the next minute closes while the database is still down
    asyncio.run(rec.flush(paced=True))
    status = rec.status()
    assert status.rows_dropped_total == 2 * NODES * CARDS - 250
    assert status.pending_rows == 250
    asyncio.run(rec.flush(paced=True))
    written = store.written()
    assert len(written) == 250
    minute_two = fleet_cards(T0 + timedelta(minutes=1))
    assert minute_two <= set(written)  # the oldest (the first minute's) went first


def test_forgetting_a_node_drops_its_rows_not_yet_written() -> None:
    clock, store = PausesClock(), FakeStore(fail_calls=[1])
    rec = recorder(clock, store, flush_slice_rows=30)
    beat_fleet(rec, clock)
    clock.advance(65)
    asyncio.run(rec.flush(paced=True))
    rec.forget_node(NodeId("node-000"))  # one of the first slice's (built) and...
    rec.forget_node(NodeId(f"node-{NODES - 1:03d}"))  # ...one whose buckets were not built yet
    asyncio.run(rec.flush(paced=True))
    assert {row[0] for row in store.written()} == {NodeId(f"node-{n:03d}") for n in range(1, NODES - 1)}
    assert len(store.written()) == (NODES - 2) * CARDS


class SignallingClock(FakeClock):
    """A fake clock whose sleeps wait until it is moved, and say when one begins."""

    def __init__(self) -> None:
        super().__init__(T0)
        self.sleeping = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.sleeping.set()
        await super().sleep(seconds)


def test_a_paced_flush_cancelled_between_slices_leaves_the_rest_to_the_final_flush() -> None:
    clock, store = SignallingClock(), FakeStore()
    rec = recorder(clock, store, flush_slice_rows=30, flush_spread_seconds=20)

    async def main() -> None:
        beat_fleet(rec, clock)
        clock.advance(65)
        paced = asyncio.create_task(rec.flush(paced=True))
        pausing = asyncio.create_task(clock.sleeping.wait())
        await asyncio.wait({paced, pausing}, return_when=asyncio.FIRST_COMPLETED)
        assert not paced.done()  # the first slice is written; the flush waits for the clock
        assert rec.status().rows_written_total == 30
        paced.cancel()  # the server stops
        with pytest.raises(asyncio.CancelledError):
            await paced
        await rec.flush(final=True)

    asyncio.run(main())
    written = store.written()
    assert len(written) == len(set(written))
    assert set(written) == fleet_cards(T0)


def test_taking_a_closed_minute_makes_no_object_per_card_for_the_collector() -> None:
    """The flush takes a fleet's minute as it is and builds rows a slice at a time: a pair per bucket made at the
    minute's close (80,000 at 10,000 nodes) set several young collections off in one stretch of the event loop."""
    clock, store = PausesClock(), FakeStore(fail_calls=[1])
    rec = recorder(clock, store, flush_slice_rows=30)
    beat_fleet(rec, clock)
    clock.advance(65)
    gc.collect()
    gc.disable()  # nothing collected meanwhile: the young generation holds what the flush left alive
    try:
        before = len(gc.get_objects(0))
        asyncio.run(rec.flush(paced=True))  # the first slice fails: its 30 rows are kept, the rest stays unbuilt
        made = len(gc.get_objects(0)) - before
    finally:
        gc.enable()
    assert rec.status().pending_rows == NODES * CARDS
    assert made < NODES * CARDS  # the kept slice's rows and the loop's own, not one per card (200)


class BlockingStore(FakeStore):
    """A store whose first write waits until released, as a slow database holds a worker thread."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def insert_flat(self, rows: Sequence[FlatRow]) -> int:
        if self.calls == 0:
            self.entered.set()
            self.release.wait(10)
        return super().insert_flat(rows)


def test_a_node_deleted_while_a_slice_is_written_costs_no_other_node_its_rows() -> None:
    clock, store = PausesClock(), BlockingStore()
    rec = recorder(clock, store, flush_slice_rows=30)
    gone = NodeId("node-001")  # its 8 rows are in the first slice, with node-000's, node-002's and 6 of node-003's

    async def main() -> None:
        beat_fleet(rec, clock)
        clock.advance(65)
        flush = asyncio.create_task(rec.flush())
        await asyncio.to_thread(store.entered.wait, 10)
        rec.forget_node(gone)  # on the event loop, while the slice is in the worker thread
        store.release.set()
        await flush

    asyncio.run(main())
    others = {card for card in fleet_cards(T0) if card[0] != gone}
    written = store.written()
    assert others <= set(written)  # every other node's minute written
    assert len(written) == len(set(written))
    assert rec.status().pending_rows == 0
