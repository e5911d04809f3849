"""Per-client limits: no one client may hold more than its share of a service's in-flight requests.

An admission gate (:mod:`heteroflow.core.admission`) bounds what a service does at once, but not who does it:
one client with a valid credential and 256 slow bodies fills a 256-slot heartbeat gate on its own, and every
other agent is shed. A per-client limit refuses that client's excess at once (429 with ``Retry-After``), before
it takes a slot of the gate or sends a byte of its body, so the gate's room is left to the others.

Which key a request counts under is the service's choice (``key_of``), and it is taken only once the request is
authenticated (this middleware runs inside :class:`~heteroflow.core.authentication.AuthenticateFirst`), so a key
is never a value a client may invent for free:

- a **credential** (an agent's node, verified against the node's own credential; a Coordinator API key): one
  speaker needs only a few requests at once — an agent beats one at a time;
- a **peer address** (``scope["client"]``): generous, because many honest clients may share one (agents behind a
  NAT, every request through an ingress); it bounds one machine holding many credentials.

Pieces, none importing a web framework: :class:`InFlightByKey` (the counts, no I/O) and :class:`ClientLimit`
(a plain ASGI middleware). Each service renders the refusal in its own error shape and counts it in its metrics.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ClientLimitStatus:
    """A snapshot of one limiter, for status routes, metrics and tests."""

    max_per_client: int
    clients: int
    """Clients with at least one request in flight now."""
    peak_per_client: int
    """The most requests one client had in flight at once since the service started."""
    refused_total: int


class InFlightByKey:
    """At most ``max_per_client`` requests in flight per key. Not thread-safe: one event loop owns it."""

    def __init__(self, *, max_per_client: int) -> None:
        if max_per_client < 1:
            raise ValueError("a per-client limit must admit at least one request at a time")
        self.max_per_client = max_per_client
        self._held: dict[str, int] = {}
        self._peak = 0
        self._refused = 0

    def try_enter(self, key: str) -> bool:
        held = self._held.get(key, 0)
        if held >= self.max_per_client:
            self._refused += 1
            return False
        self._held[key] = held + 1
        self._peak = max(self._peak, held + 1)
        return True

    def leave(self, key: str) -> None:
        held = self._held.get(key, 0) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)  # a client that holds nothing costs no memory

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    def status(self) -> ClientLimitStatus:
        return ClientLimitStatus(
            max_per_client=self.max_per_client,
            clients=len(self._held),
            peak_per_client=self._peak,
            refused_total=self._refused,
        )


def peer_address(scope: Scope) -> str | None:
    """The address the request came from (the TCP peer), or ``None`` when the server gives none."""
    client = scope.get("client")
    return str(client[0]) if client else None


Render = Callable[[Scope, int], dict[str, object]]
"""A service's error body for a refused request: ``(scope, the limit) → JSON object``."""


class ClientLimit:
    """ASGI middleware: a request for which ``key_of(scope)`` names a client passes only while that client has
    fewer than the limiter's bound in flight; it holds its place until the application returns (a streamed
    answer: its last byte). A refused one is answered ``status`` (429) with ``Retry-After`` and
    ``Connection: close`` at once: its body is never read."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: InFlightByKey,
        key_of: Callable[[Scope], str | None],
        retry_after_sec: int,
        render: Render,
        on_refused: Callable[[Scope], None] | None = None,
        status: int = 429,
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.key_of = key_of
        self.retry_after_sec = retry_after_sec
        self.render = render
        self.on_refused = on_refused
        self.status = status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = self.key_of(scope) if scope["type"] == "http" else None
        if key is None:
            await self.app(scope, receive, send)
            return
        if not self.limiter.try_enter(key):
            if self.on_refused is not None:
                self.on_refused(scope)
            await self._refuse(scope, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.limiter.leave(key)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        body = json.dumps(self.render(scope, self.limiter.max_per_client)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.retry_after_sec).encode()),
            (b"connection", b"close"),  # the body the client may still be sending is never read
        ]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
