"""Whether XID events are being collected on this node, and why not. Purely computational, no side effects.

XIDs are the one hardware signal that arrives as an event rather than as a counter: when collecting them fails
(no permission on every card, a collector without an event source, a card fallen off the bus), nothing else
shows it — a node with no XIDs looks the same as a node whose XIDs are not read. So the state is reported
wherever an operator looks: ``agent probe``, the agent's status and log, and every heartbeat (the server shows
it on the node page and in the capability matrix).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final, Literal

from heteroflow.contracts.heartbeat import XidCollection, XidUnwatched

XidState = Literal["collected", "partial", "not_collected"]

XID_NEEDS_NVML: Final = "XID events are collected through NVML only; not collected with this collector"
XID_NO_NVML_EVENTS: Final = "no NVML events with this collector"
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
    sources: tuple[str, ...] = ()
    """Where XIDs are read from: ``nvml`` (events), ``kernel_log`` (``NVRM: Xid`` lines of ``/dev/kmsg``)."""
    kernel_log: str | None = None
    """Why the kernel log is not read (e.g. no permission), or ``None`` when it is read or not tried."""

    def to_wire(self) -> dict[str, Any]:
        """The heartbeat's ``xid_collection`` object, built as the contract's :class:`XidCollection` (bounded: at
        most 64 cards per list)."""
        return XidCollection(
            state=self.state,
            reason=self.reason[:MAX_REASON_LENGTH] if self.reason else None,
            watched=list(self.watched[:MAX_CARDS_REPORTED]),
            unwatched=[XidUnwatched(index=i, error=e[:100]) for i, e in self.unwatched[:MAX_CARDS_REPORTED]],
            lost=list(self.lost[:MAX_CARDS_REPORTED]),
            wait_failures_total=self.wait_failures_total,
            sources=list(self.sources),
            kernel_log=self.kernel_log[:MAX_REASON_LENGTH] if self.kernel_log else None,
        ).model_dump(mode="json")


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
        sources=("nvml",) if live else (),
    )


def with_kernel_log(
    base: XidCollectionStatus,
    *,
    readable: bool,
    reason: str | None,
    cards: tuple[int, ...],
    nvml: bool,
    lost: tuple[int, ...] = (),
) -> XidCollectionStatus:
    """The XID state once the kernel log is added to ``base`` (the NVML watcher's state, or a collector's
    without events): the kernel log covers every card whose PCI address is known, lost cards included (XID 79
    is logged when a card falls off the bus). ``lost``: the cards the kernel log reported lost from the bus —
    under the nvidia-smi collector the only word there is of a lost card."""
    if not readable:
        why = reason or "not read"
        if base.state == "collected" or (nvml and base.sources):
            return _replace(base, reason=_join(base.reason, f"kernel log not read: {why}"), kernel_log=why)
        base_why = base.reason if nvml else XID_NO_NVML_EVENTS
        return _replace(
            base, state="not_collected", reason=_join(base_why, f"kernel log not read: {why}"), kernel_log=why
        )
    covered = set(cards)
    watched = tuple(sorted(set(base.watched) | covered))
    unwatched = tuple((index, error) for index, error in base.unwatched if index not in covered)
    problems: list[str] = []
    if nvml and base.state != "collected" and base.reason:
        problems.append(f"NVML events: {base.reason}")
    if unwatched:
        problems.append(f"{len(unwatched)} card(s) read by neither source")
    if reason:
        problems.append(f"kernel log: {reason}")
    all_lost = tuple(sorted(set(base.lost) | set(lost)))
    kernel_only = [index for index in all_lost if index not in base.lost]
    if kernel_only:
        problems.append(f"GPU {', '.join(str(i) for i in kernel_only)} lost (fallen off the bus, kernel log)")
    if not covered and not base.sources:
        state: XidState = "not_collected"
        problems.append("the kernel log is read but no card's PCI address is known")
    elif unwatched or all_lost:
        state = "partial"
    else:
        state = "collected"
    return XidCollectionStatus(
        state=state,
        reason="; ".join(problems) or None,
        watched=watched,
        unwatched=unwatched,
        lost=all_lost,
        wait_failures_total=base.wait_failures_total,
        sources=(*base.sources, "kernel_log"),
        kernel_log=None,
    )


def _join(first: str | None, second: str) -> str:
    return f"{first}; {second}" if first else second


def _replace(
    base: XidCollectionStatus, *, reason: str, kernel_log: str, state: XidState | None = None
) -> XidCollectionStatus:
    return dataclasses.replace(base, state=state or base.state, reason=reason, kernel_log=kernel_log)
