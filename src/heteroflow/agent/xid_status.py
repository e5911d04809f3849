"""Whether XID events are being collected on this node, and why not. Purely computational, no side effects.

XIDs are the one hardware signal that arrives as an event rather than as a counter: when collecting them fails
(no permission on every card, a collector without an event source, a card fallen off the bus), nothing else
shows it — a node with no XIDs looks the same as a node whose XIDs are not read. So the state is reported
wherever an operator looks: ``agent probe``, the agent's status and log, and every heartbeat (the server shows
it on the node page and in the capability matrix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

XidState = Literal["collected", "partial", "not_collected"]

XID_NEEDS_NVML: Final = "XID events are collected through NVML only; not collected with this collector"
MAX_REASON_LENGTH: Final = 300
MAX_CARDS_REPORTED: Final = 64


@dataclass(frozen=True, slots=True)
class XidCollectionStatus:
    """The XID source's state. ``partial``: some cards are watched, others are not (``unwatched``) or are lost."""

    state: XidState
    reason: str | None = None
    """Why not (every card) or why partly; ``None`` when every card is watched."""
    watched: tuple[int, ...] = ()
    """Card indexes registered for XID events."""
    unwatched: tuple[tuple[int, str], ...] = ()
    """Cards that could not be registered, with the error (e.g. ``no permission``)."""
    lost: tuple[int, ...] = ()
    """Cards NVML reports as lost (fallen off the bus): their values are unknown, their XIDs unread."""
    wait_failures_total: int = 0
    """Failed waits for events (other than the timeout that means "nothing happened")."""

    def to_wire(self) -> dict[str, Any]:
        """The heartbeat's ``xid_collection`` object (bounded: at most 64 cards per list)."""
        return {
            "state": self.state,
            "reason": self.reason[:MAX_REASON_LENGTH] if self.reason else None,
            "watched": list(self.watched[:MAX_CARDS_REPORTED]),
            "unwatched": [{"index": i, "error": e[:100]} for i, e in self.unwatched[:MAX_CARDS_REPORTED]],
            "lost": list(self.lost[:MAX_CARDS_REPORTED]),
            "wait_failures_total": self.wait_failures_total,
        }


def not_collected(reason: str) -> XidCollectionStatus:
    return XidCollectionStatus(state="not_collected", reason=reason)


def watcher_status(
    *,
    watched: tuple[int, ...],
    unwatched: tuple[tuple[int, str], ...],
    lost: tuple[int, ...],
    wait_error: str | None,
    wait_failures_total: int,
) -> XidCollectionStatus:
    """The state of an NVML watcher from what it registered and how its last wait went."""
    live = tuple(index for index in watched if index not in lost)
    problems: list[str] = []
    if unwatched:
        errors = sorted({error for _, error in unwatched})
        problems.append(f"{len(unwatched)} card(s) not registered ({', '.join(errors)})")
    if lost:
        problems.append(f"GPU {', '.join(str(i) for i in lost)} lost (fallen off the bus?)")
    if wait_error is not None:
        problems.append(f"waiting for events fails: {wait_error}")
    if not live or (wait_error is not None and not lost):
        state: XidState = "not_collected"
    elif problems:
        state = "partial"
    else:
        state = "collected"
    if not watched and not unwatched and wait_error is None:
        problems.append("no card to watch")
    return XidCollectionStatus(
        state=state,
        reason="; ".join(problems) or None,
        watched=watched,
        unwatched=unwatched,
        lost=lost,
        wait_failures_total=wait_failures_total,
    )
