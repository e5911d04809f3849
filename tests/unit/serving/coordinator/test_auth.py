"""API keys (hashed list, platform check with cache) and the cluster token."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from heteroflow.core.testing import FakeClock
from heteroflow.serving.coordinator.auth import (
    PLATFORM_CHECK_PATH,
    ApiKeyVerifier,
    PlatformKeyChecker,
    PlatformUnavailableError,
    bearer_value,
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


def test_refusals_are_not_cached() -> None:
    platform = FakePlatform()
    keys = verifier(platform=platform)

    async def scenario() -> None:
        with pytest.raises(AuthenticationError):
            await keys.verify("Bearer hf_new")
        platform.valid.add("hf_new")  # just created on the platform: works at once
        await keys.verify("Bearer hf_new")

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


@pytest.mark.parametrize(("status", "accepted"), [(200, True), (401, False), (403, False)])
def test_the_platform_checker_reads_the_healthz_answer(status: int, accepted: bool) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json={})

    async def scenario() -> None:
        checker = platform_checker(answer)
        assert await checker.accepts("hf_x") is accepted
        await checker.aclose()

    asyncio.run(scenario())
    assert seen[0].url.path == PLATFORM_CHECK_PATH
    assert seen[0].headers["authorization"] == "Bearer hf_x"


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
