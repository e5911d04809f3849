from __future__ import annotations

import threading
import time

from heteroflow.agent.collectors import Selection
from heteroflow.agent.readings import GpuHealth, GpuTelemetry, HealthCollection, TelemetryCollection
from heteroflow.agent.scheduler import CollectionService, TickWorker
from heteroflow.agent.testing import FakeCollector
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import Counters


def service(clock: FakeClock, collector: FakeCollector, *, tick_timeout_sec: float = 5.0) -> CollectionService:
    return CollectionService(
        selection=Selection(collector=collector, first_health=None, warnings=()),
        clock=clock,
        heartbeat_interval_sec=5.0,
        health_interval_sec=60.0,
        tick_timeout_sec=tick_timeout_sec,
    )


def health_of(clock: FakeClock, ecc: int) -> HealthCollection:
    return HealthCollection(
        collector="nvidia-smi",
        collected_at=clock.now(),
        gpus=(GpuHealth(index=0, vendor="NVIDIA", counters=Counters(ecc_corrected_total=ecc)),),
    )


def test_a_reading_is_reported_for_three_periods_then_unknown(clock: FakeClock) -> None:
    collector = FakeCollector(clock=clock, health=health_of(clock, 7))
    svc = service(clock, collector)
    assert svc.tick_health() is not None
    clock.advance(180)
    assert svc.snapshot()[0] is not None
    clock.advance(1)
    assert svc.snapshot()[0] is None  # stale → unknown, not the old value


def test_telemetry_goes_stale_after_three_beats(clock: FakeClock) -> None:
    telemetry = TelemetryCollection(
        collector="nvidia-smi", collected_at=clock.now(), gpus=(GpuTelemetry(index=0, temperature_c=40.0),)
    )
    svc = service(clock, FakeCollector(clock=clock, telemetry=telemetry))
    svc.tick_telemetry()
    clock.advance(15)
    assert svc.snapshot()[1] is telemetry
    clock.advance(0.5)
    assert svc.snapshot()[1] is None


def test_a_hung_collector_never_blocks_the_caller_beyond_the_tick_timeout(clock: FakeClock) -> None:
    collector = FakeCollector(clock=clock, health=health_of(clock, 1))
    svc = service(clock, collector, tick_timeout_sec=0.05)
    assert svc.tick_health() is not None
    collector.hold = threading.Event()
    started = time.monotonic()
    assert svc.tick_health() is None  # timed out
    assert svc.tick_health() is None  # still stuck: answered at once, no second call started
    assert time.monotonic() - started < 2.0
    assert collector.health_reads == 2
    assert svc.status().health_timeouts == 2
    # the beat side keeps answering from the cache until it is stale
    assert svc.snapshot()[0] is not None
    clock.advance(181)
    assert svc.snapshot()[0] is None
    collector.hold.set()


def test_tick_worker_returns_the_result_and_survives_a_raising_function() -> None:
    worker: TickWorker[int] = TickWorker("t")
    assert worker.run(lambda: 3, timeout_sec=5.0) == 3

    def boom() -> int:
        raise RuntimeError("collector bug")

    assert worker.run(boom, timeout_sec=5.0) is None
    assert worker.run(lambda: 4, timeout_sec=5.0) == 4


def test_selection_result_is_the_first_tick_and_reselect_replaces_none(clock: FakeClock) -> None:
    from heteroflow.agent.collectors import NoCollector

    found = FakeCollector(clock=clock, health=health_of(clock, 2))
    calls: list[int] = []

    def reselect() -> Selection:
        calls.append(1)
        return Selection(collector=found, first_health=None, warnings=())

    svc = CollectionService(
        selection=Selection(
            collector=NoCollector(clock=clock, warnings=("nothing",)), first_health=None, warnings=("nothing",)
        ),
        clock=clock,
        heartbeat_interval_sec=5.0,
        health_interval_sec=60.0,
        tick_timeout_sec=5.0,
        reselect=reselect,
    )
    assert svc.status().collector == "none"
    svc.tick_health()
    assert calls == [1]
    assert svc.status().collector == "nvidia-smi"
    svc.tick_health()
    assert calls == [1]
