"""Which vendor tool stalls on this node, and since when.

A degrading card can wedge the tools that watch it (a GB200 whose DCGM calls block for 45 s while its
correctable count runs at ~17,700 a second, a GPU monitor liveness-killed 49 times in three days): every call is
bounded, so the agent itself never blocks, but a bounded call that keeps timing out is a fact about the node that
nobody sees unless it is said. :class:`ToolStallTracker` records each tool's calls — a timed-out call starts (or
continues) a stall, a call that answers ends it — and :class:`WatchedRunner` feeds it from every vendor-tool
call; the collection loops feed it from ticks that overran (an in-process NVML call stuck in the driver). The
stalls travel with every heartbeat (``tool_stalls``), so the node's status, a metric and an alert say which tool
stalls and since when.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from heteroflow.agent.commands import CommandResult, CommandRunner, ToolTimeoutError

MAX_TOOL_NAME: Final = 40
MAX_STALLS: Final = 8


@dataclass(frozen=True, slots=True)
class ToolStall:
    """One tool whose last call timed out: since its first timed-out call without an answer in between."""

    tool: str
    since: datetime
    timeouts: int
    """Timed-out calls (and overrun ticks) since then."""

    def to_wire(self) -> dict[str, Any]:
        return {"tool": self.tool, "since": self.since.isoformat(), "timeouts": self.timeouts}


class ToolStallTracker:
    """Each tool's current stall, thread-safe (the collection loops and the runner call it from their threads)."""

    def __init__(self, *, now: Callable[[], datetime]) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._stalls: dict[str, ToolStall] = {}

    def timed_out(self, tool: str) -> None:
        tool = tool[:MAX_TOOL_NAME]
        with self._lock:
            stall = self._stalls.get(tool)
            if stall is None:
                if len(self._stalls) < MAX_STALLS:
                    self._stalls[tool] = ToolStall(tool=tool, since=self._now(), timeouts=1)
            else:
                self._stalls[tool] = ToolStall(tool=tool, since=stall.since, timeouts=stall.timeouts + 1)

    def answered(self, tool: str) -> None:
        with self._lock:
            self._stalls.pop(tool[:MAX_TOOL_NAME], None)

    def stalls(self) -> tuple[ToolStall, ...]:
        with self._lock:
            return tuple(sorted(self._stalls.values(), key=lambda stall: stall.tool))


class WatchedRunner:
    """A :class:`CommandRunner` that tells a :class:`ToolStallTracker` how each call went."""

    def __init__(self, runner: CommandRunner, tracker: ToolStallTracker) -> None:
        self._runner = runner
        self._tracker = tracker

    def which(self, tool: str) -> str | None:
        return self._runner.which(tool)

    def run(self, argv: Sequence[str], *, timeout_sec: float) -> CommandResult:
        try:
            result = self._runner.run(argv, timeout_sec=timeout_sec)
        except ToolTimeoutError:
            self._tracker.timed_out(argv[0])
            raise
        self._tracker.answered(argv[0])
        return result
