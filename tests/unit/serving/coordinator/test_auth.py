"""API keys (hashed list, platform check with cache) and the cluster token."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from heteroflow.core.testing import FakeClock
from heteroflow.http.peer import Unavailable
from heteroflow.platform.auth import bearer_value
from heteroflow.serving.coordinator.auth import (
    PLATFORM_CHECK_PATH,
    REFUSED_CACHE_SEC,
    ApiKeyVerifier,
    KeyIdentity,
    PlatformKeyChecker,
    PlatformUnavailableError,
    cluster_token_matches,
    key_digest,
)
from heteroflow.serving.coordinator.errors import AuthBackendUnavailableError, AuthenticationError
from heteroflow.serving.coordinator.testing import TEST_API_KEY, TEST_API_KEY_SHA256, FakePlatform

pytestmark = pytest.mark.timeout(10)


def verifier(
    *, digests: frozenset[str] = frozenset(), platform: FakePlatform | None = None, clock: FakeClock | None = None
) -> ApiKeyVerifier:
    return ApiKeyVerifier(digests=digests, platform=platform, clock=clock or FakeClock(), cache_sec=30.0)


def test_the_shipped_test_digest_is_the_test_key_s() -> None:
    assert key_digest(TEST_API_KEY) == TEST_API_KEY_SHA256


@pytest.mark.parametrize(
    ("header", "value"),
    [("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None), ("Bearer ", None), (None, None)],
)
def test_bearer_value(header: str | None, value: str | None) -> None:
    assert bearer_value(header) == value


def test_cluster_token_is_compared_exactly() -> None:
    assert cluster_token_matches("Bearer s3cret", "s3cret")
    assert not cluster_token_matches("Bearer s3cre", "s3cret")
    assert not cluster_token_matches("Bearer s3cret2", "s3cret")
    assert not cluster_token_matches("s3cret", "s3cret")
    assert not cluster_token_matches(None, "s3cret")


def test_no_key_source_refuses_everyone() -> None:
    keys = verifier()
    assert not keys.configured
    with pytest.raises(AuthenticationError, match="no API key is configured"):
        asyncio.run(keys.verify(f"Bearer {TEST_API_KEY}"))


@pytest.mark.parametrize(
    ("header", "message"),
    [(None, "an API key is required"), ("Basic x", "an API key is required"), ("Bearer wrong", "invalid API key")],
)
def test_missing_or_wrong_keys_are_refused(header: str | None, message: str) -> None:
    keys = verifier(digests=frozenset({TEST_API_KEY_SHA256}))
    with pytest.raises(AuthenticationError, match=message) as caught:
        asyncio.run(keys.verify(header))
    assert caught.value.status_code == 401


def test_a_listed_key_is_accepted_without_asking_the_platform() -> None:
    platform = FakePlatform()
    keys = verifier(digests=frozenset({TEST_API_KEY_SHA256, "0" * 64}), platform=platform)
    asyncio.run(keys.verify(f"Bearer {TEST_API_KEY}"))
    assert platform.calls == 0


def test_a_platform_key_is_cached_until_the_time_to_live_passes() -> None:
    clock = FakeClock()
    platform = FakePlatform(valid={"hf_good"})
    keys = verifier(platform=platform, clock=clock)

    async def scenario() -> None:
        await keys.verify("Bearer hf_good")
        await keys.verify("Bearer hf_good")
        assert platform.calls == 1
        clock.advance(31)
        await keys.verify("Bearer hf_good")
        assert platform.calls == 2
        platform.valid.clear()  # revoked: known once the cached answer expired
        clock.advance(31)
        with pytest.raises(AuthenticationError, match="invalid API key"):
            await keys.verify("Bearer hf_good")

    asyncio.run(scenario())


def test_refusals_are_remembered_briefly_so_random_keys_cannot_amplify_into_platform_queries() -> None:
    clock = FakeClock()
    platform = FakePlatform()
    keys = verifier(platform=platform, clock=clock)

    async def scenario() -> None:
        for _ in range(50):
            with pytest.raises(AuthenticationError):
                await keys.verify("Bearer hf_wrong")
        assert platform.calls == 1
        platform.valid.add("hf_wrong")
        clock.advance(REFUSED_CACHE_SEC + 1)  # the refusal expires: a key created since then works
        await keys.verify("Bearer hf_wrong")
        assert platform.calls == 2

    asyncio.run(scenario())


def test_an_unreachable_platform_is_503_not_401() -> None:
    platform = FakePlatform(valid={"hf_good"})
    platform.down = True
    keys = verifier(platform=platform)
    with pytest.raises(AuthBackendUnavailableError) as caught:
        asyncio.run(keys.verify("Bearer hf_good"))
    assert caught.value.status_code == 503
    assert caught.value.retry_after == 1


def platform_checker(answer: Callable[[httpx.Request], httpx.Response]) -> PlatformKeyChecker:
    return PlatformKeyChecker(base_url="http://platform", timeout_sec=1.0, transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(
    ("status", "body", "identity"),
    [
        (200, {"scopes": ["inference"], "tenant_name": "team-a"}, KeyIdentity(key_id="", tenant="team-a")),
        (200, {"scopes": ["inference"], "tenant_name": None}, KeyIdentity(key_id="", tenant=None)),
        (200, {"scopes": ["agent"], "tenant_name": None}, None),  # an agent's token is no API key
        (200, {"scopes": ["metrics:read", "nodes:read"]}, None),
        (200, {"scopes": ["admin"]}, None),  # nor is an operator's
        (401, {}, None),
        (403, {}, None),
    ],
)
def test_only_a_platform_token_with_the_inference_scope_is_an_api_key(
    status: int, body: dict[str, Any], identity: KeyIdentity | None
) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=body)

    async def scenario() -> None:
        checker = platform_checker(answer)
        found = await checker.identify("hf_x")
        assert (found.tenant if found else None, found is None) == (
            identity.tenant if identity else None,
            identity is None,
        )
        assert await checker.accepts("hf_x") is (identity is not None)
        await checker.aclose()

    asyncio.run(scenario())
    assert seen[0].url.path == PLATFORM_CHECK_PATH
    assert seen[0].headers["authorization"] == "Bearer hf_x"


def test_one_key_holds_at_most_its_share_of_requests_in_flight() -> None:
    keys = verifier(digests=frozenset({TEST_API_KEY_SHA256}))
    keys.max_in_flight_per_key = 2
    mine = asyncio.run(keys.verify(f"Bearer {TEST_API_KEY}"))
    other = KeyIdentity(key_id="another", tenant=None)
    assert keys.enter(mine)
    assert keys.enter(mine)
    assert not keys.enter(mine)
    assert keys.enter(other)  # another key is not affected
    keys.leave(mine)
    assert keys.enter(mine)


@pytest.mark.parametrize("failure", ["status", "connect"])
def test_the_platform_checker_cannot_tell_on_errors(failure: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if failure == "connect":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(500)

    async def scenario() -> None:
        checker = platform_checker(answer)
        with pytest.raises(PlatformUnavailableError):
            await checker.accepts("hf_x")
        await checker.aclose()

    asyncio.run(scenario())


def test_each_check_carries_the_key_it_asks_about_over_one_pooled_client() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"scopes": ["inference"]})

    async def scenario() -> None:
        checker = platform_checker(answer)
        for key in ("hf_a", "hf_b"):
            assert await checker.accepts(key)
        await checker.aclose()

    asyncio.run(scenario())
    assert [r.headers["authorization"] for r in seen] == ["Bearer hf_a", "Bearer hf_b"]


def test_a_platform_that_cannot_tell_is_unavailable_in_the_http_layers_terms() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def scenario() -> None:
        checker = platform_checker(refuse)
        with pytest.raises(Unavailable, match="the platform could not be reached: ConnectError"):
            await checker.identify("hf_x")
        await checker.aclose()

    asyncio.run(scenario())
