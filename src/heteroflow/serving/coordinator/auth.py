"""Who may call the Coordinator.

- Management routes and ``/metrics``: the cluster token (``Authorization: Bearer <token>``), compared in
  constant time. No token configured → refused (401), never open.
- OpenAI routes: an API key (``Authorization: Bearer <key>``, as OpenAI clients send it), valid when its
  sha256 is one of ``api_key_hashes`` or when the HeteroFlow platform accepts it. No key source configured →
  every request refused (401): a Coordinator never serves anonymously by accident.

A platform token is an API key only when it has the ``inference`` scope: the Coordinator asks
``GET {platform_url}/api/v1/auth/whoami`` with it; 200 with ``inference`` among the scopes is valid (and names
the key's tenant), 200 without it, 401 and 403 are invalid, and anything else (unreachable, timeout, 5xx)
means "cannot tell" → 503 for that request. An agent's or a reader's token is never an API key. Accepted keys
are remembered by their sha256 for ``platform_token_cache_sec``; refused ones for
:data:`REFUSED_CACHE_SEC`, and at most :data:`PLATFORM_CHECKS_AT_ONCE` checks run at once, so that random keys
cannot amplify into platform queries (a token is 256 random bits: none is created that was refused before).

Before any work. :class:`KeyFirst` is a plain ASGI middleware in front of the Coordinator's admission gate: an
OpenAI request's key is checked before it takes a slot or sends a byte of its body, and each key holds at most
:data:`MAX_IN_FLIGHT_PER_KEY` requests at once (``max_in_flight_per_key``; beyond: 503 with Retry-After,
outcome ``key_busy``), so that one key's slow uploads cannot take the pool from every other key. A request counts
from its arrival until its last byte, held ones included (a round is when the pool fills up: a key whose held
requests did not count could take it all then). The refusals are counted (``on_refused``) like every other
OpenAI outcome. Every answered OpenAI request is logged (``coordinator.access``)
and counted (``heteroflow_coordinator_key_requests``) with its key's tenant and key id (a digest prefix).

Keys and tokens are never logged nor kept in clear: the cache is keyed by digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import structlog
from prometheus_client import CollectorRegistry, Counter

from heteroflow.core.auth_failures import FailedCredentials, address_key, credential_key
from heteroflow.core.clock import Clock
from heteroflow.core.ttl_cache import TtlCache
from heteroflow.http.peer import JsonPeer, Unavailable, one_transport
from heteroflow.platform.auth import bearer_matches, bearer_value
from heteroflow.serving.coordinator.errors import (
    AuthBackendUnavailableError,
    AuthenticationError,
    CoordinatorError,
    KeyBusyError,
    KeyThrottledError,
    openai_error_response,
)

_log = structlog.get_logger(__name__)

PLATFORM_CHECK_PATH = "/api/v1/auth/whoami"
"""The platform's route that describes the caller's token: scopes and tenant (``platform_server/routes/ops.py``)."""

INFERENCE_SCOPE = "inference"
REFUSED_CACHE_SEC = 10.0
"""How long a refused key is refused from memory, seconds."""
PLATFORM_CHECKS_AT_ONCE = 8
"""Platform checks of uncached keys running at once; the others wait."""
MAX_IN_FLIGHT_PER_KEY = 64
"""OpenAI requests one key may have in flight at once by default (``max_in_flight_per_key``; the Coordinator's
pool is shared by every key). A request held during a round counts: it holds its place in the pool as well."""


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """Who a valid key belongs to, as the access log and the metrics name it (never the key)."""

    key_id: str
    """The first 12 hex digits of the key's sha256."""
    tenant: str | None
    """The platform tenant's name; ``None`` for a configured key or a key without a tenant."""


cluster_token_matches = bearer_matches
"""The management routes' check: ``Authorization: Bearer <cluster token>``."""


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class PlatformUnavailableError(Unavailable):
    """The platform did not give a yes or no about a key."""


class KeyChecker(Protocol):
    """An outside authority on API keys (the platform server, or a fake in tests)."""

    async def accepts(self, key: str) -> bool:
        """True for a valid key, False for an invalid one; raises :class:`PlatformUnavailableError` otherwise."""
        ...

    async def aclose(self) -> None: ...


