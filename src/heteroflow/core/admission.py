"""Admission control: beyond what a service can answer in time, answer 503 with Retry-After at once.

A service that accepts everything under overload answers everything late: once the wait passes the clients'
timeout, every answer is work nobody waits for, and the queue (and the memory it holds) grows with the offered
load. Refusing the excess early keeps the admitted requests fast and tells the clients when to come back.

Two signals, because requests queue in two places:

- **In flight** — requests inside the application (reading a body, waiting for a thread or an upstream,
  streaming an answer). Bounded by ``max_in_flight``: each takes a slot for its whole life.
- **Event-loop lag** — requests the loop has not reached yet. A handler that never waits (a heartbeat served
  from memory) is never "in flight" for long, so under overload the queue forms *before* the application: in
  sockets and in the loop's ready queue, where no counter sees it. How late a periodic timer fires measures
  that wait (:func:`watch_loop_lag`); above ``max_lag_sec`` new requests are refused until the loop catches up.

Pieces, none importing a web framework:

A bound on the whole is not a bound on who fills it: one tenant with a valid token and enough nodes (each within
its own per-node limit) can hold every slot with slow bodies, and every other tenant is shed. So a gate may also
give each **owner** a share: at most ``max_per_tenant`` slots to one tenant, and at most ``max_per_token`` to one
token within it (the key is the service's verified owner of the request — on the platform, the node's tenant and
the token that registered it — never a value a client may choose). A request over its owner's share is refused
("tenant_share", "token_share") while the others' requests still find room.

- :class:`AdmissionGate` — the decision and its counters, with a frozen :class:`AdmissionStatus` (no I/O).
- :func:`watch_loop_lag` — the task that feeds the gate the loop's lag.
- :class:`AdmissionLimit` — a plain ASGI middleware that sends the requests a service selects through the gate
  and refuses the rest before reading their bodies. Each service renders the refusal in its own error shape
  (``render``) and counts it in its own metrics (``on_refused``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

Refusal = Literal["busy", "lagging", "tenant_share", "token_share"]
"""Why a request was refused: every slot taken, the event loop too far behind, or its owner's share (its
tenant's, its token's) taken."""

Owner = tuple[str, str]
"""Whose request it is, as the service verified it: ``(tenant, token)`` (``""`` for none)."""


@dataclass(frozen=True, slots=True)
class AdmissionStatus:
    """A snapshot of one gate, for status routes, metrics and tests."""

    max_in_flight: int
    max_lag_sec: float | None
    in_flight: int
    peak_in_flight: int
    """The most requests in flight at once since the service started."""
    lag_sec: float
    """The event loop's lag as last measured, seconds (0 when it is not watched)."""
    peak_lag_sec: float
    admitted_total: int
    refused_busy_total: int
    refused_lagging_total: int
    max_per_tenant: int | None = None
    """The most slots one tenant may hold (``None``: no share per tenant)."""
    max_per_token: int | None = None
    """The most slots one token may hold within its tenant (``None``: no share per token)."""
    tenants_in_flight: int = 0
    """Tenants holding at least one slot now."""
    peak_per_tenant: int = 0
    """The most slots one tenant held at once since the service started."""
    peak_per_token: int = 0
    refused_tenant_share_total: int = 0
    refused_token_share_total: int = 0
    busiest_tenants: tuple[tuple[str, int], ...] = ()
    """The (at most 10) tenants holding the most slots now, with their counts (``""``: nodes of no tenant)."""


