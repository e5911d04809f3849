"""Collection off the heartbeat path (H-10, H-13).

Two loops run in their own threads: telemetry at the heartbeat interval (5 s) and health counters at the
health interval (60 s). Each tick runs the collector in a :class:`TickWorker` with a time limit; the
heartbeat only ever reads the caches, so a hung tool or a stuck NVML call never delays a beat — its cache
simply ages past the freshness limit and the beat reports unknown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from heteroflow.agent.collectors import Collector, Selection
from heteroflow.agent.freshness import Cached, fresh
from heteroflow.agent.readings import CollectorName, HealthCollection, TelemetryCollection
from heteroflow.agent.tool_stalls import ToolStall, ToolStallTracker
from heteroflow.core.clock import Clock

_log = structlog.get_logger(__name__)

R = TypeVar("R")


class TickWorker(Generic[R]):
    """Runs one call at a time in a daemon thread and waits for it at most ``timeout_sec``.

    A call that overruns keeps its thread (Python cannot kill it) but no second call is started while it
    is stuck: :meth:`run` answers ``None`` at once, so a hung collector costs one thread, not one per tick.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._busy: threading.Event | None = None

    @property
    def stuck(self) -> bool:
        with self._lock:
            return self._busy is not None and not self._busy.is_set()

    def run(self, fn: Callable[[], R], *, timeout_sec: float) -> R | None:
        with self._lock:
            if self._busy is not None and not self._busy.is_set():
                return None
            done = threading.Event()
            self._busy = done
        box: list[R] = []

        def call() -> None:
            try:
                box.append(fn())
            except Exception as exc:  # a collector must never raise; if one does, the tick is lost
                _log.warning("agent.collector_failed", worker=self._name, error=f"{type(exc).__name__}: {exc}")
            finally:
                done.set()

        threading.Thread(target=call, name=f"heteroflow-{self._name}", daemon=True).start()
        if not done.wait(timeout_sec):
            return None
        return box[0] if box else None


@dataclass(frozen=True, slots=True)
class CollectionStatus:
    collector: CollectorName
    health_ticks: int
    health_timeouts: int
    telemetry_ticks: int
    telemetry_timeouts: int
    last_health_at: str | None
    warnings: tuple[str, ...]
    tool_stalls: tuple[ToolStall, ...] = ()
    """Tools whose last call timed out, and since when (:mod:`heteroflow.agent.tool_stalls`)."""