class PlatformKeyChecker:
    """Asks the platform server whether a bearer token is one of its tokens with the ``inference`` scope."""

    def __init__(self, *, base_url: str, timeout_sec: float, transport: httpx.AsyncBaseTransport | None = None):
        self._base_url = base_url.rstrip("/")
        # no token of its own: every check carries the key it asks about as its bearer
        self._http = JsonPeer(token=None, timeout_sec=timeout_sec, transport_for=one_transport(transport))

    async def accepts(self, key: str) -> bool:
        return await self.identify(key) is not None

    async def identify(self, key: str) -> KeyIdentity | None:
        """The key's identity when it is an inference key, ``None`` when it is not (unknown, revoked, or a token
        without the scope); :class:`PlatformUnavailableError` when the platform cannot tell."""
        try:
            response = await self._http.send(
                self._base_url, "GET", PLATFORM_CHECK_PATH, headers={"Authorization": f"Bearer {key}"}
            )
        except Unavailable as exc:
            cause = type(exc.__cause__).__name__
            raise PlatformUnavailableError(f"the platform could not be reached: {cause}") from exc
        if response.status_code in (401, 403):
            return None
        if response.status_code != 200:
            raise PlatformUnavailableError(f"the platform answered HTTP {response.status_code}")
        try:
            body = response.json()
            scopes, tenant = body["scopes"], body.get("tenant_name")
        except (ValueError, KeyError, TypeError) as exc:
            raise PlatformUnavailableError("the platform answered something that is not a token description") from exc
        if not isinstance(scopes, list) or INFERENCE_SCOPE not in scopes:
            return None
        return KeyIdentity(key_id=key_digest(key)[:12], tenant=tenant if isinstance(tenant, str) else None)

    async def aclose(self) -> None:
        await self._http.aclose()


