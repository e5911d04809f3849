"""Authenticate before work: the credential of a request is checked before anything else spends on it.

An unauthenticated client must not be able to take an admission slot, make a service read (or wait for) a
body, or parse one: otherwise 256 anonymous sockets trickling a heartbeat body a byte at a time fill the
heartbeat gate, and a handful of anonymous megabyte bodies keep the event loop busy, and the real agents'
beats are shed. :class:`AuthenticateFirst` is the outermost middleware of a service: it runs a service's
``check`` (a cached token lookup: no body, no parse) and answers a refusal at once, with ``Connection: close``
so that the body the client may still be sending is never read.

Which requests are checked is the service's choice (``exempt``); by default every request that may carry a
body (any method but GET, HEAD and OPTIONS, and any request that declares a body), so that the public pages
and probes a service serves to callers without a token keep their own answers. Plain ASGI, no web framework.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

BEARER_CHALLENGE: Final = {"WWW-Authenticate": "Bearer"}
"""The header of every 401 answer (RFC 6750 §3): the scheme a client should send."""


def challenge_headers(status: int) -> dict[str, str] | None:
    """The headers an error answer with ``status`` carries: the bearer challenge on a 401, none otherwise.

    The one place the challenge is built: the services reach it through :mod:`heteroflow.http.gate`; it lives
    here, below the HTTP layer, because :class:`AuthenticateFirst` answers with it too.
    """
    return dict(BEARER_CHALLENGE) if status == 401 else None


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a request is refused before any work: ``status`` (401; 403 for a refused browser-session write; 503
    when the check could not be made)."""

    status: int
    code: str
    message: str


Check = Callable[[Scope], Awaitable[Denial | None]]
"""A service's credential check: ``None`` lets the request in."""

Render = Callable[[Scope, Denial], dict[str, object]]
"""A service's error body for a denial: ``(scope, denial) → JSON object``."""


_HEADER_TABLE: Final = "heteroflow.header_table"
"""Scope key: ``(headers, {lower-case name: first value})``, made at a request's first :func:`header` lookup; a
heartbeat's middleware stack asks for half a dozen headers, each a walk of the list without it."""


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case), or ``None``."""
    headers = scope.get("headers", ())
    cached = scope.get(_HEADER_TABLE)
    if cached is None or cached[0] is not headers:  # the first lookup, or the list was replaced since
        table: dict[bytes, bytes] = {}
        for key, value in reversed(headers):  # the first value of a repeated header wins
            table[bytes(key).lower()] = bytes(value)
        cached = scope[_HEADER_TABLE] = (headers, table)
    found: bytes | None = cached[1].get(name)
    return found


def bearer_of(scope: Scope) -> str | None:
    """The credential of ``Authorization: Bearer <value>``, or ``None`` when there is none."""
    raw = header(scope, b"authorization")
    if raw is None:
        return None
    scheme, _, value = raw.decode("latin-1").partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value else None


def declares_body(scope: Scope) -> bool:
    """Whether the request says it sends a body (a non-zero Content-Length, or Transfer-Encoding)."""
    if header(scope, b"transfer-encoding") is not None:
        return True
    length = header(scope, b"content-length")
    return length is not None and length.strip() not in (b"", b"0")


def may_carry_body(scope: Scope) -> bool:
    """Every request but a GET, HEAD or OPTIONS without a declared body."""
    return scope.get("method", "GET") not in _BODILESS_METHODS or declares_body(scope)


class AuthenticateFirst:
    """ASGI middleware: requests for which ``applies(scope)`` is true pass only when ``check`` lets them in."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        check: Check,
        render: Render,
        applies: Callable[[Scope], bool] = may_carry_body,
        on_denied: Callable[[Scope, Denial], None] | None = None,
    ) -> None:
        self.app = app
        self.check = check
        self.render = render
        self.applies = applies
        self.on_denied = on_denied

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.applies(scope):
            await self.app(scope, receive, send)
            return
        denial = await self.check(scope)
        if denial is None:
            await self.app(scope, receive, send)
            return
        if self.on_denied is not None:
            self.on_denied(scope, denial)
        payload = json.dumps(self.render(scope, denial)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),  # the body the client may still be sending is never read
        ]
        headers += [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in (challenge_headers(denial.status) or {}).items()
        ]
        await send({"type": "http.response.start", "status": denial.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})
