"""Conformance checks of the profile ``vllm-released``: the observed list of ``engine-protocol.md``.

The same checks run against the simulator speaking that profile (``tests/unit/engine_sim``) and against two
real vLLM ranks (``tests/vllm``); they raise :class:`~heteroflow.engine_sim.conformance.ConformanceError` on
the first deviation.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx

from heteroflow.contracts.engine_protocol import SCALE_DOWN, VLLM_RELEASED, parse_status_response, select_engine
from heteroflow.engine_sim.conformance import DEAD_WITHIN, ConformanceError, expect


class ReleasedHarness(Protocol):
    """Two ranks of one instance speaking ``vllm-released``: the simulator's or real vLLM's (``tests/vllm``).

    ``client(rank)`` carries the engine's API key; the checks send a wrong one where they test openness."""

    dp_size: int

    def client(self, rank: int) -> httpx.AsyncClient: ...

    async def eventually(self, check: Callable[[], Awaitable[bool]], *, within: float, what: str) -> None: ...

    async def kill_worker(self, rank: int) -> None:
        """Kill the rank's own worker process (the model runner), leaving its API server and engine core."""
        ...


RELEASED = VLLM_RELEASED
RELEASED_ENTRY_KEYS = set(RELEASED.status_fields)
WRONG_KEY = {"Authorization": "Bearer not-the-key"}


async def released_status(h: ReleasedHarness, rank: int) -> dict[str, Any]:
    """The rank's entry from the un-prefixed route, which needs no key; checked against the released shape."""
    resp = await h.client(rank).get(RELEASED.status_path, headers=WRONG_KEY, timeout=5.0)
    expect(resp.status_code == 200, f"status of rank {rank} without the key: HTTP {resp.status_code} {resp.text}")
    body = resp.json()
    expect(set(body) == {"schema_version", "total_engines", "engines"}, f"status keys of rank {rank}: {sorted(body)}")
    entry = select_engine(parse_status_response(body), endpoint_id=rank)
    raw: dict[str, Any] = body["engines"][0]
    expect(set(raw) <= RELEASED_ENTRY_KEYS, f"released status has no mask/ft_state: {raw}")
    expect(("fault_info" in raw) == (entry.status == "unhealthy"), f"fault_info only while unhealthy: {raw}")
    return raw


async def released_apply(
    h: ReleasedHarness, rank: int, content: bytes, *, media: str = "application/json"
) -> httpx.Response:
    return await h.client(rank).post(
        RELEASED.apply_path, content=content, headers={**WRONG_KEY, "content-type": media}, timeout=10.0
    )


def _vllm_error(resp: httpx.Response, message: str) -> None:
    expect(resp.status_code == 400, f"expected 400 {message!r}, got HTTP {resp.status_code} {resp.text}")
    expect(
        resp.json() == {"error": {"message": message, "type": "Bad Request", "param": None, "code": 400}},
        f"vLLM's error body with {message!r}: {resp.text}",
    )


async def released_routes_and_errors(h: ReleasedHarness, rank: int) -> None:
    """Un-prefixed, open FT routes; ``/v1/fault_tolerance/status`` is not one; every 400 as vLLM words it."""
    entry = await released_status(h, rank)
    expect(entry == {"id": rank, "status": "healthy"}, f"fresh released status: {entry}")
    prefixed = await h.client(rank).get(SCALE_DOWN.status_path)
    expect(prefixed.status_code != 200, f"/v1/fault_tolerance/status must not answer: HTTP {prefixed.status_code}")
    expect((await h.client(rank).get("/health")).status_code == 200, "health must be 200")
    cases: tuple[tuple[bytes, str], ...] = (
        (b"[1]", "Request body must be a JSON object."),
        (b"{}", "'instruction' is required."),
        (b'{"instruction": ""}', "'instruction' is required."),
        (b'{"instruction": "scale_down", "params": {}}', "Invalid instruction: 'scale_down'."),
        (b'{"instruction": "explode"}', "Invalid instruction: 'explode'."),
        (b'{"instruction": "retry", "params": null}', "'params' must be an object."),
        (b'{"instruction": "retry", "params": [1]}', "'params' must be an object."),
        (b"{not json", "Invalid JSON format"),
    )
    for content, message in cases:
        _vllm_error(await released_apply(h, rank, content), message)
    _vllm_error(
        await released_apply(h, rank, b"{}", media="text/plain"),
        "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
    )


