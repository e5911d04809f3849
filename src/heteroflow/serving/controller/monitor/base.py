"""The ResourceMonitor: pluggable hardware fault sources, level states turned into edge events (F-3, RFC §4.4).

A hardware source describes *state*: a MindCluster ConfigMap lists the faults a node has now, a Node object says
whether the node is Ready now, the GPU-health source knows which cards had a serious event recently. The
controller wants *edges*: one :class:`HardwareFaultReport` when a fault appears, one with ``cleared=True`` when
it is gone, and nothing while it stands (a standing fault repeated on every poll or watch event must never open
a second correlation window). :class:`EdgeDetector` makes one from the other and is purely computational.

The source interface. A source is one coroutine, :meth:`HardwareSource.run`, that publishes
:class:`Snapshot` s (the complete fault set of one *scope*: a node's ConfigMap, a Node, a file, the GPU-health
window) and :class:`Problem` s (input it could not read) through an ``emit`` callback, and runs until it is
cancelled. We chose this over ``start(emit)``/``stop()`` and over an async iterator because:

- cancellation *is* the stop: the monitor owns the task, so there is no second stop path to get wrong, and a
  source never needs its own crash handling (the monitor restarts it with back-off);
- a callback bridges threads simply: the Kubernetes watch blocks in a thread and hands raw events back to the
  loop with ``call_soon_threadsafe``, which an async iterator would need a queue for;
- snapshots, not edges, cross the interface: a source never has to remember what it said before, and a source
  that restarts simply says everything again (the detector drops the repeats).

Several scopes (or sources) may name the same fault key (fault_code, card, node): it stands while any of them
reports it, at the highest level any of them gives; a level change is sent as a clear followed by the new
report, because the controller keeps a standing key once and would otherwise never see the new level.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import structlog

from heteroflow.contracts.serving import HardwareFaultReport
from heteroflow.core.clock import Clock
from heteroflow.serving.controller.core.normalizer import HardwareFault

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every fault one scope of a source reports now; an empty tuple means the scope has no fault (any more)."""

    scope: str
    """What the faults belong to, unique within the source: ``configmap/<name>``, ``node/<name>``, ``file/<name>``."""
    faults: tuple[HardwareFaultReport, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    """Input a source could not use (malformed JSON, a wrong shape, an HTTP error). The scope's last snapshot
    stands: a half-written file or a failed poll is no evidence that a fault went away."""

    scope: str
    detail: str


SourceUpdate = Snapshot | Problem
Emit = Callable[[SourceUpdate], None]
ReportSink = Callable[[HardwareFaultReport], object]
"""Where edges go; in production :meth:`Controller.hardware_fault`."""


class HardwareSource(Protocol):
    name: str
    """Short and stable (``mindcluster-kube``, ``mindcluster-dir``, ``gpu-health``): status and logs use it."""

    async def run(self, emit: Emit) -> None:
        """Publish snapshots and problems until cancelled. Raising is allowed: the monitor logs it and runs the
        source again after a back-off. ``emit`` must be called on the event loop's thread."""
        ...


def fault_key(report: HardwareFaultReport) -> str:
    """The controller's key for a fault: (fault_code, card, node) (F-3)."""
    return HardwareFault(
        node_name=report.node_name, card=report.card, fault_code=report.fault_code, level=report.level
    ).key


def cleared(report: HardwareFaultReport) -> HardwareFaultReport:
    return report.model_copy(update={"cleared": True, "detail": "cleared"})


@dataclass
class EdgeDetector:
    """Level states in, edge events out. Purely computational; see the module docstring for the rules."""

    _scopes: dict[tuple[str, str], dict[str, HardwareFaultReport]] = field(default_factory=dict)
    _holders: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    """Fault key → the (source, scope) pairs that report it now."""

    def update(self, source: str, snapshot: Snapshot) -> list[HardwareFaultReport]:
        """The edges one snapshot causes, in a stable order (clears first, then appearances, by key)."""
        scope_id = (source, snapshot.scope)
        old = self._scopes.get(scope_id, {})
        new: dict[str, HardwareFaultReport] = {}
        for report in snapshot.faults:
            key = fault_key(report)
            kept = new.get(key)
            if kept is None or report.level > kept.level:  # one scope naming a key twice: the worse one counts
                new[key] = report.model_copy(update={"cleared": False})
        touched = sorted(set(old) | set(new))
        before = {key: self._effective(key) for key in touched}
        if new:
            self._scopes[scope_id] = new
        else:
            self._scopes.pop(scope_id, None)
        for key in set(old) - set(new):
            holders = self._holders.get(key, set())
            holders.discard(scope_id)
            if not holders:
                self._holders.pop(key, None)
        for key in new:
            self._holders.setdefault(key, set()).add(scope_id)
        clears: list[HardwareFaultReport] = []
        appears: list[HardwareFaultReport] = []
        for key in touched:
            was, now = before[key], self._effective(key)
            if was is not None and (now is None or now.level != was.level):
                clears.append(cleared(was))
            if now is not None and (was is None or now.level != was.level):
                appears.append(now)
        return clears + appears

    def _effective(self, key: str) -> HardwareFaultReport | None:
        best: HardwareFaultReport | None = None
        for scope_id in sorted(self._holders.get(key, ())):
            report = self._scopes[scope_id][key]
            if best is None or report.level > best.level:
                best = report
        return best

    def standing(self) -> tuple[str, ...]:
        return tuple(sorted(self._holders))


SourceState = Literal["starting", "running", "restarting", "stopped"]


@dataclass(frozen=True, slots=True)
class SourceStatus:
    name: str
    state: SourceState
    snapshots: int
    """Snapshots taken from this source (repeats included)."""
    problems: int
    """Inputs it could not use (logged and ignored)."""
    crashes: int
    """Times its coroutine raised and was run again."""
    last_problem: str | None
    last_snapshot_at: float | None
    """Monotonic seconds of the last snapshot."""


@dataclass(frozen=True, slots=True)
class MonitorStatus:
    sources: tuple[SourceStatus, ...]
    standing: tuple[str, ...]
    """Keys of the faults standing now, across every source."""
    reports: int
    """Edges handed to the sink."""
    sink_errors: int
    """Edges the sink raised on (logged; the monitor keeps going)."""

    def source(self, name: str) -> SourceStatus:
        for status in self.sources:
            if status.name == name:
                return status
        raise KeyError(name)


@dataclass
class _Counters:
    state: SourceState = "starting"
    snapshots: int = 0
    problems: int = 0
    crashes: int = 0
    last_problem: str | None = None
    last_snapshot_at: float | None = None


class ResourceMonitor:
    """Runs the configured sources, one task each, and hands the edges to ``sink``.

    Nothing a source does reaches the controller as an exception: a source that raises is logged and run again
    after ``restart_delay_sec`` (doubling up to ``max_restart_delay_sec``, back to the start once it delivers a
    snapshot); a sink that raises is logged and counted. Sources never wait on each other: each has its own task
    and ``emit`` is synchronous and cheap.
    """

    def __init__(
        self,
        *,
        sources: Sequence[HardwareSource],
        sink: ReportSink,
        clock: Clock,
        restart_delay_sec: float = 1.0,
        max_restart_delay_sec: float = 30.0,
    ) -> None:
        names = [source.name for source in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique: {names}")
        self._sources = tuple(sources)
        self._sink = sink
        self._clock = clock
        self._restart_delay = restart_delay_sec
        self._max_restart_delay = max_restart_delay_sec
        self._detector = EdgeDetector()
        self._counters = {name: _Counters() for name in names}
        self._tasks: list[asyncio.Task[None]] = []
        self._reports = 0
        self._sink_errors = 0

    @property
    def sources(self) -> tuple[HardwareSource, ...]:
        return self._sources

    async def start(self) -> None:
        if self._tasks:
            return
        for source in self._sources:
            self._tasks.append(asyncio.create_task(self._supervise(source), name=f"hardware-source-{source.name}"))
        _log.info("monitor.started", sources=[s.name for s in self._sources])

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for counters in self._counters.values():
            counters.state = "stopped"

    def status(self) -> MonitorStatus:
        return MonitorStatus(
            sources=tuple(
                SourceStatus(
                    name=name,
                    state=c.state,
                    snapshots=c.snapshots,
                    problems=c.problems,
                    crashes=c.crashes,
                    last_problem=c.last_problem,
                    last_snapshot_at=c.last_snapshot_at,
                )
                for name, c in self._counters.items()
            ),
            standing=self._detector.standing(),
            reports=self._reports,
            sink_errors=self._sink_errors,
        )

    def emitter(self, source_name: str) -> Emit:
        """The ``emit`` a source gets (public so that tests can drive the edge logic without a task)."""
        counters = self._counters[source_name]

        def emit(update: SourceUpdate) -> None:
            if isinstance(update, Problem):
                counters.problems += 1
                text = f"{update.scope}: {update.detail}"[:500]
                # a platform that stays down would say the same every poll: warn when the problem changes
                log = _log.debug if text == counters.last_problem else _log.warning
                counters.last_problem = text
                log("monitor.bad_input", source=source_name, scope=update.scope, detail=update.detail[:500])
                return
            counters.snapshots += 1
            counters.last_snapshot_at = self._clock.monotonic()
            counters.state = "running"
            self._deliver(source_name, self._detector.update(source_name, update))

        return emit

    def _deliver(self, source_name: str, edges: Iterable[HardwareFaultReport]) -> None:
        for report in edges:
            self._reports += 1
            _log.info(
                "monitor.edge",
                source=source_name,
                key=fault_key(report),
                level=report.level,
                cleared=report.cleared,
            )
            try:
                self._sink(report)
            except Exception as exc:  # the controller must never be taken down by one report
                self._sink_errors += 1
                _log.exception("monitor.sink_failed", key=fault_key(report), error=f"{type(exc).__name__}: {exc}")

    async def _supervise(self, source: HardwareSource) -> None:
        counters = self._counters[source.name]
        emit = self.emitter(source.name)
        delay = self._restart_delay
        while True:
            counters.state = "running"
            seen = counters.snapshots
            try:
                await source.run(emit)
                ended = "returned"
                _log.warning("monitor.source_returned", source=source.name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ended = f"crashed: {type(exc).__name__}: {exc}"
                _log.exception("monitor.source_crashed", source=source.name, error=f"{type(exc).__name__}: {exc}")
            counters.crashes += 1
            counters.last_problem = f"{ended} (run again in {delay:g} s)"[:500]
            counters.state = "restarting"
            if counters.snapshots > seen:
                delay = self._restart_delay
            await self._clock.sleep(delay)  # the back-off before running the source again
            delay = min(delay * 2, self._max_restart_delay)
