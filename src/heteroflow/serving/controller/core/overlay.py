"""ServingOverlay: what the Coordinator may route to (``serving-ft.md`` F-31, F-40; RFC §3.2). Purely computational.

Every publication — the round's DEL and ADD, and the READY / RESUME / periodic SET — goes through
:func:`projection`, so a committed dead rank can never come back by a full refresh. During SCALING_DOWN and
POST_SCALE_CLEANUP the instance is withdrawn, and while RECONFIGURING its engines are being restarted: the
projection is then empty, so a periodic SET cannot re-publish what the round withdrew.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .phase import FtPhase
from .ranks import DpRank
from .runtime import FtRuntime

WITHDRAWN_PHASES = frozenset({FtPhase.SCALING_DOWN, FtPhase.POST_SCALE_CLEANUP, FtPhase.RECONFIGURING})


@dataclass(frozen=True, slots=True)
class CoordinatorOp:
    """One management operation for the Coordinator; ``endpoint_ids`` are original ranks (the shell maps them
    to the endpoints' addresses through the topology)."""

    op: Literal["DEL", "ADD", "SET"]
    endpoint_ids: frozenset[DpRank]


def projection(runtime: FtRuntime) -> frozenset[DpRank]:
    """original - dead_committed - pending, or nothing while the instance is withdrawn or rebuilt."""
    if runtime.phase in WITHDRAWN_PHASES:
        return frozenset()
    return runtime.alive_dp_ranks


def withdraw(published: frozenset[DpRank]) -> CoordinatorOp:
    """DEL of the view that is published now (in later rounds it already lacks earlier dead_committed, so the
    Coordinator's identity check passes)."""
    return CoordinatorOp("DEL", published)


def publish(runtime: FtRuntime) -> CoordinatorOp:
    """ADD of the survivors after a committed round (F-26), through the projection."""
    return CoordinatorOp("ADD", projection(runtime))


def refresh(runtime: FtRuntime) -> CoordinatorOp:
    """The READY / RESUME / periodic SET: a full refresh, through the same projection."""
    return CoordinatorOp("SET", projection(runtime))
