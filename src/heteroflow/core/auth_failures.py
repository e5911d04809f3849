"""Failed credentials cost the one who sends them: after too many 401s, 429 with ``Retry-After``.

3,000 random keys to the Coordinator from 32 threads were all answered 401, each a platform lookup and a log line:
guessing was free. :class:`FailedCredentials` counts each service's 401s per **client key** — the peer address,
and the presented credential's id (a prefix of its SHA-256, never the credential) — in fixed windows of
``window_sec``. A key with ``max_failures`` 401s in its window is blocked until the window ends: its requests are
answered 429 with ``Retry-After`` (the seconds left) before any lookup, body read or log line, and counted. A
request that presents no credential guesses nothing and costs no lookup: the services give it no keys, so it is
neither counted nor blocked (probes and public pages stay reachable from a guessing address).

The address is a courtesy, not a boundary (many honest clients may share one behind a NAT): a request whose
credential the service already holds as valid in memory is never blocked by its address, only a key with
failures of its own is. What the service logs of refusals is sampled: the first 401 of an address in its window and
the moment a key is blocked, one line each (:meth:`FailedCredentials.fail` says when), the rest only counted.

:class:`BlockFailedCredentials` is the plain ASGI middleware that answers a blocked key first of all.

The counts live in memory, at most ``max_keys`` of them (the oldest windows are forgotten first). Pure bookkeeping
on the caller's monotonic seconds (no I/O, not thread-safe: one event loop owns it), no web framework.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

LogLine = Literal["first", "blocked"] | None
"""What :meth:`FailedCredentials.fail` asks the caller to log: the key's first 401 of its window, the 401 that
blocked it, or nothing (counted only)."""


@dataclass(frozen=True, slots=True)
class FailedCredentialsStatus:
    """A snapshot, for status routes, metrics and tests."""

    max_failures: int
    window_sec: float
    keys: int
    """Client keys with a 401 in their current window."""
    blocked_keys: int
    failures_total: int
    """401s counted."""
    refused_total: int
    """Requests answered 429 because their key was blocked."""
    logged_total: int
    """Refusal log lines written (the first of a key's window, and its block)."""
    unlogged_total: int
    """401s counted without a line of their own."""


class _Window:
    __slots__ = ("failures", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.failures = 0


class FailedCredentials:
    """401s per client key in fixed windows; a key at ``max_failures`` is blocked until its window ends."""

    def __init__(self, *, max_failures: int, window_sec: float, max_keys: int = 100_000) -> None:
        if max_failures < 1 or window_sec <= 0 or max_keys < 1:
            raise ValueError("a failed-credential limit needs at least one failure, a positive window and a key")
        self.max_failures = max_failures
        self.window_sec = window_sec
        self.max_keys = max_keys
        self._windows: dict[str, _Window] = {}
        self._failures = 0
        self._refused = 0
        self._logged = 0
        self._unlogged = 0

    @property
    def quiet(self) -> bool:
        """No key has a 401 on record: nothing can be blocked (the hot path checks this first)."""
        return not self._windows

    def retry_after(self, keys: tuple[str, ...], *, now: float) -> int | None:
        """Seconds until the most blocked of ``keys`` may try again (counted as a refusal), or ``None``."""
        wait = 0.0
        for key in keys:
            window = self._windows.get(key)
            if window is None:
                continue
            left = window.started + self.window_sec - now
            if left <= 0:
                del self._windows[key]
            elif window.failures >= self.max_failures:
                wait = max(wait, left)
        if wait <= 0:
            return None
        self._refused += 1
        return max(1, math.ceil(wait))

    def fail(self, keys: tuple[str, ...], *, now: float) -> LogLine:
        """Count a 401 for each of ``keys``; what to log of it: the first 401 of the first key's window (the
        address: a client guessing a new key each time still writes one line a window), or the one that blocks a
        key; otherwise nothing."""
        self._failures += 1
        line: LogLine = None
        for position, key in enumerate(keys):
            window = self._windows.get(key)
            if window is None or now - window.started >= self.window_sec:
                window = self._windows[key] = _Window(now)
                self._trim()
            window.failures += 1
            if window.failures == self.max_failures:
                line = "blocked"
            elif window.failures == 1 and position == 0 and line is None:
                line = "first"
        if line is None:
            self._unlogged += 1
        else:
            self._logged += 1
        return line

    def _trim(self) -> None:
        """Forget the oldest windows beyond ``max_keys`` (dicts keep insertion order: the oldest come first)."""
        while len(self._windows) > self.max_keys:
            del self._windows[next(iter(self._windows))]

    def status(self, *, now: float) -> FailedCredentialsStatus:
        live = [w for w in self._windows.values() if now - w.started < self.window_sec]
        return FailedCredentialsStatus(
            max_failures=self.max_failures,
            window_sec=self.window_sec,
            keys=len(live),
            blocked_keys=sum(1 for w in live if w.failures >= self.max_failures),
            failures_total=self._failures,
            refused_total=self._refused,
            logged_total=self._logged,
            unlogged_total=self._unlogged,
        )


def address_key(address: str | None) -> str | None:
    """The client key of a peer address (``None``: the server gave none)."""
    return f"address:{address}" if address else None


def credential_key(digest: str) -> str:
    """The client key of a credential, from its SHA-256 hex digest: a prefix, never the credential itself."""
    return f"key:{digest[:12]}"


Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BlockFailedCredentials:
    """ASGI middleware, outermost: a request from a blocked client key (``keys_of``) is answered ``status`` (429)
    with ``Retry-After`` and ``Connection: close`` before anything else runs — unless ``trusted`` (its credential
    is one the service holds as valid in memory). The 401s themselves are counted where the service answers them
    (:meth:`FailedCredentials.fail`)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        book: FailedCredentials,
        keys_of: Callable[[Scope], tuple[str, ...]],
        trusted: Callable[[Scope], bool],
        now: Callable[[], float],
        render: Callable[[Scope, int], dict[str, object]],
        on_refused: Callable[[Scope], None] | None = None,
        status: int = 429,
    ) -> None:
        self.app = app
        self.book = book
        self.keys_of = keys_of
        self.trusted = trusted
        self.now = now
        self.render = render
        self.on_refused = on_refused
        self.status = status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.book.quiet or self.trusted(scope):  # the quiet check first: no work
            await self.app(scope, receive, send)
            return
        wait = self.book.retry_after(self.keys_of(scope), now=self.now())
        if wait is None:
            await self.app(scope, receive, send)
            return
        if self.on_refused is not None:
            self.on_refused(scope)
        body = json.dumps(self.render(scope, wait)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(wait).encode()),
            (b"connection", b"close"),  # the body the client may still be sending is never read
        ]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
