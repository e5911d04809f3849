"""The FaultManager decision: what to start for one instance, given its snapshot and ``now``.

Purely computational, no side effects (``serving-ft.md`` F-10, F-12, F-13, F-59; RFC §4.3, §4.4). The shell
calls :func:`decide` whenever a report arrives (notify) and on its fallback scan, and applies the result:
start a strategy, move the runtime (:mod:`.runtime`), or wake again at ``Wait.until``. The order is finite
and acyclic: higher-priority special strategies → hardware correlation → the software snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from .normalizer import Classified, FtSnapshot, HardwareEvent, MappingKind, SnapshotKind, classify
from .phase import STEADY_PHASES, FtPhase
from .ranks import DpRank
from .runtime import FallbackStrategy, FtRuntime


class DecisionReason(StrEnum):
    FEATURE_DISABLED = "FEATURE_DISABLED"
    HIGHER_PRIORITY = "HIGHER_PRIORITY"
    STRATEGY_RUNNING = "STRATEGY_RUNNING"
    NO_FAULT = "NO_FAULT"
    COLLECTING = "COLLECTING"
    WAITING_FOR_DEAD = "WAITING_FOR_DEAD"
    STABILITY_WINDOW = "STABILITY_WINDOW"
    CORRELATION_WINDOW = "CORRELATION_WINDOW"
    COLLECTION_TIMEOUT = "COLLECTION_TIMEOUT"
    ALL_DEAD = "ALL_DEAD"
    CORRELATION_EXPIRED = "CORRELATION_EXPIRED"
    HARDWARE_UNMAPPABLE = "HARDWARE_UNMAPPABLE"
    INSTANCE_NOT_ACTIVE = "INSTANCE_NOT_ACTIVE"
    HARDWARE_ALREADY_COMMITTED = "HARDWARE_ALREADY_COMMITTED"
    COMPLETE_SNAPSHOT = "COMPLETE_SNAPSHOT"
    FAST_RECOVERY_APPLICABLE = "FAST_RECOVERY_APPLICABLE"
    FAST_RECOVERY_FAILED = "FAST_RECOVERY_FAILED"


RunningStrategy = Literal["scale_down", "fast_recovery", "fallback", "higher_priority", "restore"]


@dataclass(frozen=True, slots=True)
class DecisionTimings:
    """Seconds; defaults as in ``serving-ft.md``'s configuration table."""

    software_fault_collection_timeout_sec: float = 60.0
    """Below the engine's recovery timeout (120 s), so a round can still reach living engines."""
    hardware_ft_correlation_window_sec: float = 5.0
    fast_recovery_stability_sec: float = 2.0


@dataclass(frozen=True, slots=True)
class DecisionInput:
    """Everything :func:`decide` reads; the shell assembles it from memory (never from the store)."""

    runtime: FtRuntime
    snapshot: FtSnapshot
    hardware: tuple[HardwareEvent, ...] = ()
    """This round's hardware events, handled ones already removed by the shell."""
    running: RunningStrategy | None = None
    higher_priority_pending: bool = False
    """An existing special strategy (a token re-inference slot) wants the instance (F-10's first step)."""
    fast_recovery_applicable: bool = False
    """``enable_fast_recovery`` and the fast-recovery strategy's ``is_applicable()`` (F-11; default false)."""
    instance_active: bool = True
    original_fallback: FallbackStrategy = FallbackStrategy.INSTANCE_RECONFIGURATION
    """The deployment's original fallback (ScaleP2D for a P/D decode instance, else reconfiguration)."""
    timings: DecisionTimings = DecisionTimings()


