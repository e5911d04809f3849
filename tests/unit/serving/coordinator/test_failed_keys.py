"""Guessing API keys costs the guesser: after ``max_failed_keys`` 401s an address (or a key) is answered 429 with
Retry-After before the key is checked against the platform; a valid key from that address is still served."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from heteroflow.serving.coordinator.assembly import create_app
from heteroflow.serving.coordinator.auth import KeyIdentity
from heteroflow.serving.coordinator.service import Coordinator
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.coordinator.testing import TEST_CLUSTER_TOKEN, FakePlatform

pytestmark = pytest.mark.timeout(20)


def test_an_address_past_its_failures_is_throttled_before_the_platform_is_asked() -> None:
    platform = FakePlatform(valid={"hf_good"})
    settings = CoordinatorSettings.load(cluster_token=TEST_CLUSTER_TOKEN, max_failed_keys=5)
    coordinator = Coordinator(settings=settings, key_checker=platform)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=create_app(coordinator), client=("10.1.2.3", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://coord") as client:
            assert (await client.get("/v1/models", headers={"Authorization": "Bearer hf_good"})).status_code == 200
            guesses = [
                (await client.get("/v1/models", headers={"Authorization": f"Bearer hf_guess_{n}"})).status_code
                for n in range(5)
            ]
            assert guesses == [401] * 5
            asked = platform.calls
            throttled = [
                await client.get("/v1/models", headers={"Authorization": f"Bearer hf_x{n}"}) for n in range(50)
            ]
            assert {answer.status_code for answer in throttled} == {429}
            assert throttled[0].json()["error"]["type"] == "RateLimitError"
            assert 1 <= int(throttled[0].headers["retry-after"]) <= 60
            assert platform.calls == asked  # no platform check per guess
            # the valid key, held in memory, is never refused for the address it shares with the guesser
            assert (await client.get("/v1/models", headers={"Authorization": "Bearer hf_good"})).status_code == 200
        status = coordinator.failed_keys.status(now=coordinator.clock.monotonic())
        assert (status.refused_total, status.blocked_keys) == (50, 1)
        assert status.logged_total <= 2  # the address's first 401 and its block: never a line per guess
        text = coordinator.metrics.render().decode()
        assert 'heteroflow_coordinator_requests_total{outcome="key_throttled",route="models"} 50.0' in text
        await coordinator.aclose()

    asyncio.run(scenario())


def test_the_keys_of_one_tenant_share_a_bounded_part_of_the_pool() -> None:
    settings = CoordinatorSettings.load(
        cluster_token=TEST_CLUSTER_TOKEN, max_concurrent_requests=10, max_in_flight_per_tenant=3
    )
    keys = Coordinator(settings=settings, key_checker=FakePlatform()).keys
    a1, a2 = KeyIdentity(key_id="a1", tenant="team-a"), KeyIdentity(key_id="a2", tenant="team-a")
    b, fleet = KeyIdentity(key_id="b", tenant="team-b"), KeyIdentity(key_id="ops", tenant=None)
    assert [keys.enter(a1), keys.enter(a1), keys.enter(a2), keys.enter(a2)] == [True, True, True, False]
    assert keys.tenant_held(a2) == 3
    assert [keys.enter(b) for _ in range(3)] == [True, True, True]  # the other tenant keeps its share
    assert all(keys.enter(fleet) for _ in range(5))  # keys without a tenant are the operator's: not counted
    keys.leave(a1)
    assert keys.enter(a2)  # the tenant's place came back
    assert keys.tenant_held(fleet) == 0


def test_a_tenant_share_as_large_as_the_pool_is_no_share() -> None:
    settings = CoordinatorSettings.load(cluster_token=TEST_CLUSTER_TOKEN, max_concurrent_requests=10)
    assert settings.max_in_flight_per_tenant == 500  # the default, beyond this pool
    assert Coordinator(settings=settings).keys.max_in_flight_per_tenant is None
