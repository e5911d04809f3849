"""The web UI's browser sessions: a token exchanged for an HttpOnly cookie that carries exactly its scopes and
tenant, CSRF and Origin checks on its writes, sign-out, revocation and expiry, on SQLite and PostgreSQL."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from heteroflow.platform.auth import hash_token
from heteroflow.platform_server.sessions import BEARER_ONLY, ENDED, MALFORMED, SESSION_COOKIE
from heteroflow.storage.schema import web_sessions
from heteroflow.storage.token_store import SqlTokenStore
from tests.support.harness import Harness, running_server

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LIFETIME_SEC = 3600
ORIGIN = "http://testserver"


@pytest.fixture
def harness(engine: Engine) -> Iterator[Harness]:
    with running_server(engine, start=T0, server={"web_session_seconds": LIFETIME_SEC}) as h:
        yield h


class Browser:
    """A session cookie and its CSRF token, sent explicitly (the test client's own cookie jar is kept empty)."""

    def __init__(self, harness: Harness, token: str) -> None:
        self.harness = harness
        response = harness.client.post("/api/v1/auth/session", headers=harness.auth(token))
        assert response.status_code == 201, response.text
        harness.client.cookies.clear()
        self.set_cookie = response.headers["set-cookie"]
        self.secret = self.set_cookie.split(";", 1)[0].removeprefix(f"{SESSION_COOKIE}=")
        self.body: dict[str, Any] = response.json()
        self.csrf = self.body["csrf_token"]

    def on(self, harness: Harness) -> Browser:
        """The same browser (its cookie and CSRF token) talking to another server."""
        moved = copy.copy(self)
        moved.harness = harness
        return moved

    def headers(self, *, write: bool = False, **extra: str) -> dict[str, str]:
        headers = {"Cookie": f"{SESSION_COOKIE}={self.secret}"}
        if write:
            headers |= {"Origin": ORIGIN, "X-CSRF-Token": self.csrf}
        return headers | extra

    def request(self, method: str, path: str, *, write: bool | None = None, **kwargs: Any) -> Any:
        headers = self.headers(write=method not in ("GET", "HEAD") if write is None else write)
        headers |= kwargs.pop("headers", {})
        return self.harness.client.request(method, path, headers=headers, **kwargs)


def test_sign_in_sets_an_httponly_strict_cookie_that_is_not_the_token(harness: Harness, engine: Engine) -> None:
    token = harness.token("nodes:read,alerts:write")
    browser = Browser(harness, token)
    attributes = [part.strip() for part in browser.set_cookie.split(";")]
    assert attributes[1:] == [f"Max-Age={LIFETIME_SEC}", "Path=/", "HttpOnly", "SameSite=Strict"]  # no Secure on http
    assert len(browser.secret) == 43
    assert token not in browser.set_cookie
    assert token not in str(browser.body)
    assert browser.body["scopes"] == ["alerts:write", "nodes:read"]
    assert browser.body["expires_at"].startswith("2026-03-01T13:00:00")
    # stored as its hash, never in clear
    with engine.connect() as conn:
        rows = conn.execute(sa.select(web_sessions.c.session_hash)).scalars().all()
    assert rows == [hash_token(browser.secret)]
    info = browser.request("GET", "/api/v1/auth/session")
    assert info.status_code == 200
    assert info.json() == browser.body
    assert info.headers["cache-control"] == "no-store"


def test_the_cookie_is_secure_over_https(harness: Harness) -> None:
    client = TestClient(harness.client.app, base_url="https://testserver")
    response = client.post("/api/v1/auth/session", headers=harness.auth(harness.token("nodes:read")))
    assert response.status_code == 201
    assert response.headers["set-cookie"].endswith("; HttpOnly; SameSite=Strict; Secure")


def test_the_session_has_exactly_the_tokens_scopes_and_tenant(harness: Harness) -> None:
    agent_a = harness.token("agent", tenant="team-a")
    agent_b = harness.token("agent", tenant="team-b")
    node_a = harness.register(agent_a, "a-1")
    node_b = harness.register(agent_b, "b-1")
    browser = Browser(harness, harness.token("nodes:read", tenant="team-a"))
    assert browser.body["tenant_name"] == "team-a"
    listing = browser.request("GET", "/api/v1/nodes")
    assert listing.status_code == 200
    assert [item["name"] for item in listing.json()["items"]] == ["a-1"]
    assert browser.request("GET", f"/api/v1/nodes/{node_a}").status_code == 200
    outside = browser.request("GET", f"/api/v1/nodes/{node_b}")
    absent = browser.request("GET", "/api/v1/nodes/00000000-0000-0000-0000-000000000000")
    assert outside.status_code == absent.status_code == 404
    assert browser.request("GET", "/api/v1/auth/whoami").json()["tenant_name"] == "team-a"
    # a scope the token lacks is the same 403 as with the token
    refused = browser.request("POST", "/api/v1/alerts/x/resolve", json={"reason": "replaced the card"})
    assert refused.status_code == 403
    assert "alerts:write" in refused.json()["detail"]
    assert browser.request("DELETE", f"/api/v1/nodes/{node_a}").status_code == 403
    assert browser.request("GET", "/api/v1/server/status").status_code == 403


def test_routes_of_machines_never_take_the_session(harness: Harness) -> None:
    admin = harness.token("admin")
    node = harness.register(admin, "n-1")
    browser = Browser(harness, admin)
    assert browser.request("GET", "/api/v1/server/status").status_code == 200  # admin's own routes: yes
    for method, path, body in (
        ("GET", "/metrics", None),
        ("POST", "/api/v1/nodes/register", {"hostname": "n-2", "vendor": "nvidia", "gpu_count": 1}),
        ("POST", f"/api/v1/nodes/{node}/heartbeat", {"gpu_stats": []}),
    ):
        response = browser.request(method, path, json=body)
        assert response.status_code == 401, (path, response.text)
        assert response.json()["detail"] == BEARER_ONLY
    # a session cannot mint another one
    again = browser.request("POST", "/api/v1/auth/session")
    assert again.status_code == 401
    assert "Authorization: Bearer" in again.json()["detail"]


def test_a_write_with_the_cookie_needs_the_csrf_token_and_this_sites_origin(harness: Harness) -> None:
    token = harness.token("nodes:read,alerts:write")
    browser = Browser(harness, token)
    path, body = "/api/v1/alerts/x/resolve", {"reason": "replaced the card"}
    cases = {
        "no CSRF token": {"Origin": ORIGIN},
        "a wrong CSRF token": {"Origin": ORIGIN, "X-CSRF-Token": "0" * 64},
        "no Origin": {"X-CSRF-Token": browser.csrf},
        "another site": {"Origin": "https://evil.example", "X-CSRF-Token": browser.csrf},
        "a look-alike host": {"Origin": "http://testserver.evil.example", "X-CSRF-Token": browser.csrf},
        "an opaque origin": {"Origin": "null", "X-CSRF-Token": browser.csrf},
        "a broken origin": {"Origin": "http://[::1", "X-CSRF-Token": browser.csrf},
    }
    for case, extra in cases.items():
        response = harness.client.post(path, json=body, headers=browser.headers() | extra)
        assert response.status_code == 403, (case, response.text)
        detail = response.json()["detail"]
        assert ("X-CSRF-Token" in detail) if "CSRF" in case else ("Origin" in detail), (case, detail)
    # DELETE, too (sign-out is a write)
    assert browser.request("DELETE", "/api/v1/auth/session", write=False).status_code == 403
    # with both: past the checks, to the route itself (no such alert)
    assert browser.request("POST", path, json=body).status_code == 404
    # a bearer call needs neither
    assert harness.client.post(path, json=body, headers=harness.auth(token)).status_code == 404


def test_sign_out_clears_the_cookie_and_ends_the_session_on_the_server(harness: Harness, engine: Engine) -> None:
    browser = Browser(harness, harness.token("nodes:read"))
    other = Browser(harness, harness.token("nodes:read"))
    response = browser.request("DELETE", "/api/v1/auth/session")
    assert response.status_code == 204
    assert response.headers["set-cookie"] == f"{SESSION_COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"
    # the old cookie, replayed, is refused
    replayed = browser.request("GET", "/api/v1/nodes")
    assert replayed.status_code == 401
    assert replayed.json()["detail"] == ENDED
    assert browser.request("GET", "/api/v1/auth/session").status_code == 401
    assert other.request("GET", "/api/v1/nodes").status_code == 200  # only that session ended
    with engine.connect() as conn:
        assert conn.execute(sa.select(web_sessions.c.session_hash)).scalars().all() == [hash_token(other.secret)]


def test_revoking_the_token_ends_its_sessions_at_once(harness: Harness) -> None:
    token = harness.token("nodes:read")
    browser = Browser(harness, token)
    assert browser.request("GET", "/api/v1/nodes").status_code == 200
    store = SqlTokenStore(harness.ctx.engine)
    principal = store.principal(hash_token(token))
    assert principal is not None
    assert store.revoke(principal.token_id, now=harness.clock.now())
    # no upkeep round: the session lookup joins the live token on every request
    response = browser.request("GET", "/api/v1/nodes")
    assert response.status_code == 401
    assert response.json()["detail"] == ENDED


def test_the_session_expires(harness: Harness) -> None:
    browser = Browser(harness, harness.token("nodes:read"))
    harness.clock.advance(LIFETIME_SEC - 1)
    assert browser.request("GET", "/api/v1/nodes").status_code == 200
    harness.clock.advance(1)
    assert browser.request("GET", "/api/v1/nodes").status_code == 401
    assert browser.request("POST", "/api/v1/alerts/x/resolve", json={"reason": "r"}).status_code == 401


@pytest.mark.parametrize(
    "cookie",
    [
        f"{SESSION_COOKIE}=",
        f"{SESSION_COOKIE}=abc",
        f"{SESSION_COOKIE}={'A' * 43}",  # well formed, unknown
        f"{SESSION_COOKIE}={'A' * 6000}",
        f"{SESSION_COOKIE}={'é' * 43}",
        f'{SESSION_COOKIE}="{"A" * 42}\\"',
        f"a=b; {SESSION_COOKIE}={'A' * 42}%00",
    ],
)
def test_a_bad_or_oversized_cookie_is_401_never_500(harness: Harness, cookie: str) -> None:
    headers: dict[bytes, bytes]
    for method, path in (
        ("GET", "/api/v1/nodes"),
        ("POST", "/api/v1/alerts/x/resolve"),
        ("GET", "/api/v1/auth/session"),
    ):
        headers = {b"cookie": cookie.encode(), b"origin": ORIGIN.encode(), b"x-csrf-token": b"x"}  # UTF-8 bytes as sent
        response = harness.client.request(
            method, path, headers=headers, json={"reason": "r"} if method == "POST" else None
        )
        assert response.status_code == 401, (cookie[:60], path, response.text)
        assert response.json()["detail"] in (ENDED, MALFORMED)


def test_without_any_credential_the_session_routes_are_401_and_a_bearer_has_no_session(harness: Harness) -> None:
    for method in ("GET", "POST", "DELETE"):
        response = harness.client.request(method, "/api/v1/auth/session")
        assert response.status_code == 401, method
        assert response.headers["www-authenticate"] == "Bearer"
    token = harness.token("nodes:read")
    assert harness.client.get("/api/v1/auth/session", headers=harness.auth(token)).status_code == 404
    assert harness.client.get("/api/v1/auth/session", headers=harness.auth("hf_unknown")).status_code == 401
    # a bearer sign-out is a no-op that still clears a cookie
    assert harness.client.delete("/api/v1/auth/session", headers=harness.auth(token)).status_code == 204


def test_signing_in_again_ends_the_previous_session_of_that_browser(harness: Harness) -> None:
    token = harness.token("nodes:read")
    first = Browser(harness, token)
    response = harness.client.post(
        "/api/v1/auth/session", headers=harness.auth(token) | {"Cookie": f"{SESSION_COOKIE}={first.secret}"}
    )
    harness.client.cookies.clear()
    assert response.status_code == 201
    assert first.request("GET", "/api/v1/nodes").status_code == 401


def test_a_session_lookup_without_the_database_is_503(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.core.errors import StoreUnavailableError

    browser = Browser(harness, harness.token("nodes:read,alerts:write"))

    def unavailable(*_: object, **__: object) -> None:
        raise StoreUnavailableError("database down")

    monkeypatch.setattr(harness.ctx.sessions, "principal", unavailable)
    assert browser.request("GET", "/api/v1/nodes").status_code == 503
    assert browser.request("POST", "/api/v1/alerts/x/resolve", json={"reason": "r"}).status_code == 503


def test_two_server_processes_on_one_database_share_the_session(harness: Harness, engine: Engine) -> None:
    """Another server (its own process state: caches, memory) accepts the session at once, and a sign-out on
    it ends the session on the first one at the next request."""
    browser = Browser(harness, harness.token("nodes:read,alerts:write"))
    with running_server(engine, start=T0, server={"web_session_seconds": LIFETIME_SEC}) as other:
        elsewhere = browser.on(other)
        assert elsewhere.request("GET", "/api/v1/nodes").status_code == 200
        assert elsewhere.request("DELETE", "/api/v1/auth/session").status_code == 204
    assert browser.request("GET", "/api/v1/nodes").status_code == 401