class ApiKeyVerifier:
    """Decides whether an OpenAI request's API key is valid (see the module docstring)."""

    def __init__(
        self,
        *,
        digests: frozenset[str],
        platform: KeyChecker | None,
        clock: Clock,
        cache_sec: float,
        max_cached: int = 10_000,
        max_in_flight_per_key: int | None = MAX_IN_FLIGHT_PER_KEY,
        max_in_flight_per_tenant: int | None = None,
    ) -> None:
        self._digests = tuple(sorted(digests))
        self._platform = platform
        self._clock = clock
        self._cache: TtlCache[str, KeyIdentity] = TtlCache(ttl_sec=cache_sec, max_entries=max_cached)
        self._refused: TtlCache[str, bool] = TtlCache(ttl_sec=REFUSED_CACHE_SEC, max_entries=max_cached)
        self._checks = asyncio.Semaphore(PLATFORM_CHECKS_AT_ONCE)
        self._cache_sec = cache_sec
        self.max_in_flight_per_key = max_in_flight_per_key
        """``None``: no share per key (it would be the whole pool: the admission gate's bound answers instead)."""
        self._in_flight: dict[str, int] = {}
        self.max_in_flight_per_tenant = max_in_flight_per_tenant
        """The most requests the keys of one platform tenant may have handled at once (``None``: no share per
        tenant); keys without a tenant (configured keys, tenant-less tokens) are the operator's and not counted."""
        self._tenant_in_flight: dict[str, int] = {}
        self.platform_checks = 0
        """Keys asked of the platform since start (each one request to it)."""

    @property
    def configured(self) -> bool:
        return bool(self._digests) or self._platform is not None

    async def verify(self, authorization: str | None) -> KeyIdentity:
        """The key's identity when it is valid; raise :class:`AuthenticationError` or a 503 otherwise."""
        if not self.configured:
            raise AuthenticationError(
                "no API key is configured on this Coordinator (HETEROFLOW_COORDINATOR_API_KEY_HASHES or "
                "HETEROFLOW_COORDINATOR_PLATFORM_URL); every request is refused"
            )
        key = bearer_value(authorization)
        if key is None:
            raise AuthenticationError("an API key is required (Authorization: Bearer <key>)")
        digest = key_digest(key)
        if self._listed(digest):
            return KeyIdentity(key_id=digest[:12], tenant=None)
        if self._platform is not None:
            identity = await self._platform_identity(self._platform, key, digest)
            if identity is not None:
                return identity
        raise AuthenticationError("invalid API key")

    def now(self) -> float:
        """The verifier's clock, monotonic seconds."""
        return self._clock.monotonic()

    def holds_valid(self, authorization: str | None) -> bool:
        """Whether the request's key is one this Coordinator holds as valid in memory (listed, or accepted by the
        platform within the cache time): never throttled for its address."""
        key = bearer_value(authorization)
        if key is None:
            return False
        digest = key_digest(key)
        return self._listed(digest) or self._cache.get(digest, now=self._clock.monotonic()) is not None

    def enter(self, identity: KeyIdentity) -> bool:
        """Take one of the key's in-flight slots, and one of its tenant's (False: it has
        :attr:`max_in_flight_per_key` already, or its tenant :attr:`max_in_flight_per_tenant`)."""
        held = self._in_flight.get(identity.key_id, 0)
        if self.max_in_flight_per_key is not None and held >= self.max_in_flight_per_key:
            return False
        tenant = identity.tenant
        if tenant is not None and self.max_in_flight_per_tenant is not None:
            tenant_held = self._tenant_in_flight.get(tenant, 0)
            if tenant_held >= self.max_in_flight_per_tenant:
                return False
            self._tenant_in_flight[tenant] = tenant_held + 1
        self._in_flight[identity.key_id] = held + 1
        return True

    def tenant_held(self, identity: KeyIdentity) -> int:
        """Requests the keys of ``identity``'s tenant have handled now (0 without a tenant)."""
        return self._tenant_in_flight.get(identity.tenant, 0) if identity.tenant is not None else 0

    def leave(self, identity: KeyIdentity) -> None:
        held = self._in_flight.get(identity.key_id, 0) - 1
        if held > 0:
            self._in_flight[identity.key_id] = held
        else:
            self._in_flight.pop(identity.key_id, None)
        tenant = identity.tenant
        if tenant is not None and self.max_in_flight_per_tenant is not None:
            tenant_held = self._tenant_in_flight.get(tenant, 0) - 1
            if tenant_held > 0:
                self._tenant_in_flight[tenant] = tenant_held
            else:
                self._tenant_in_flight.pop(tenant, None)

    def _listed(self, digest: str) -> bool:
        found = False
        for known in self._digests:  # no early exit: the time taken says nothing about the list
            found |= hmac.compare_digest(digest, known)
        return found

    async def _platform_identity(self, platform: KeyChecker, key: str, digest: str) -> KeyIdentity | None:
        now = self._clock.monotonic()
        if self._cache_sec > 0:
            cached = self._cache.get(digest, now=now)
            if cached is not None:
                return cached
        if self._refused.get(digest, now=now):
            return None
        async with self._checks:
            self.platform_checks += 1
            try:
                identify = getattr(platform, "identify", None)
                if identify is not None:
                    identity: KeyIdentity | None = await identify(key)
                else:
                    identity = KeyIdentity(key_id=digest[:12], tenant=None) if await platform.accepts(key) else None
            except PlatformUnavailableError as exc:
                _log.warning("coordinator.platform_auth_unavailable", detail=str(exc))
                raise AuthBackendUnavailableError(
                    f"the API key could not be checked: {exc}; try again shortly", retry_after=1
                ) from exc
        if identity is not None:
            self._cache.put(digest, identity, now=now)
        else:
            self._cache.discard(digest)
            self._refused.put(digest, True, now=now)
        return identity

    async def aclose(self) -> None:
        if self._platform is not None:
            await self._platform.aclose()


Message = MutableMapping[str, Any]
AsgiScope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[AsgiScope, Receive, Send], Awaitable[None]]


def _client_keys(scope: AsgiScope, authorization: str | None) -> tuple[str, ...]:
    """The client keys a request's 401 counts under: its peer address and its key's id; none for a request without
    a key (it guesses nothing and costs no platform check: neither counted nor blocked)."""
    key = bearer_value(authorization)
    if key is None:
        return ()
    client = scope.get("client")
    address = address_key(str(client[0]) if client else None)
    keys = [address] if address is not None else []
    keys.append(credential_key(key_digest(key)))
    return tuple(keys)


