"""The side path against the in-memory store: ordering, failures, bounds. No database, no real clock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from heteroflow.core.ids import NodeId
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import Counters
from heteroflow.health.ingest import HealthIngestor
from heteroflow.health.samples import CardKey, HealthReading, StoredSample
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.health.testing import InMemoryHealthSampleStore
from tests.support.polling import IN_PROCESS_SEC, eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def reading(clock: FakeClock, value: int | None, *, index: int = 0, node: str = "n") -> HealthReading:
    return HealthReading(
        key=CardKey(node_id=NodeId(node), gpu_index=index, source="real"),
        uuid="G",
        sampled_at=clock.now(),
        counters=Counters(ecc_corrected_total=value, retired_pages=0),
    )


class GatedStore(InMemoryHealthSampleStore):
    """Inserts wait for the test to open the gate: a batch can be held 'in flight' on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.inserting = threading.Event()

    def insert(self, readings: Sequence[HealthReading], **kwargs: Any) -> list[StoredSample]:
        self.inserting.set()
        self.gate.wait(5)
        return super().insert(readings, **kwargs)


def test_a_reading_offered_while_its_card_is_in_flight_is_not_skipped_by_a_stale_cache() -> None:
    async def scenario() -> None:
        clock = FakeClock(T0)
        store = GatedStore()
        ingestor = HealthIngestor(store=store, clock=clock, settings=HealthStorageSettings.load())
        ingestor.start()
        store.gate.set()
        ingestor.offer([reading(clock, 1)])
        await ingestor.drained()
        store.gate.clear()
        store.inserting.clear()
        clock.advance(5)
        ingestor.offer([reading(clock, None)])  # a change, held in flight at the gate
        await eventually(store.inserting.is_set, within=5, period=IN_PROCESS_SEC, what="a batch being inserted")
        clock.advance(5)
        ingestor.offer([reading(clock, 1)])  # equal to the cached row, but not to the one in flight
        store.gate.set()
        await ingestor.drained()
        await ingestor.stop()
        assert [r.counters.ecc_corrected_total for r in store.rows] == [1, None, 1]

    asyncio.run(scenario())


def test_an_unavailable_store_costs_no_reading_and_the_backlog_is_written_in_order() -> None:
    async def scenario() -> None:
        clock = FakeClock(T0)
        store = InMemoryHealthSampleStore()
        ingestor = HealthIngestor(store=store, clock=clock, settings=HealthStorageSettings.load())
        ingestor.start()
        store.available = False
        for value in (1, 2, 2, 3):
            ingestor.offer([reading(clock, value)])
            clock.advance(5)
        await eventually(
            lambda: ingestor.status().write_failures_total >= 2,
            within=5,
            period=IN_PROCESS_SEC,
            what="two failed writes",
        )
        assert ingestor.status().writer_backing_off
        assert ingestor.status().pending_readings == 3  # the repeated 2 waits once
        store.available = True
        await asyncio.wait_for(ingestor.drained(), 15)
        await ingestor.stop()
        assert [r.counters.ecc_corrected_total for r in store.rows] == [1, 2, 3]
        assert ingestor.status().last_write_error is None

    asyncio.run(scenario())


def test_a_bad_reading_is_dropped_alone_and_never_takes_its_batch_down() -> None:
    class Poisoned(InMemoryHealthSampleStore):
        """Refuses any transaction holding the poison value, as a database refuses a value it cannot store."""

        def insert(self, readings: Sequence[HealthReading], **kwargs: Any) -> list[StoredSample]:
            if any(r.counters.ecc_corrected_total == 666 for r in readings):
                raise ValueError("constraint violated")
            return super().insert(readings, **kwargs)

    async def scenario() -> None:
        clock = FakeClock(T0)
        store = Poisoned()
        ingestor = HealthIngestor(store=store, clock=clock, settings=HealthStorageSettings.load())
        ingestor.start()
        ingestor.offer([reading(clock, 1, node="a"), reading(clock, 666, node="b"), reading(clock, 3, node="c")])
        await ingestor.drained()
        assert sorted(r.key.node_id for r in store.rows) == ["a", "c"]  # the other cards of the batch are written
        status = ingestor.status()
        assert (status.dropped_total, status.isolated_failures_total, status.write_failures_total) == (1, 1, 1)
        assert status.last_write_error == "ValueError: constraint violated"
        clock.advance(5)
        ingestor.offer([reading(clock, 2, node="b")])  # the card's next good reading is written
        await ingestor.drained()
        await ingestor.stop()
        assert sorted(r.key.node_id for r in store.rows) == ["a", "b", "c"]

    asyncio.run(scenario())


def test_the_backlog_is_bounded_and_overflow_is_counted() -> None:
    async def scenario() -> None:
        clock = FakeClock(T0)
        store = InMemoryHealthSampleStore()
        store.available = False
        settings = HealthStorageSettings.load(max_pending_readings=3)
        ingestor = HealthIngestor(store=store, clock=clock, settings=settings)
        for value in range(5):
            ingestor.offer([reading(clock, value)])
        assert ingestor.status().pending_readings == 3
        assert ingestor.status().dropped_total == 2

    asyncio.run(scenario())


def test_forget_node_drops_its_waiting_readings() -> None:
    clock = FakeClock(T0)
    ingestor = HealthIngestor(store=InMemoryHealthSampleStore(), clock=clock, settings=HealthStorageSettings.load())
    ingestor.offer([reading(clock, 1, node="a"), reading(clock, 1, node="b")])
    ingestor.forget_node(NodeId("a"))
    assert ingestor.status().pending_readings == 1


def test_cleanup_failure_is_counted_and_never_stops_the_writer() -> None:
    class NoDelete(InMemoryHealthSampleStore):
        def delete_older_than(self, cutoff: datetime, *, timeout_sec: float) -> int:
            raise RuntimeError("statement timeout")

    async def scenario() -> None:
        clock = FakeClock(T0)
        store = NoDelete()
        ingestor = HealthIngestor(store=store, clock=clock, settings=HealthStorageSettings.load(cleanup_every_writes=2))
        ingestor.start()
        for value in range(3):
            ingestor.offer([reading(clock, value)])
            clock.advance(timedelta(seconds=5).total_seconds())
            await ingestor.drained()
        await ingestor.cleanup_finished()
        await ingestor.stop()
        status = ingestor.status()
        assert status.cleanup_runs_total == 1
        assert status.cleanup_failures_total == 1
        assert status.written_total == 3

    asyncio.run(scenario())
