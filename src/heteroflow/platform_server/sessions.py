"""Browser sessions of the web UI: one sign-in per browser, the token never readable by page scripts.

``POST /api/v1/auth/session`` exchanges a valid API token (``Authorization: Bearer``) for a session: a random
secret in an ``HttpOnly; SameSite=Strict; Path=/`` cookie (``Secure`` over https), stored server-side as its
SHA-256 like a token (:class:`~heteroflow.storage.session_store.SqlSessionStore`). The cookie authenticates the
routes the token does, with exactly its scopes and tenant; every request with it reads the session row joined
with the live token, so signing out or revoking the token ends it at once on every server process, and it
lasts at most ``web_session_seconds``. Routes for machines (the agent's, Prometheus's ``/metrics``) take a
bearer token only.

A write made with the cookie (any method but GET, HEAD and OPTIONS) must also carry the session's CSRF token
in ``X-CSRF-Token`` (an HMAC of the secret: the page reads it from ``GET /api/v1/auth/session``, a cross-site
page cannot) and an ``Origin`` header naming this very host; otherwise 403 before any work. Bearer-token calls
need neither: a cross-site page cannot set ``Authorization``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from heteroflow.core.authentication import Scope as AsgiScope
from heteroflow.core.authentication import header
from heteroflow.platform.auth import Principal, hash_token
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import Forbidden, Unauthorized

SESSION_COOKIE = "heteroflow_session"
CSRF_HEADER = "X-CSRF-Token"
_CSRF_HEADER = CSRF_HEADER.lower().encode()
_SECRET = re.compile(r"[A-Za-z0-9_-]{43}")
"""What :func:`new_secret` makes (32 random bytes, URL-safe base64): anything else is refused unread."""
_STATE = "heteroflow.web_session"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_CSRF_CONTEXT = b"heteroflow web session csrf"

ENDED = "the browser session has ended (signed out, expired, or its token revoked); sign in again"
MALFORMED = "the session cookie is malformed; sign in again"
BEARER_ONLY = "this route takes a bearer token (Authorization: Bearer <token>), never a browser session"


@dataclass(frozen=True, slots=True)
class WebSession:
    """A live browser session: whose it is, until when, and the CSRF token its writes carry."""

    session_hash: str
    principal: Principal
    expires_at: datetime
    csrf_token: str


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def csrf_token_of(secret: str) -> str:
    """The session's CSRF token: derived from the secret, so that it needs no storage of its own."""
    return hmac.new(secret.encode("ascii"), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def cookie_value(scope: AsgiScope) -> str | None:
    """The raw value of the session cookie, or ``None`` when the request carries none."""
    for key, raw in scope.get("headers", ()):
        if key.lower() != b"cookie":
            continue
        for part in bytes(raw).decode("latin-1").split(";"):
            name, sep, value = part.strip().partition("=")
            if sep and name.strip() == SESSION_COOKIE:
                return value.strip().strip('"')
    return None


def session_secret(scope: AsgiScope) -> str | None:
    """The session secret of the request's cookie; ``None`` without one; 401 for a malformed one."""
    value = cookie_value(scope)
    if value is None:
        return None
    if not _SECRET.fullmatch(value):
        raise Unauthorized(MALFORMED)
    return value


def is_write(scope: AsgiScope) -> bool:
    return scope.get("method", "GET") not in _SAFE_METHODS


async def session_of(ctx: ServerContext, scope: AsgiScope) -> WebSession | None:
    """The live session of the request's cookie (``None`` without a cookie), its writes checked for CSRF.

    401 for a malformed, unknown or ended session; 403 for a write without this site's Origin or the CSRF
    token. One statement per request (no cache: signing out and revocation take effect at once everywhere);
    lookups share the token lookups' bound, so random cookies cannot queue up the thread pool.
    """
    state = scope.setdefault("state", {})
    known: WebSession | None = state.get(_STATE)
    if known is not None:
        return known
    secret = session_secret(scope)
    if secret is None:
        return None
    session_hash = hash_token(secret)
    async with ctx.token_lookups:
        found = await asyncio.to_thread(ctx.sessions.principal, session_hash, now=ctx.clock.now())
    if found is None:
        raise Unauthorized(ENDED)
    principal, expires_at = found
    session = WebSession(session_hash, principal, expires_at, csrf_token_of(secret))
    if is_write(scope):
        check_write(scope, session)
    state[_STATE] = session
    return session


def check_write(scope: AsgiScope, session: WebSession) -> None:
    """403 unless a cookie-authenticated write comes from this site's own page: its Origin names the request's
    host, and it carries the session's CSRF token."""
    origin = header(scope, b"origin")
    host = header(scope, b"host")
    if origin is None:
        raise Forbidden("a write with the browser session needs an Origin header naming this site")
    try:
        netloc = urlsplit(origin.decode("latin-1")).netloc
    except ValueError:
        netloc = ""
    if host is None or not netloc or netloc.lower() != host.decode("latin-1").lower():
        raise Forbidden("cross-site write refused: the Origin header does not name this site")
    sent = header(scope, _CSRF_HEADER)
    if sent is None or not hmac.compare_digest(sent, session.csrf_token.encode("ascii")):
        raise Forbidden(
            f"a write with the browser session needs the {CSRF_HEADER} header that GET /api/v1/auth/session gives"
        )


def secure(scope: AsgiScope) -> bool:
    """Whether the request came over https (then the cookie is ``Secure``)."""
    return scope.get("scheme") == "https"


def set_cookie(secret: str, *, max_age_sec: int, secure: bool) -> str:
    """The ``Set-Cookie`` value that starts a session."""
    return f"{SESSION_COOKIE}={secret}; Max-Age={max_age_sec}; Path=/; HttpOnly; SameSite=Strict" + (
        "; Secure" if secure else ""
    )


def clear_cookie(*, secure: bool) -> str:
    """The ``Set-Cookie`` value that makes the browser drop the session cookie."""
    return f"{SESSION_COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")