async def released_rejection_on_healthy(h: ReleasedHarness, rank: int) -> str:
    """A retry on a healthy engine: 202 with the engine's own uuid (ours ignored), then rejected in the status."""
    resp = await released_apply(h, rank, json.dumps({"instruction": "retry", "request_id": "ours"}).encode())
    expect(resp.status_code == 202, f"retry on a healthy engine: HTTP {resp.status_code} {resp.text}")
    body = resp.json()
    expect(set(body) == {"message", "request_id"}, f"202 body keys: {body}")
    expect(body["message"] == RELEASED.accepted_message, f"202 message: {body['message']!r}")
    engine_id = str(body["request_id"])
    expect(engine_id != "ours" and uuid.UUID(engine_id).version == 4, f"the engine's own uuid4: {engine_id!r}")
    want = f"[FT] Rejecting retry on engine {rank}: status is HEALTHY"

    async def rejected() -> bool:
        entry = await released_status(h, rank)
        return entry.get("last_ft_request_id") == engine_id and entry.get("ft_error") == want

    await h.eventually(rejected, within=10.0, what=f"rank {rank} shows the rejection of {engine_id}")
    entry = await released_status(h, rank)
    expect(entry["status"] == "healthy", f"a rejected retry changes nothing: {entry}")
    return engine_id


async def released_completion(h: ReleasedHarness, rank: int, *, within_sec: float = 60.0) -> dict[str, Any]:
    resp = await h.client(rank).post(
        "/v1/completions", json={"prompt": "hello world", "max_tokens": 4, "temperature": 0}, timeout=within_sec
    )
    expect(resp.status_code == 200, f"completion on rank {rank}: HTTP {resp.status_code} {resp.text}")
    choice: dict[str, Any] = resp.json()["choices"][0]
    return choice


async def released_fault(
    h: ReleasedHarness, *, victim: int, survivor: int, hang_probe_sec: float = 3.0
) -> dict[str, float]:
    """Kill ``victim``'s worker; the observed behaviour of both ranks, up to a failed retry on the survivor.

    Returns measured seconds: ``dead_after`` (kill → victim ``dead``), ``retry_failed_after`` (survivor retry
    → its ``ft_error``). Destructive: the ranks are left faulted (the recovery timer runs from the fault)."""
    loop = asyncio.get_running_loop()
    choice = await released_completion(h, survivor)
    expect(choice["finish_reason"] in {"length", "stop"}, f"a healthy instance serves: {choice}")
    started = loop.time()
    await h.kill_worker(victim)

    async def victim_dead() -> bool:
        return bool((await released_status(h, victim))["status"] == "dead")

    await h.eventually(victim_dead, within=DEAD_WITHIN, what=f"rank {victim} dead after its worker was killed")
    dead_after = loop.time() - started
    expect((await released_status(h, survivor))["status"] == "healthy", "an idle survivor stays healthy")
    expect((await h.client(victim).get("/health")).status_code == 200, "/health is liveness: 200 while dead-but-up")

    aborted = await released_completion(h, survivor)
    expect(
        aborted["finish_reason"] == "abort" and aborted["text"] == "",
        f"the survivor's next request ends 200 finish_reason abort with no text: {aborted}",
    )

    async def survivor_unhealthy() -> bool:
        return bool((await released_status(h, survivor))["status"] == "unhealthy")

    await h.eventually(survivor_unhealthy, within=30.0, what=f"rank {survivor} unhealthy after its collective failed")
    entry = await released_status(h, survivor)
    expect(bool(entry.get("fault_info")), f"an unhealthy entry names the fault: {entry}")
    expect((await h.client(survivor).get("/health")).status_code == 200, "/health 200 while unhealthy")
    try:
        # asyncio's bound, not httpx's: an in-process (ASGI) transport ignores httpx timeouts
        late = await asyncio.wait_for(
            h.client(survivor).post("/v1/completions", json={"prompt": "hello", "max_tokens": 2}),
            hang_probe_sec,
        )
    except (TimeoutError, httpx.TimeoutException):
        pass  # a new request to a faulted released engine hangs: no 503
    else:
        raise ConformanceError(f"a new request to a faulted engine must hang, got HTTP {late.status_code} {late.text}")

    resp = await released_apply(h, victim, b'{"instruction": "retry"}')
    expect(resp.status_code == 202, f"retry on the dead rank: HTTP {resp.status_code}")
    dead_id = resp.json()["request_id"]
    want = f"[FT] Rejecting retry on engine {victim}: status is DEAD"

    async def dead_rejected() -> bool:
        e = await released_status(h, victim)
        return e.get("last_ft_request_id") == dead_id and e.get("ft_error") == want

    await h.eventually(dead_rejected, within=10.0, what="the dead rank rejects retry in its status")

    retry_started = loop.time()
    resp = await released_apply(h, survivor, b'{"instruction": "retry", "params": {}}')
    expect(resp.status_code == 202, f"retry on the survivor: HTTP {resp.status_code}")
    retry_id = resp.json()["request_id"]

    async def retry_failed() -> bool:
        e = await released_status(h, survivor)
        return e.get("last_ft_request_id") == retry_id and bool(e.get("ft_error"))

    # its peer is dead, so the rebuild cannot gather every member: the retry fails, the engine stays unhealthy
    await h.eventually(retry_failed, within=60.0, what="the survivor's retry fails with an ft_error")
    retry_failed_after = loop.time() - retry_started
    entry = await released_status(h, survivor)
    expect(entry["status"] == "unhealthy", f"a failed retry leaves the engine unhealthy: {entry}")
    return {"dead_after": dead_after, "retry_failed_after": retry_failed_after}
