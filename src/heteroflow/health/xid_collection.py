"""What each node's agent says about its XID source, as the heartbeat reports it. Pure; never raises on odd input.

A node without XIDs must not look the same as a node whose XIDs are not read (no permission, a collector
without an event source, a lost card). The agent sends its XID source's state with every beat
(``xid_collection``); the server keeps the newest per node in memory (re-sent every beat, so every server
that hears a node's beats knows it) and shows it on the node page and per card in the capability matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from heteroflow.core.ids import NodeId

XidState = Literal["collected", "partial", "not_collected"]
CardXidState = Literal["collected", "not_collected", "lost", "unknown"]

_STATES: Final = ("collected", "partial", "not_collected")
_SOURCES: Final = ("nvml", "kernel_log")
MAX_REASON: Final = 300
MAX_CARDS: Final = 64


@dataclass(frozen=True, slots=True)
class XidCollectionReport:
    state: XidState
    reason: str | None
    watched: tuple[int, ...]
    unwatched: tuple[tuple[int, str], ...]
    lost: tuple[int, ...]
    wait_failures_total: int | None
    sources: tuple[str, ...] = ()
    """Where the agent reads XIDs from: ``nvml`` (events), ``kernel_log`` (the driver's ``NVRM: Xid`` lines)."""
    kernel_log: str | None = None
    """Why the agent does not read the kernel log (e.g. no permission to read /dev/kmsg); ``None`` otherwise."""

    def card(self, gpu_index: int) -> tuple[CardXidState, str | None]:
        """One card's XID state and why (for the capability matrix)."""
        if gpu_index in self.lost:
            return "lost", "NVML reports the card lost (fallen off the bus?): its XIDs are not read"
        for index, error in self.unwatched:
            if index == gpu_index:
                return "not_collected", f"not registered for XID events ({error})"
        if self.state == "not_collected":
            return "not_collected", self.reason
        if self.watched and gpu_index not in self.watched:
            return "unknown", "the agent did not list this card among the watched ones"
        return "collected", None


def _index(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 4095:
        return None
    return value


def _text(value: object, limit: int) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    cleaned = "".join(ch for ch in value if ch.isprintable())
    return cleaned[:limit] or None


def _indexes(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(sorted({i for v in value[:MAX_CARDS] if (i := _index(v)) is not None}))


def parse_xid_collection(value: object) -> XidCollectionReport | None:
    """The beat's ``xid_collection`` object, or ``None`` when absent or unusable (an agent that does not say)."""
    if not isinstance(value, Mapping):
        return None
    state = value.get("state")
    if state not in _STATES:
        return None
    unwatched: list[tuple[int, str]] = []
    raw_unwatched = value.get("unwatched")
    for entry in raw_unwatched[:MAX_CARDS] if isinstance(raw_unwatched, list) else ():
        if isinstance(entry, Mapping) and (index := _index(entry.get("index"))) is not None:
            unwatched.append((index, _text(entry.get("error"), 100) or "unknown error"))
    failures = value.get("wait_failures_total")
    return XidCollectionReport(
        state=state,
        reason=_text(value.get("reason"), MAX_REASON),
        watched=_indexes(value.get("watched")),
        unwatched=tuple(unwatched),
        lost=_indexes(value.get("lost")),
        wait_failures_total=failures if isinstance(failures, int) and not isinstance(failures, bool) else None,
        sources=_sources(value.get("sources")),
        kernel_log=_text(value.get("kernel_log"), MAX_REASON),
    )


def _sources(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    named = {item for item in value[:8] if isinstance(item, str)}
    return tuple(source for source in _SOURCES if source in named)


class XidCollectionBook:
    """The newest report of every node, with the monotonic time it arrived; stale reports read as unknown."""

    def __init__(self, *, stale_sec: float) -> None:
        self._stale = stale_sec
        self._reports: dict[NodeId, tuple[XidCollectionReport, float]] = {}

    def record(self, node_id: NodeId, report: XidCollectionReport | None, *, now: float) -> None:
        if report is None:
            self._reports.pop(node_id, None)  # an agent that no longer says: unknown, not the old state
        else:
            self._reports[node_id] = (report, now)

    def get(self, node_id: NodeId, *, now: float) -> XidCollectionReport | None:
        entry = self._reports.get(node_id)
        if entry is None or now - entry[1] > self._stale:
            return None
        return entry[0]

    def forget_node(self, node_id: NodeId) -> None:
        self._reports.pop(node_id, None)
