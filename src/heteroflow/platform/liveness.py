"""Node liveness without a statement per heartbeat.

Each heartbeat only records the time in memory. A flusher writes every node's newest heartbeat in one
statement per interval, never moving a stored time backwards, so several servers behind a load balancer
agree on liveness within one interval. A failed flush keeps the times and retries on the next interval.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import structlog

from heteroflow.core.ids import NodeId
from heteroflow.platform.nodes import newest

_log = structlog.get_logger(__name__)


class LivenessStore(Protocol):
    def record_heartbeats(self, beats: dict[NodeId, datetime]) -> set[NodeId]:
        """Raise each node's stored last heartbeat to the given time, in one statement for all nodes.

        Returns the ids that exist: a node missing from the answer was deleted (perhaps through another
        server), and the caller stops trusting its cached registration.
        """
        ...


@dataclass(frozen=True, slots=True)
class LivenessStatus:
    unflushed_nodes: int
    flushes_total: int
    flush_failures_total: int
    last_flush_error: str | None


class LivenessTracker:
    def __init__(self) -> None:
        self._seen: dict[NodeId, datetime] = {}
        self._unflushed: dict[NodeId, datetime] = {}
        self.flushes_total = 0
        self.flush_failures_total = 0
        self.last_flush_error: str | None = None

    def beat(self, node_id: NodeId, at: datetime) -> None:
        self._seen[node_id] = newest(self._seen.get(node_id), at) or at
        self._unflushed[node_id] = newest(self._unflushed.get(node_id), at) or at

    def last_seen(self, node_id: NodeId) -> datetime | None:
        """The newest heartbeat this process received from the node (``None`` if none)."""
        return self._seen.get(node_id)

    def forget(self, node_id: NodeId) -> None:
        self._seen.pop(node_id, None)
        self._unflushed.pop(node_id, None)

    def take_unflushed(self) -> dict[NodeId, datetime]:
        taken, self._unflushed = self._unflushed, {}
        return taken

    def restore(self, beats: dict[NodeId, datetime]) -> None:
        """Put back times whose flush failed (newer beats received meanwhile win)."""
        for node_id, at in beats.items():
            self._unflushed[node_id] = newest(self._unflushed.get(node_id), at) or at

    def status(self) -> LivenessStatus:
        return LivenessStatus(
            unflushed_nodes=len(self._unflushed),
            flushes_total=self.flushes_total,
            flush_failures_total=self.flush_failures_total,
            last_flush_error=self.last_flush_error,
        )

    async def flush(self, store: LivenessStore) -> FlushResult:
        """Write the unflushed heartbeats; a failure keeps them for the next flush."""
        beats = self.take_unflushed()
        if not beats:
            return FlushResult(confirmed=set(), missing=set())
        try:
            existing = await asyncio.to_thread(store.record_heartbeats, beats)
        except Exception as exc:
            self.restore(beats)
            self.flush_failures_total += 1
            self.last_flush_error = f"{type(exc).__name__}: {exc}"[:500]
            _log.warning("liveness.flush_failed", error=self.last_flush_error, nodes=len(beats))
            return FlushResult(confirmed=set(), missing=set(), failed=True)
        self.flushes_total += 1
        self.last_flush_error = None
        missing = set(beats) - existing
        for node_id in missing:
            self.forget(node_id)
        return FlushResult(confirmed=existing, missing=missing)


@dataclass(frozen=True, slots=True)
class FlushResult:
    confirmed: set[NodeId]
    missing: set[NodeId]
    failed: bool = False
