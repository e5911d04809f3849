"""FtPhase and its transition function (``serving-ft.md`` F-30, RFC §3.1). Purely computational.

Only the transitions listed in :data:`LEGAL_TRANSITIONS` exist; anything else — including a phase "moving"
to itself — raises :class:`IllegalTransitionError`. The shell never assigns a phase any other way.
"""

from __future__ import annotations

from enum import StrEnum

from .errors import IllegalTransitionError


class FtPhase(StrEnum):
    DISABLED = "DISABLED"
    """The feature is off (``enable_fault_tolerance`` and ``enable_dp_scale_down`` not both true): baseline."""
    NORMAL = "NORMAL"
    """Every original rank serves; no round runs."""
    DECIDING = "DECIDING"
    """A round started: gate, topology, guard, first apply-ready check."""
    WAITING_ENGINE_FAULT = "WAITING_ENGINE_FAULT"
    """Guarded; some survivor is not apply-ready yet (HEALTHY or recovering), polling."""
    SCALING_DOWN = "SCALING_DOWN"
    """Withdrawn (DEL) and applied once; polling until every survivor is healthy again."""
    POST_SCALE_CLEANUP = "POST_SCALE_CLEANUP"
    """Survivors healthy: finalize(commit), persist dead_committed, optional pod stops, then publish."""
    SCALED_DOWN_RUNNING = "SCALED_DOWN_RUNNING"
    """Serving with original - dead_committed; a new round may start from here."""
    RECONFIGURING = "RECONFIGURING"
    """The frozen fallback runs (reconfiguration, relaunch or ScaleP2D)."""


ROUND_PHASES: frozenset[FtPhase] = frozenset(
    {FtPhase.DECIDING, FtPhase.WAITING_ENGINE_FAULT, FtPhase.SCALING_DOWN, FtPhase.POST_SCALE_CLEANUP}
)
"""A round is in flight: these suppress the legacy partial-loss shutdown (F-33) and restart as RECONFIGURING (F-32)."""

STEADY_PHASES: frozenset[FtPhase] = frozenset({FtPhase.NORMAL, FtPhase.SCALED_DOWN_RUNNING})
"""The only phases in which a new fault decision may start something, and the only ones that can serve (F-40)."""

LEGAL_TRANSITIONS: frozenset[tuple[FtPhase, FtPhase]] = frozenset(
    {
        # feature switch
        (FtPhase.DISABLED, FtPhase.NORMAL),
        (FtPhase.NORMAL, FtPhase.DISABLED),
        # a complete U+D snapshot starts a round
        (FtPhase.NORMAL, FtPhase.DECIDING),
        (FtPhase.SCALED_DOWN_RUNNING, FtPhase.DECIDING),
        # the round
        (FtPhase.DECIDING, FtPhase.WAITING_ENGINE_FAULT),
        (FtPhase.DECIDING, FtPhase.SCALING_DOWN),  # the first check was already apply-ready
        (FtPhase.WAITING_ENGINE_FAULT, FtPhase.SCALING_DOWN),
        (FtPhase.SCALING_DOWN, FtPhase.POST_SCALE_CLEANUP),
        (FtPhase.POST_SCALE_CLEANUP, FtPhase.SCALED_DOWN_RUNNING),
        # failures go to the frozen fallback
        (FtPhase.DECIDING, FtPhase.RECONFIGURING),
        (FtPhase.WAITING_ENGINE_FAULT, FtPhase.RECONFIGURING),
        (FtPhase.SCALING_DOWN, FtPhase.RECONFIGURING),
        (FtPhase.POST_SCALE_CLEANUP, FtPhase.RECONFIGURING),  # only a NodeManager lost at commit (F-57)
        # collection timeout, all DEAD, correlation expiry, fast-recovery failure
        (FtPhase.NORMAL, FtPhase.RECONFIGURING),
        (FtPhase.SCALED_DOWN_RUNNING, FtPhase.RECONFIGURING),
        # the fallback succeeded: a rebuild, or a relaunch that kept a non-empty dead_committed
        (FtPhase.RECONFIGURING, FtPhase.NORMAL),
        (FtPhase.RECONFIGURING, FtPhase.SCALED_DOWN_RUNNING),
    }
)


def is_legal(current: FtPhase, target: FtPhase) -> bool:
    return (current, target) in LEGAL_TRANSITIONS


def transition(current: FtPhase, target: FtPhase) -> FtPhase:
    """``target`` when F-30 allows ``current → target``; otherwise :class:`IllegalTransitionError`."""
    if not is_legal(current, target):
        raise IllegalTransitionError(current.value, target.value)
    return target


def suppresses_partial_loss_shutdown(phase: FtPhase) -> bool:
    """Whether the legacy partial-loss whole-instance shutdown is suppressed (F-33): only inside a round."""
    return phase in ROUND_PHASES
