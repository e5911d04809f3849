"""Which vendor tool stalls on each node, as the heartbeat reports it. Pure; never raises on odd input.

The agent bounds every vendor-tool call, so a wedged tool never stops its heartbeats — which is also why nobody
would see it: the node stays online while its cards' values go stale. Each beat carries the tools whose last
call timed out (``tool_stalls``: tool, since, timeouts); the server keeps the newest per node in memory, like
the XID source's state, and shows it in the node's status, the ``heteroflow_node_tool_stalled_since_seconds``
series and the ``HeteroflowNodeToolStalled`` alert.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from heteroflow.core.ids import NodeId

MAX_STALLS: Final = 8
MAX_TOOL_NAME: Final = 40


@dataclass(frozen=True, slots=True)
class ToolStallReport:
    tool: str
    since: datetime
    """When the tool's first timed-out call without an answer since was made (the agent's clock)."""
    timeouts: int | None


def _tool(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    cleaned = "".join(ch for ch in value if ch.isprintable() and ch not in '"\\')[:MAX_TOOL_NAME].strip()
    return cleaned or None


def _since(value: object) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def parse_tool_stalls(value: object) -> tuple[ToolStallReport, ...] | None:
    """The beat's ``tool_stalls`` list, or ``None`` when absent, empty or not a list (the agent sends it only while
    a tool stalls). Unusable entries are left out."""
    if not isinstance(value, list) or not value:
        return None
    stalls: dict[str, ToolStallReport] = {}
    for entry in value[:MAX_STALLS]:
        if not isinstance(entry, Mapping):
            continue
        tool, since = _tool(entry.get("tool")), _since(entry.get("since"))
        if tool is None or since is None:
            continue
        timeouts = entry.get("timeouts")
        count = timeouts if isinstance(timeouts, int) and not isinstance(timeouts, bool) and timeouts >= 0 else None
        stalls[tool] = ToolStallReport(tool=tool, since=since, timeouts=count)
    return tuple(sorted(stalls.values(), key=lambda stall: stall.tool))


@dataclass(frozen=True, slots=True)
class NodeToolStalls:
    node_name: str
    stalls: tuple[ToolStallReport, ...]


class ToolStallBook:
    """The newest report of every node, with the monotonic time it arrived; a stale report reads as unknown."""

    def __init__(self, *, stale_sec: float) -> None:
        self._stale = stale_sec
        self._reports: dict[NodeId, tuple[NodeToolStalls, float]] = {}

    def record(
        self, node_id: NodeId, node_name: str, stalls: tuple[ToolStallReport, ...] | None, *, now: float
    ) -> None:
        if not stalls:
            self._reports.pop(node_id, None)  # no stall named in the newest beat: the old one is over
        else:
            self._reports[node_id] = (NodeToolStalls(node_name=node_name, stalls=stalls), now)

    def get(self, node_id: NodeId, *, now: float) -> tuple[ToolStallReport, ...] | None:
        entry = self._reports.get(node_id)
        if entry is None or now - entry[1] > self._stale:
            return None
        return entry[0].stalls

    def stalled(self, *, now: float) -> list[NodeToolStalls]:
        """Every node with a fresh report naming at least one stalled tool (the metric's series)."""
        return [entry for entry, at in list(self._reports.values()) if entry.stalls and now - at <= self._stale]

    def forget_node(self, node_id: NodeId) -> None:
        self._reports.pop(node_id, None)