@dataclass(frozen=True, slots=True)
class NoAction:
    reason: DecisionReason
    kind: Literal["no_action"] = "no_action"


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to start yet; decide again at ``until`` at the latest (``None``: only on the next report)."""

    reason: DecisionReason
    until: float | None
    kind: Literal["wait"] = "wait"


@dataclass(frozen=True, slots=True)
class RunHigherPriority:
    reason: DecisionReason = DecisionReason.HIGHER_PRIORITY
    kind: Literal["higher_priority"] = "higher_priority"


@dataclass(frozen=True, slots=True)
class StartFastRecovery:
    reason: DecisionReason = DecisionReason.FAST_RECOVERY_APPLICABLE
    kind: Literal["fast_recovery"] = "fast_recovery"


@dataclass(frozen=True, slots=True)
class StartScaleDown:
    """A complete U+D snapshot: the shell builds the :class:`~.runtime.ScaleDownContext` from this."""

    candidates: frozenset[DpRank]
    survivors: frozenset[DpRank]
    fallback: FallbackStrategy
    hardware_matched: bool
    hardware_keys: tuple[str, ...]
    reason: DecisionReason = DecisionReason.COMPLETE_SNAPSHOT
    kind: Literal["scale_down"] = "scale_down"


@dataclass(frozen=True, slots=True)
class Reconfigure:
    fallback: FallbackStrategy
    reason: DecisionReason
    kind: Literal["reconfigure"] = "reconfigure"


@dataclass(frozen=True, slots=True)
class MarkHardwareHandled:
    """The mapped ranks are all committed already (A13): mark the events handled, start nothing."""

    keys: tuple[str, ...]
    reason: DecisionReason = DecisionReason.HARDWARE_ALREADY_COMMITTED
    kind: Literal["hardware_handled"] = "hardware_handled"


Decision = NoAction | Wait | RunHigherPriority | StartFastRecovery | StartScaleDown | Reconfigure | MarkHardwareHandled


def decide(data: DecisionInput, *, now: float) -> Decision:
    """F-10 / F-12 / F-13: the one thing to do for this instance now."""
    runtime = data.runtime
    if runtime.phase == FtPhase.DISABLED:
        return NoAction(DecisionReason.FEATURE_DISABLED)
    if data.higher_priority_pending and data.running != "higher_priority":
        return RunHigherPriority()
    if data.running is not None or runtime.phase not in STEADY_PHASES:
        # reports update the snapshot, but never start or preempt a round of equal or lower priority;
        # fast recovery cannot be preempted by scale-down (F-13)
        return NoAction(DecisionReason.STRATEGY_RUNNING)
    hardware = tuple(e for e in data.hardware if e.fault.correlatable and e.mapping.kind != MappingKind.NOT_AFFECTED)
    if any(e.mapping.kind == MappingKind.UNMAPPABLE for e in hardware):
        return Reconfigure(data.original_fallback, DecisionReason.HARDWARE_UNMAPPABLE)
    if hardware and not data.instance_active:
        return Reconfigure(data.original_fallback, DecisionReason.INSTANCE_NOT_ACTIVE)
    handled = tuple(e.fault.key for e in hardware if e.mapping.ranks <= runtime.dead_committed)
    if handled:
        return MarkHardwareHandled(keys=handled)
    snapshot = classify(data.snapshot, runtime.active_dp_ranks)
    windows = _hardware_first(hardware, snapshot)
    if windows:
        return _correlate(data, snapshot, windows, now=now)
    return _software(data, snapshot, now=now, hardware_matched=False, keys=())


def _hardware_first(hardware: Iterable[HardwareEvent], snapshot: Classified) -> tuple[HardwareEvent, ...]:
    """Events that came before any software evidence: they open a correlation window. Software first →
    decide on the snapshot without waiting for hardware (F-12)."""
    started = snapshot.collection_started_at
    return tuple(e for e in hardware if started is None or e.received_at <= started)


def _correlate(data: DecisionInput, snapshot: Classified, events: tuple[HardwareEvent, ...], *, now: float) -> Decision:
    runtime = data.runtime
    keys = tuple(e.fault.key for e in events)
    mapped = frozenset().union(*(e.mapping.ranks for e in events)) - runtime.dead_committed
    matched = snapshot.kind == SnapshotKind.ALL_UNHEALTHY or (
        snapshot.kind == SnapshotKind.COMPLETE and mapped <= snapshot.dead
    )
    if matched:
        return _software(data, snapshot, now=now, hardware_matched=True, keys=keys)
    window_end = min(e.received_at for e in events) + data.timings.hardware_ft_correlation_window_sec
    if now >= window_end:
        return Reconfigure(FallbackStrategy.INSTANCE_RECONFIGURATION, DecisionReason.CORRELATION_EXPIRED)
    return Wait(DecisionReason.CORRELATION_WINDOW, until=window_end)


def _software(
    data: DecisionInput, snapshot: Classified, *, now: float, hardware_matched: bool, keys: tuple[str, ...]
) -> Decision:
    timings = data.timings
    reconfiguration = FallbackStrategy.INSTANCE_RECONFIGURATION
    if snapshot.kind == SnapshotKind.NONE:
        return NoAction(DecisionReason.NO_FAULT)
    started = snapshot.collection_started_at if snapshot.collection_started_at is not None else now
    timeout_at = started + timings.software_fault_collection_timeout_sec
    if snapshot.kind == SnapshotKind.COMPLETE:
        # a matched hardware U+D that fails always goes to InstanceReconfiguration (F-14)
        return StartScaleDown(
            candidates=snapshot.dead,
            survivors=snapshot.unhealthy,
            fallback=reconfiguration if hardware_matched else data.original_fallback,
            hardware_matched=hardware_matched,
            hardware_keys=keys,
        )
    if snapshot.kind == SnapshotKind.ALL_DEAD:
        return Reconfigure(reconfiguration, DecisionReason.ALL_DEAD)
    if snapshot.kind == SnapshotKind.ALL_UNHEALTHY and data.fast_recovery_applicable:
        stable_at = (snapshot.settled_since or now) + timings.fast_recovery_stability_sec
        if now >= stable_at:
            return StartFastRecovery()
        return Wait(DecisionReason.STABILITY_WINDOW, until=stable_at)
    if now >= timeout_at:
        return Reconfigure(reconfiguration, DecisionReason.COLLECTION_TIMEOUT)
    reason = (
        DecisionReason.WAITING_FOR_DEAD if snapshot.kind == SnapshotKind.ALL_UNHEALTHY else DecisionReason.COLLECTING
    )
    return Wait(reason, until=timeout_at)


def after_fast_recovery(*, succeeded: bool) -> Decision:
    """F-10 / A8: fast recovery's failure → whole-instance reconfiguration, never scale-down."""
    if succeeded:
        return NoAction(DecisionReason.NO_FAULT)
    return Reconfigure(FallbackStrategy.INSTANCE_RECONFIGURATION, DecisionReason.FAST_RECOVERY_FAILED)
