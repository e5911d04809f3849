"""Who may call the Coordinator.

- Management routes and ``/metrics``: the cluster token (``Authorization: Bearer <token>``), compared in
  constant time. No token configured → refused (401), never open.
- OpenAI routes: an API key (``Authorization: Bearer <key>``, as OpenAI clients send it), valid when its
  sha256 is one of ``api_key_hashes`` or when the HeteroFlow platform accepts it. No key source configured →
  every request refused (401): a Coordinator never serves anonymously by accident.

The platform has no "who am I" route; its cheapest authenticated GET is ``/healthz`` (any valid token, 200),
so a key is valid when ``GET {platform_url}/healthz`` answers 200 with it, invalid on 401/403, and anything
else (unreachable, timeout, 5xx) means "cannot tell" → 503 for that request. Accepted keys are remembered by
their sha256 for ``platform_token_cache_sec``; refusals are not remembered, so a token created a second ago
works at once (the platform, not the Coordinator, throttles guessing).

Keys and tokens are never logged nor kept in clear: the cache is keyed by digest.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol

import httpx
import structlog

from heteroflow.core.clock import Clock
from heteroflow.core.ttl_cache import TtlCache
from heteroflow.platform.auth import bearer_matches, bearer_value
from heteroflow.serving.coordinator.errors import AuthBackendUnavailableError, AuthenticationError

_log = structlog.get_logger(__name__)

PLATFORM_CHECK_PATH = "/healthz"
"""Authenticated route of the platform server that answers 200 to any valid token (``server/routes/ops.py``)."""


cluster_token_matches = bearer_matches
"""The management routes' check: ``Authorization: Bearer <cluster token>``."""


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class PlatformUnavailableError(Exception):
    """The platform did not give a yes or no about a key."""


class KeyChecker(Protocol):
    """An outside authority on API keys (the platform server, or a fake in tests)."""

    async def accepts(self, key: str) -> bool:
        """True for a valid key, False for an invalid one; raises :class:`PlatformUnavailableError` otherwise."""
        ...

    async def aclose(self) -> None: ...


class PlatformKeyChecker:
    """Asks the platform server whether a bearer token is one of its API tokens."""

    def __init__(self, *, base_url: str, timeout_sec: float, transport: httpx.AsyncBaseTransport | None = None):
        self._client = httpx.AsyncClient(base_url=base_url, timeout=timeout_sec, transport=transport)

    async def accepts(self, key: str) -> bool:
        try:
            response = await self._client.get(PLATFORM_CHECK_PATH, headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError as exc:
            raise PlatformUnavailableError(f"the platform could not be reached: {type(exc).__name__}") from exc
        if response.status_code == 200:
            return True
        if response.status_code in (401, 403):
            return False
        raise PlatformUnavailableError(f"the platform answered HTTP {response.status_code}")

    async def aclose(self) -> None:
        await self._client.aclose()


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
    ) -> None:
        self._digests = tuple(sorted(digests))
        self._platform = platform
        self._clock = clock
        self._cache: TtlCache[str, bool] = TtlCache(ttl_seconds=cache_sec, max_entries=max_cached)
        self._cache_sec = cache_sec

    @property
    def configured(self) -> bool:
        return bool(self._digests) or self._platform is not None

    async def verify(self, authorization: str | None) -> None:
        """Return when the key is valid; raise :class:`AuthenticationError` or a 503 otherwise."""
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
            return
        if self._platform is not None and await self._platform_accepts(self._platform, key, digest):
            return
        raise AuthenticationError("invalid API key")

    def _listed(self, digest: str) -> bool:
        found = False
        for known in self._digests:  # no early exit: the time taken says nothing about the list
            found |= hmac.compare_digest(digest, known)
        return found

    async def _platform_accepts(self, platform: KeyChecker, key: str, digest: str) -> bool:
        now = self._clock.monotonic()
        if self._cache_sec > 0 and self._cache.get(digest, now=now):
            return True
        try:
            accepted = await platform.accepts(key)
        except PlatformUnavailableError as exc:
            _log.warning("coordinator.platform_auth_unavailable", detail=str(exc))
            raise AuthBackendUnavailableError(
                f"the API key could not be checked: {exc}; try again shortly", retry_after=1
            ) from exc
        if accepted:
            self._cache.put(digest, True, now=now)
        else:
            self._cache.discard(digest)
        return accepted

    async def aclose(self) -> None:
        if self._platform is not None:
            await self._platform.aclose()
