"""HeteroFlow GPU health (NVIDIA clusters): the platform server's hardware-event feed as a hardware source
(``engine-protocol.md``, "Hardware fault source 2").

The platform's agents report XID events and the five health counters per card; the server's
``GET /api/v1/hardware-events`` returns, from a cursor, every XID event and every increase of a card's
uncorrectable-ECC or row-remap-failure counter. This source polls it with its own token and turns events into a
level state the monitor can diff: a card fault *stands* for ``hold_sec`` after the last event that raised it,
then clears (so the same card failing again later opens a new window instead of being taken for a repeat).

Levels. The spec names XID 48/94/95/79/64 and uncorrectable growth as card faults at L4-L6 with 79 and 95 at L6;
the rest is our reading of NVIDIA's XID catalogue:

======================  =====  ================================================================================
event                   level  why
======================  =====  ================================================================================
XID 79                  L6     the GPU fell off the bus: the card is gone until the node is serviced
XID 95                  L6     uncontained ECC error: every process on the card is suspect, the card needs reset
XID 48                  L5     double-bit ECC error: the card must be reset before it is trusted again
XID 64                  L5     ECC page retirement / row remapping failed: reset, then likely replacement
XID 94                  L4     contained ECC error: the affected application dies, the card keeps working
remap failure +N        L6     the card has no spare rows left: replacement, never a restart
uncorrectable ECC +N    L5     as XID 48, seen through the counter (drivers that do not raise an XID)
any other XID           —      informational (13, 31, 43, 45, 63, 92, …): application or driver events that do
                               not say the card is broken; not forwarded (the platform keeps them)
======================  =====  ================================================================================

Cards are named by uuid (``GPU-…``), which the controller's core matches against the endpoints' device infos;
an event whose uuid the agent could not read names the card by its index on the node instead.

Evidence by origin. An event counts only when it comes from a node of the trusted tenant (``trusted_tenant``;
unset: the nodes without a tenant) and, for an XID, names a card the node reported before (``card_known``): an
agent of another tenant that registers a hostname of ours, or an agent inventing card uuids, raises nothing. An
event the platform marks ``identity_changed`` (the node's credential was issued again shortly before: whoever
claimed it may not be the node's agent) never reconfigures the serving plane either: it is reported as a problem
for an operator, who confirms it by hand (``heteroflow fault``) or releases the node again.
Skipped events are counted (:attr:`GpuHealthSource.skipped`). New faults are raised at most once per
``new_fault_interval_sec``: the new faults of one poll together, later ones held (counted in
:attr:`GpuHealthSource.deferred`, and reported as a problem) until the interval has passed, so that a storm of
events causes at most one reconfiguration per interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import httpx
from pydantic import ValidationError

from heteroflow.contracts.hardware_events import FEED_PATH, HardwareFeedEnvelope, HardwareFeedEvent
from heteroflow.contracts.serving import HardwareFaultReport
from heteroflow.core.clock import Clock
from heteroflow.http.peer import JsonPeer, PeerError, one_transport

from .base import Emit, Problem, Snapshot, fault_key

EVENTS_PATH = FEED_PATH

XID_LEVELS: Mapping[int, int] = {79: 6, 95: 6, 48: 5, 64: 5, 94: 4}
COUNTER_FAULTS: Mapping[str, tuple[str, int]] = {
    "remap_failure": ("ROW_REMAP_FAILURE", 6),
    "ecc_uncorrected": ("ECC_UNCORRECTABLE", 5),
}
"""Event kind → (fault code, level)."""


@dataclass(frozen=True, slots=True)
class MappedEvent:
    report: HardwareFaultReport | None
    """The card fault; ``None`` for an informational event (or one that could not be read)."""
    problem: str | None = None


def map_event(event: object, *, source: str) -> MappedEvent:
    """One event of the feed → a card fault at its level, nothing (informational), or a problem. Never raises."""
    if not isinstance(event, dict):
        return MappedEvent(None, "an event that is not an object")
    node = event.get("node_name")
    if not isinstance(node, str) or not node:
        return MappedEvent(None, "an event without node_name")
    try:
        read = HardwareFeedEvent.model_validate(event)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the event"
        return MappedEvent(None, f"an unreadable event on {node!r}: {where}: {first['msg']}")
    if read.uuid:
        card = read.uuid
    elif read.gpu_index >= 0:
        card = str(read.gpu_index)  # no uuid read by the agent: the index on the node still names the card
    else:
        return MappedEvent(None, f"an event on {node!r} names no card (neither uuid nor gpu_index)")
    if read.kind == "xid":
        level = XID_LEVELS.get(read.value)
        if level is None:
            return MappedEvent(None)  # informational
        code, detail = f"XID{read.value}", f"XID {read.value}"
    else:
        code, level = COUNTER_FAULTS[read.kind]
        detail = f"{read.kind} {read.previous!r} -> {read.value}"
    at = event.get("at")  # as the feed wrote it
    try:
        report = HardwareFaultReport(
            node_name=node,
            card=card,
            fault_code=code,
            level=level,
            source=source,
            detail=f"{detail} at {at}" if isinstance(at, str) else detail,
        )
    except ValidationError as exc:
        return MappedEvent(None, f"event on {node!r} skipped: {exc.errors()[0]['msg']}")
    return MappedEvent(report)


class GpuHealthSource:
    """Polls the platform's hardware-event feed every ``poll_sec``; a card fault stands ``hold_sec`` after its
    last event. The cursor survives a restart of the source, so a crash never loses or repeats events.

    ``lookback_sec`` > 0 makes the first poll start that far back (events that happened just before the
    controller started); the default 0 starts at the present, so that a restarted controller does not reopen
    correlation windows for faults it already handled.
    """

    def __init__(
        self,
        *,
        base_url: str,
        token: str | None,
        poll_sec: float,
        hold_sec: float,
        clock: Clock,
        lookback_sec: float = 0.0,
        platform_source: str = "real",
        page_limit: int = 200,
        max_pages_per_poll: int = 50,
        timeout_sec: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        name: str = "gpu-health",
        trusted_tenant: str | None = None,
        new_fault_interval_sec: float = 0.0,
    ) -> None:
        self.name = name
        self._base_url = base_url.rstrip("/")
        self._poll_sec = poll_sec
        self._hold_sec = hold_sec
        self._clock = clock
        self._lookback = lookback_sec
        self._platform_source = platform_source
        self._page_limit = page_limit
        self._max_pages = max_pages_per_poll
        self._http = JsonPeer(
            token=token,
            timeout_sec=timeout_sec,
            transport_for=one_transport(transport),
        )
        self._cursor: str | None = None
        self._active: dict[str, tuple[HardwareFaultReport, float]] = {}
        """Fault key → (report, monotonic seconds of its last event)."""
        self._trusted_tenant = trusted_tenant
        self._interval = new_fault_interval_sec
        self._held: dict[str, tuple[HardwareFaultReport, float]] = {}
        """New faults not raised yet (the interval since the last raise has not passed)."""
        self._last_raise: float | None = None
        self.skipped: dict[str, int] = {"foreign_tenant": 0, "unknown_card": 0, "identity_changed": 0}
        """Events not taken as evidence, by reason."""
        self.deferred = 0
        """Polls whose new faults were held by the interval."""

    async def run(self, emit: Emit) -> None:
        try:
            while True:
                await self.poll_once(emit)
                await self._clock.sleep(self._poll_sec)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the pooled connection to the platform (:meth:`run` does when it ends)."""
        await self._http.aclose()

    async def poll_once(self, emit: Emit) -> None:
        """Read every new page (up to ``max_pages_per_poll``), then publish the faults standing now."""
        for _ in range(self._max_pages):
            problem, more = await self._page(emit)
            if problem is not None:
                emit(Problem(scope="platform", detail=problem))
                break
            if not more:
                break
        now = self._clock.monotonic()
        self._active = {k: (r, seen) for k, (r, seen) in self._active.items() if now - seen < self._hold_sec}
        self._held = {k: (r, seen) for k, (r, seen) in self._held.items() if now - seen < self._hold_sec}
        if self._held:
            if self._last_raise is None or now - self._last_raise >= self._interval:
                self._active.update(self._held)  # every new fault of this poll (and any held) raised together
                self._held = {}
                self._last_raise = now
            else:
                self.deferred += 1
                wait = self._interval - (now - self._last_raise)
                emit(
                    Problem(
                        scope="platform",
                        detail=f"{len(self._held)} new card fault(s) held {wait:.1f} s: at most one raise per "
                        f"{self._interval:g} s",
                    )
                )
        emit(Snapshot(scope="platform", faults=tuple(r for r, _ in self._active.values())))

    def _trusted(self, event: object) -> bool:
        """Whether an event is evidence for this controller: its node's tenant, and a card its node reported."""
        if not isinstance(event, dict):
            return True  # map_event reports it as a problem
        if event.get("tenant_id") != self._trusted_tenant:
            self.skipped["foreign_tenant"] += 1
            return False
        if event.get("card_known") is False:
            self.skipped["unknown_card"] += 1
            return False
        if event.get("identity_changed") is True:
            self.skipped["identity_changed"] += 1
            return False
        return True

    async def _page(self, emit: Emit) -> tuple[str | None, bool]:
        params: dict[str, str | int] = {"limit": self._page_limit, "source": self._platform_source}
        if self._cursor is not None:
            params["cursor"] = self._cursor
        elif self._lookback > 0:
            params["since"] = (self._clock.now() - timedelta(seconds=self._lookback)).isoformat()
        try:
            body = await self._http.get_object(self._base_url, EVENTS_PATH, params=params)
        except PeerError as exc:  # unreachable, an error status ("… answered HTTP 401: …"), not a JSON object
            return str(exc), False
        try:
            page = HardwareFeedEnvelope.model_validate(body)
        except ValidationError:
            return f"{EVENTS_PATH} answered without events / next_cursor / more", False
        now = self._clock.monotonic()
        for event in page.events:
            if not self._trusted(event):
                if isinstance(event, dict) and event.get("identity_changed") is True:
                    emit(
                        Problem(
                            scope="platform",
                            detail=f"a hardware event of node {str(event.get('node_name'))[:253]!r} held for an "
                            "operator: its credential was issued again shortly before",
                        )
                    )
                continue
            mapped = map_event(event, source=self.name)
            if mapped.problem is not None:
                emit(Problem(scope="platform", detail=mapped.problem))
            if mapped.report is not None:
                key = fault_key(mapped.report)
                (self._active if key in self._active else self._held)[key] = (mapped.report, now)
        self._cursor = page.next_cursor  # only after the page was taken: a failed page is asked for again
        return None, page.more