class KeyFirst:
    """ASGI middleware: an OpenAI request's key is verified before anything else runs (admission, body read),
    and holds one of its key's in-flight slots until its answer ends. ``routes`` maps the OpenAI paths to their
    metric label; answered requests are counted by tenant in ``registry``, and each refusal is passed to
    ``on_refused`` (route label, error)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        verifier: ApiKeyVerifier,
        routes: dict[str, str],
        registry: CollectorRegistry | None = None,
        retry_after_sec: int = 1,
        on_refused: Callable[[str, CoordinatorError], None] | None = None,
        failures: FailedCredentials | None = None,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.failures = failures
        """401s per address and key (:mod:`heteroflow.core.auth_failures`); ``None``: not counted."""
        self.routes = routes
        self.retry_after_sec = retry_after_sec
        self.on_refused = on_refused
        self.requests = (
            Counter(
                "heteroflow_coordinator_key_requests",
                "Answered OpenAI requests by the key's tenant ('-': none, or no valid key), route and HTTP status.",
                ["tenant", "route", "status"],
                registry=registry,
            )
            if registry is not None
            else None
        )

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        route = self.routes.get(str(scope.get("path", ""))) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        authorization = next(
            (value.decode("latin-1") for name, value in scope.get("headers", ()) if name.lower() == b"authorization"),
            None,
        )
        failures = self.failures
        keys: tuple[str, ...] = ()
        if failures is not None and not failures.quiet and not self.verifier.holds_valid(authorization):
            keys = _client_keys(scope, authorization)
            wait = failures.retry_after(keys, now=self.verifier.now())
            if wait is not None:  # before any key check: a guessing client costs no platform request
                throttled = KeyThrottledError(
                    f"too many requests with a refused API key; retry in {wait} s", retry_after=wait
                )
                await self._refuse(scope, receive, send, throttled, None, route, started)
                return
        try:
            identity = await self.verifier.verify(authorization)
        except CoordinatorError as exc:
            if failures is not None and isinstance(exc, AuthenticationError):
                self._note_failure(failures, keys or _client_keys(scope, authorization), route)
            await self._refuse(scope, receive, send, exc, None, route, started)
            return
        if not self.verifier.enter(identity):
            tenant_limit = self.verifier.max_in_flight_per_tenant
            whose = (
                f"the API keys of this key's tenant have {tenant_limit}"
                if tenant_limit is not None and self.verifier.tenant_held(identity) >= tenant_limit
                else f"this API key has {self.verifier.max_in_flight_per_key}"
            )
            busy = KeyBusyError(f"{whose} requests in flight; retry later", retry_after=self.retry_after_sec)
            await self._refuse(scope, receive, send, busy, identity, route, started)
            return
        status = 500

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            self.verifier.leave(identity)
            self._answered(identity, route, status, started)

    def _note_failure(self, failures: FailedCredentials, keys: tuple[str, ...], route: str) -> None:
        """Count a 401; log it only as the key's first of its window or the one that blocks it."""
        if not keys:
            return
        line = failures.fail(keys, now=self.verifier.now())
        if line == "first":
            _log.info("coordinator.key_refused", keys=list(keys), route=route)
        elif line == "blocked":
            _log.warning(
                "coordinator.key_blocked",
                keys=list(keys),
                failures=failures.max_failures,
                window_sec=failures.window_sec,
            )

    async def _refuse(
        self,
        scope: AsgiScope,
        receive: Receive,
        send: Send,
        exc: CoordinatorError,
        identity: KeyIdentity | None,
        route: str,
        started: float,
    ) -> None:
        response = openai_error_response(exc)
        response.headers["connection"] = "close"  # the body the client may still be sending is never read
        await response(scope, receive, send)
        if self.on_refused is not None:
            self.on_refused(route, exc)
        self._answered(identity, route, exc.status_code, started)

    def _answered(self, identity: KeyIdentity | None, route: str, status: int, started: float) -> None:
        if self.requests is not None:
            tenant = identity.tenant if identity is not None and identity.tenant else "-"
            self.requests.labels(tenant=tenant, route=route, status=str(status)).inc()
        _log.info(
            "coordinator.access",
            route=route,
            status=status,
            tenant=identity.tenant if identity is not None else None,
            key_id=identity.key_id if identity is not None else None,
            seconds=round(time.perf_counter() - started, 4),
        )