class AdmissionGate:
    """At most ``max_in_flight`` holders at once, and none while the loop lags more than ``max_lag_sec``.

    Not thread-safe: one event loop owns it.
    """

    def __init__(
        self,
        *,
        max_in_flight: int,
        max_lag_sec: float | None = None,
        max_per_tenant: int | None = None,
        max_per_token: int | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("an admission gate must admit at least one request at a time")
        if max_lag_sec is not None and max_lag_sec <= 0:
            raise ValueError("the lag bound must be positive (None: lag is not a reason to refuse)")
        if (max_per_tenant is not None and max_per_tenant < 1) or (max_per_token is not None and max_per_token < 1):
            raise ValueError("a share must admit at least one request at a time")
        self.max_in_flight = max_in_flight
        self.max_lag_sec = max_lag_sec
        self.max_per_tenant = max_per_tenant
        self.max_per_token = max_per_token
        self._in_flight = 0
        self._peak = 0
        self._lag_s = 0.0
        self._peak_lag_s = 0.0
        self._admitted = 0
        self._refused: dict[Refusal, int] = {"busy": 0, "lagging": 0, "tenant_share": 0, "token_share": 0}
        self._by_tenant: dict[str, int] = {}
        self._by_token: dict[Owner, int] = {}
        self._peak_tenant = 0
        self._peak_token = 0

    def observe_lag(self, lag_sec: float) -> None:
        """The newest measurement of the event loop's lag, seconds."""
        self._lag_s = max(0.0, lag_sec)
        self._peak_lag_s = max(self._peak_lag_s, self._lag_s)

    def try_enter(self, owner: Owner | None = None) -> Refusal | None:
        """Take a slot for ``owner`` (``None``), or say why not (counted as refused). A request without an owner
        counts only against the whole."""
        refusal: Refusal | None = None
        if self.max_lag_sec is not None and self._lag_s > self.max_lag_sec:
            refusal = "lagging"
        elif self._in_flight >= self.max_in_flight:
            refusal = "busy"
        elif owner is not None:
            if self.max_per_tenant is not None and self._by_tenant.get(owner[0], 0) >= self.max_per_tenant:
                refusal = "tenant_share"
            elif self.max_per_token is not None and self._by_token.get(owner, 0) >= self.max_per_token:
                refusal = "token_share"
        if refusal is not None:
            self._refused[refusal] += 1
            return refusal
        self._in_flight += 1
        self._admitted += 1
        self._peak = max(self._peak, self._in_flight)
        if owner is not None:
            held = self._by_tenant[owner[0]] = self._by_tenant.get(owner[0], 0) + 1
            self._peak_tenant = max(self._peak_tenant, held)
            held = self._by_token[owner] = self._by_token.get(owner, 0) + 1
            self._peak_token = max(self._peak_token, held)
        return None

    def leave(self, owner: Owner | None = None) -> None:
        self._in_flight = max(0, self._in_flight - 1)
        if owner is None:
            return
        # written out (no call per count): every admitted heartbeat leaves; an owner holding nothing is forgotten
        by_tenant, by_token = self._by_tenant, self._by_token
        held = by_tenant.get(owner[0], 0) - 1
        if held > 0:
            by_tenant[owner[0]] = held
        else:
            by_tenant.pop(owner[0], None)
        held = by_token.get(owner, 0) - 1
        if held > 0:
            by_token[owner] = held
        else:
            by_token.pop(owner, None)

    def held_by(self, tenant: str) -> int:
        """Slots ``tenant`` holds now."""
        return self._by_tenant.get(tenant, 0)

    def status(self) -> AdmissionStatus:
        return AdmissionStatus(
            max_in_flight=self.max_in_flight,
            max_lag_sec=self.max_lag_sec,
            in_flight=self._in_flight,
            peak_in_flight=self._peak,
            lag_sec=self._lag_s,
            peak_lag_sec=self._peak_lag_s,
            admitted_total=self._admitted,
            refused_busy_total=self._refused["busy"],
            refused_lagging_total=self._refused["lagging"],
            max_per_tenant=self.max_per_tenant,
            max_per_token=self.max_per_token,
            tenants_in_flight=len(self._by_tenant),
            peak_per_tenant=self._peak_tenant,
            peak_per_token=self._peak_token,
            refused_tenant_share_total=self._refused["tenant_share"],
            refused_token_share_total=self._refused["token_share"],
            busiest_tenants=tuple(sorted(self._by_tenant.items(), key=lambda item: (-item[1], item[0]))[:10]),
        )


async def watch_loop_lag(gate: AdmissionGate, *, period_sec: float = 0.05) -> None:
    """Measure, every ``period_sec``, how late the running loop fires a timer, and tell ``gate``; runs until
    cancelled. The lateness is the wait a request arriving now sees before the loop gets to it."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + period_sec
        await asyncio.sleep(period_sec)
        gate.observe_lag(loop.time() - due)


Render = Callable[[Scope, Refusal], dict[str, object]]
"""A service's error body for a refused request: ``(scope, why) → JSON object``."""


class AdmissionLimit:
    """ASGI middleware: requests for which ``applies(scope)`` is true pass only through ``gate``.

    An admitted request holds its slot until the application returns (a streamed answer: its last byte). A
    refused one is answered 503 with ``Retry-After: retry_after_sec`` at once; its body is never read (that is
    the point of refusing early).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        gate: AdmissionGate,
        applies: Callable[[Scope], bool],
        retry_after_sec: int,
        render: Render,
        on_refused: Callable[[Scope, Refusal], None] | None = None,
        owner_of: Callable[[Scope], Owner | None] | None = None,
    ) -> None:
        self.app = app
        self.gate = gate
        self.applies = applies
        self.retry_after_sec = retry_after_sec
        self.render = render
        self.on_refused = on_refused
        self.owner_of = owner_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.applies(scope):
            await self.app(scope, receive, send)
            return
        owner = self.owner_of(scope) if self.owner_of is not None else None
        refusal = self.gate.try_enter(owner)
        if refusal is not None:
            if self.on_refused is not None:
                self.on_refused(scope, refusal)
            await self._refuse(scope, refusal, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.leave(owner)

    async def _refuse(self, scope: Scope, refusal: Refusal, send: Send) -> None:
        body = json.dumps(self.render(scope, refusal)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.retry_after_sec).encode()),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
