"""The Coordinator's bodies through the platform's shared body middleware, after the caller is verified: a valid
key's slow body is cut off with 408 within the read limit, an oversize one is 413, and no engine sees either; one
address holds at most its share of in-flight requests (429); a management body is read only after the cluster
token."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

from heteroflow.contracts.serving import COORDINATOR_SET_PATH
from tests.unit.serving.coordinator.test_app import KEY, MANAGE, _Body, harness, run

pytestmark = pytest.mark.timeout(20)

READ_LIMIT_SEC = 0.5


async def trickle(first: bytes, *, every_sec: float, stop: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    """``first``, then a byte every ``every_sec`` (a slow sender) until ``stop`` is set, then the body's end."""
    yield first
    for _ in range(200):  # bounded: 200 bytes
        if stop is not None and stop.is_set():
            break
        await asyncio.sleep(every_sec)  # the sender's pace, the attack itself
        yield b" "
    yield b'"}'


def test_a_valid_keys_slow_body_is_cut_off_with_408_and_reaches_no_engine() -> None:
    async def scenario() -> None:
        async with harness(body_read_timeout_sec=READ_LIMIT_SEC) as h:
            await h.publish((0, 1))
            started = time.monotonic()
            response = await h.client.post(
                "/v1/completions",
                headers={**KEY, "content-type": "application/json"},
                content=_Body(trickle(b'{"model": "m", "prompt": "', every_sec=0.1)),
            )
            elapsed = time.monotonic() - started
            assert response.status_code == 408, response.text
            assert "did not arrive within 0.5 s" in response.json()["error"]["message"]
            assert response.json()["error"]["type"] == "RequestTimeoutError"
            assert response.headers["connection"] == "close"
            assert READ_LIMIT_SEC <= elapsed < READ_LIMIT_SEC + 2, elapsed
            assert h.upstreams.total_received() == 0
            assert h.metric('heteroflow_coordinator_requests_total{outcome="body_timeout",route="completions"}') == 1
            assert (await h.complete()).status_code == 200  # the next request is served as ever

    run(scenario)


@pytest.mark.parametrize("declared", [True, False])
def test_a_valid_keys_oversize_body_is_413_and_reaches_no_engine(declared: bool) -> None:
    async def scenario() -> None:
        async with harness(max_body_bytes=4096) as h:
            await h.publish((0,))
            raw = json.dumps({"model": "m", "prompt": "x" * 10_000}).encode()

            async def chunked() -> AsyncIterator[bytes]:
                for start in range(0, len(raw), 1000):
                    yield raw[start : start + 1000]

            content: bytes | _Body = raw if declared else _Body(chunked())
            response = await h.client.post("/v1/chat/completions", headers=KEY, content=content)
            assert response.status_code == 413, response.text
            assert "larger than 4096 bytes" in response.json()["error"]["message"]
            assert h.upstreams.total_received() == 0

    run(scenario)


def test_one_address_holds_at_most_its_share_and_the_excess_is_429_with_retry_after() -> None:
    async def scenario() -> None:
        async with harness(max_in_flight_per_peer=1, retry_after_sec=3) as h:
            await h.publish((0,))
            release = asyncio.Event()
            held = asyncio.create_task(
                h.client.post(
                    "/v1/completions",
                    headers=KEY,
                    content=_Body(trickle(b'{"model": "m", "prompt": "', every_sec=0.01, stop=release)),
                )
            )
            deadline = time.monotonic() + 5
            while h.coordinator.peer_limit.status().clients == 0:  # the held request has its place
                assert time.monotonic() < deadline, "the held request never started"
                await asyncio.sleep(0.005)
            refused = await h.complete()
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "3"
            assert refused.json()["error"]["type"] == "RateLimitError"
            assert "1 requests in flight" in refused.json()["error"]["message"]
            release.set()
            assert (await held).status_code == 200
            assert (await h.complete()).status_code == 200  # the place came back
            assert h.metric('heteroflow_coordinator_requests_total{outcome="limited",route="completions"}') == 1
            assert h.coordinator.peer_limit.status().refused_total == 1

    run(scenario)


def test_a_management_body_is_read_only_after_the_cluster_token_and_is_bounded_in_time() -> None:
    async def scenario() -> None:
        async with harness(body_read_timeout_sec=READ_LIMIT_SEC) as h:
            started = time.monotonic()
            anonymous = await h.client.post(
                COORDINATOR_SET_PATH, content=_Body(trickle(b'{"instance_id": "', every_sec=0.1))
            )
            assert anonymous.status_code == 401, anonymous.text
            assert anonymous.json()["error"] == "unauthorized"
            assert time.monotonic() - started < READ_LIMIT_SEC  # refused on its head, the body unread
            slow = await h.client.post(
                COORDINATOR_SET_PATH, headers=MANAGE, content=_Body(trickle(b'{"instance_id": "', every_sec=0.1))
            )
            assert slow.status_code == 408, slow.text
            assert slow.json()["error"] == "body_timeout"
            assert h.coordinator.views.snapshot() == ()

    run(scenario)


def test_the_per_key_bound_is_a_setting() -> None:
    async def scenario() -> None:
        async with harness(max_in_flight_per_key=2) as h:
            assert h.coordinator.keys.max_in_flight_per_key == 2

    run(scenario)