class CollectionService:
    """Owns the collector, the two caches and the two loops.

    ``reselect`` is called on a health tick while no collector is in use (``auto`` found nothing yet), so
    an agent started before the driver is installed picks the vendor tool up later.
    """

    def __init__(
        self,
        *,
        selection: Selection,
        clock: Clock,
        heartbeat_interval_sec: float,
        health_interval_sec: float,
        tick_timeout_sec: float,
        reselect: Callable[[], Selection] | None = None,
        stalls: ToolStallTracker | None = None,
    ) -> None:
        self._clock = clock
        self.stalls = stalls or ToolStallTracker(now=clock.now)
        """Fed by the vendor-tool runner (:class:`~heteroflow.agent.tool_stalls.WatchedRunner`) and by overrun ticks."""
        self._collector: Collector = selection.collector
        self._selection_warnings = selection.warnings
        self.heartbeat_interval_sec = heartbeat_interval_sec
        self.health_interval_sec = health_interval_sec
        self._tick_timeout_s = tick_timeout_sec
        self._reselect = reselect
        self._lock = threading.Lock()
        self._health: Cached[HealthCollection] | None = None
        self._telemetry: Cached[TelemetryCollection] | None = None
        self._health_worker: TickWorker[HealthCollection] = TickWorker("health")
        self._telemetry_worker: TickWorker[TelemetryCollection] = TickWorker("telemetry")
        self._counts = {"health": 0, "health_timeouts": 0, "telemetry": 0, "telemetry_timeouts": 0}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        if selection.first_health is not None:
            self._store_health(selection.first_health)

    @property
    def collector(self) -> Collector:
        return self._collector

    def _store_health(self, value: HealthCollection) -> None:
        with self._lock:
            self._health = Cached(value=value, at_monotonic=self._clock.monotonic())

    def tick_health(self) -> HealthCollection | None:
        """One health collection within the tick's time limit; ``None`` when it timed out."""
        if self._collector.name == "none" and self._reselect is not None:
            selection = self._reselect()
            if selection.collector.name != "none":
                self._collector = selection.collector
                self._selection_warnings = selection.warnings
                _log.info("agent.collector_selected", collector=selection.collector.name)
        result = self._health_worker.run(self._collector.read_health, timeout_sec=self._tick_timeout_s)
        self._tick_outcome(result)
        with self._lock:
            self._counts["health"] += 1
            if result is None:
                self._counts["health_timeouts"] += 1
        if result is None:
            _log.warning("agent.health_tick_timeout", collector=self._collector.name)
            return None
        self._store_health(result)
        return result

    def tick_telemetry(self) -> TelemetryCollection | None:
        result = self._telemetry_worker.run(self._collector.read_telemetry, timeout_sec=self._tick_timeout_s)
        self._tick_outcome(result)
        with self._lock:
            self._counts["telemetry"] += 1
            if result is None:
                self._counts["telemetry_timeouts"] += 1
                return None
            self._telemetry = Cached(value=result, at_monotonic=self._clock.monotonic())
        return result

    def _tick_outcome(self, result: HealthCollection | TelemetryCollection | None) -> None:
        """An overrun tick (a call still stuck, e.g. NVML inside the driver) is a stall of the collector; a tick
        that returned says nothing here — the runner reports each tool call's answer or timeout itself."""
        if self._collector.name == "none":
            return
        if result is None:
            self.stalls.timed_out(self._collector.name)
        elif self._collector.name in ("nvml", "simulated"):  # in-process: the tick's return is the answer
            self.stalls.answered(self._collector.name)

    def snapshot(self) -> tuple[HealthCollection | None, TelemetryCollection | None]:
        """What a beat may report now: each collection only while fresh (3 of its periods)."""
        now = self._clock.monotonic()
        with self._lock:
            health, telemetry = self._health, self._telemetry
        return (
            fresh(health, now_monotonic=now, interval_sec=self.health_interval_sec),
            fresh(telemetry, now_monotonic=now, interval_sec=self.heartbeat_interval_sec),
        )

    def status(self) -> CollectionStatus:
        with self._lock:
            counts = dict(self._counts)
            health = self._health
        warnings = list(self._selection_warnings)
        if health is not None:
            warnings.extend(w for w in health.value.warnings if w not in warnings)
        return CollectionStatus(
            collector=self._collector.name,
            health_ticks=counts["health"],
            health_timeouts=counts["health_timeouts"],
            telemetry_ticks=counts["telemetry"],
            telemetry_timeouts=counts["telemetry_timeouts"],
            last_health_at=health.value.collected_at.isoformat() if health is not None else None,
            warnings=tuple(warnings),
            tool_stalls=self.stalls.stalls(),
        )

    def _loop(self, tick: Callable[[], object], interval_sec: float, *, first_delay_sec: float) -> None:
        if self._stop.wait(first_delay_sec):
            return
        while not self._stop.is_set():
            tick()
            if self._stop.wait(interval_sec):
                return

    def start(self) -> None:
        """Start both loops. The first telemetry tick runs at once; the first health tick too, unless the
        selection already provided a fresh one."""
        health_delay = self.health_interval_sec if self._health is not None else 0.0
        for name, tick, interval, delay in (
            ("telemetry", self.tick_telemetry, self.heartbeat_interval_sec, 0.0),
            ("health", self.tick_health, self.health_interval_sec, health_delay),
        ):
            thread = threading.Thread(
                target=self._loop,
                args=(tick, interval),
                kwargs={"first_delay_sec": delay},
                name=f"heteroflow-{name}-loop",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_sec: float = 5.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_sec)
        self._threads.clear()
        self._collector.close()
