"""One key's share of the Coordinator (``max_in_flight_per_key``) meets the hold: a request held while its
model's endpoints are withdrawn counts against its key, as it counts against ``max_concurrent_requests``."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest

from heteroflow.serving.coordinator.testing import TEST_API_KEY_SHA256
from tests.support.polling import IN_PROCESS_SEC, eventually
from tests.unit.serving.coordinator.test_app import KEY, harness, run

pytestmark = pytest.mark.timeout(20)

OTHER_KEY = "coordinator-test-other-key"
OTHER = {"Authorization": f"Bearer {OTHER_KEY}"}
BOTH_KEYS = f"{TEST_API_KEY_SHA256},{hashlib.sha256(OTHER_KEY.encode()).hexdigest()}"


def test_held_requests_take_their_key_s_share_and_leave_the_other_keys_theirs() -> None:
    async def scenario() -> None:
        async with harness(
            api_key_hashes=BOTH_KEYS, max_in_flight_per_key=2, unavailable_wait_sec=10.0, retry_after_sec=3
        ) as h:
            await h.publish((0, 1))
            await h.withdraw((0, 1))
            held = [asyncio.create_task(h.complete()) for _ in range(2)]
            await eventually(
                lambda: h.coordinator.status().waiting_for_publication == 2,
                within=5,
                period=IN_PROCESS_SEC,
                what="two requests held",
            )

            busy = await h.client.post("/v1/completions", headers=KEY, content=b"not even read")
            assert busy.status_code == 503
            assert busy.headers["retry-after"] == "3"
            assert "this API key has 2 requests in flight" in busy.json()["error"]["message"]
            assert h.metric('heteroflow_coordinator_requests_total{outcome="key_busy",route="completions"}') == 1
            assert h.metric('heteroflow_coordinator_requests_total{outcome="overloaded",route="completions"}') == 0

            other = asyncio.create_task(
                h.client.post("/v1/completions", headers=OTHER, json={"model": "m", "prompt": "hello"})
            )
            await eventually(
                lambda: h.coordinator.status().waiting_for_publication == 3,
                within=5,
                period=IN_PROCESS_SEC,
                what="the other key held",
            )
            await h.publish((0, 1))
            answers: list[httpx.Response] = await asyncio.gather(*held, other)
            assert [a.status_code for a in answers] == [200, 200, 200]
            assert (await h.complete()).status_code == 200  # the key's share came back with its answers

    run(scenario)


def test_a_share_as_large_as_the_pool_is_no_share_and_the_full_coordinator_answers_overloaded() -> None:
    async def scenario() -> None:
        async with harness(max_in_flight_per_key=2, max_concurrent_requests=2, unavailable_wait_sec=10.0) as h:
            await h.publish((0,))
            await h.withdraw((0,))
            held = [asyncio.create_task(h.complete()) for _ in range(2)]
            await eventually(
                lambda: h.coordinator.status().waiting_for_publication == 2,
                within=5,
                period=IN_PROCESS_SEC,
                what="two requests held",
            )
            full = await h.client.post("/v1/completions", headers=KEY, content=b"not even read")
            assert full.status_code == 503
            assert "as many requests as it is configured for" in full.json()["error"]["message"]
            assert h.metric('heteroflow_coordinator_requests_total{outcome="overloaded",route="completions"}') == 1
            assert h.metric('heteroflow_coordinator_requests_total{outcome="key_busy",route="completions"}') == 0
            await h.publish((0,))
            assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]

    run(scenario)
