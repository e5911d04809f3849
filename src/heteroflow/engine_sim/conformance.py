"""Conformance scenarios of the engine FT protocol, run against every engine implementation.

Each scenario is an ``async`` function of an :class:`~heteroflow.engine_sim.testing.EngineClusterHarness`
that raises :class:`ConformanceError` on the first deviation from ``engine-protocol.md``. The unit tests
run them against :class:`~heteroflow.engine_sim.testing.FakeEngineCluster`, the integration tests against
:class:`~heteroflow.engine_sim.testing.SimProcessCluster` (real processes, torch, gloo); consumers of the
protocol (the NodeManager) can run them against their own doubles.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable
from typing import Any

import httpx

from heteroflow.contracts.engine_protocol import (
    ENGINE_FAULTED_TEXT,
    TERMINAL_FAULT_INFO,
    apply_path,
    parse_status_response,
    select_engine,
    status_path,
)
from heteroflow.engine_sim.testing import EngineClusterHarness

PROMPTS = ("the quick brown fox", "fault tolerance", "expert parallel", "hello world", "dp rank zero")
MAX_TOKENS = 12
DEAD_WITHIN = 10.0
"""Seconds for a rank whose own worker was killed to report ``dead`` (it notices the exit at once)."""
STATUS_KEYS = {"id", "status", "fault_info", "mask", "last_ft_request_id", "ft_error", "ft_state"}


class ConformanceError(AssertionError):
    """The engine deviates from the protocol; the message says where."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


# -- small protocol client ---------------------------------------------------------------------------
async def status_of(h: EngineClusterHarness, rank: int) -> dict[str, Any] | None:
    """The rank's own status entry (checked against the consumer rule), ``None`` when unreachable."""
    try:
        resp = await h.client(rank).get(status_path(h.prefix), timeout=5.0)
    except httpx.TransportError:
        return None
    expect(resp.status_code == 200, f"status of rank {rank}: HTTP {resp.status_code}")
    body = resp.json()
    expect(set(body) == {"schema_version", "total_engines", "engines"}, f"status keys of rank {rank}: {sorted(body)}")
    parsed = parse_status_response(body)
    expect(parsed.schema_version == 1, "schema_version must be 1")
    select_engine(parsed, endpoint_id=rank)
    entry: dict[str, Any] = body["engines"][0]
    expect(set(entry) <= STATUS_KEYS, f"unknown status keys {sorted(set(entry) - STATUS_KEYS)}")
    unhealthy = entry["status"] == "unhealthy"
    expect(entry["status"] in ("healthy", "diagnosing", "unhealthy", "dead"), f"status of rank {rank}: {entry}")
    # vLLM 0.34: fault_info while unhealthy, and on the dead engine of a failed scale_down (its terminal reason)
    terminal = entry["status"] == "dead" and entry.get("fault_info") == TERMINAL_FAULT_INFO
    expect(("fault_info" in entry) == (unhealthy or terminal), f"fault_info only while unhealthy: {entry}")
    # mask is optional (released vLLM never sends it); when present it is one 0/1 per rank, only while unhealthy
    expect("mask" not in entry or unhealthy, f"mask only while unhealthy: {entry}")
    if "mask" in entry:
        expect(len(entry["mask"]) == h.dp_size and set(entry["mask"]) <= {0, 1}, f"mask shape: {entry}")
    return entry


async def apply(h: EngineClusterHarness, rank: int, body: object) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await h.client(rank).post(
        apply_path(h.prefix), content=content, headers={"content-type": "application/json"}
    )


async def wait_status(
    h: EngineClusterHarness, ranks: Iterable[int], status: str, *, within: float, ft_state_absent: bool = False
) -> None:
    ranks = tuple(ranks)

    async def check() -> bool:
        for rank in ranks:
            entry = await status_of(h, rank)
            if entry is None or entry["status"] != status:
                return False
            if ft_state_absent and "ft_state" in entry:
                return False
        return True

    await h.eventually(check, within=within, what=f"ranks {list(ranks)} {status}")


async def complete(h: EngineClusterHarness, rank: int, prompt: str) -> httpx.Response:
    return await h.client(rank).post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_TOKENS})


async def outputs(h: EngineClusterHarness, rank: int) -> list[str]:
    texts = []
    for prompt in PROMPTS:
        resp = await complete(h, rank, prompt)
        expect(resp.status_code == 200, f"completion on rank {rank}: HTTP {resp.status_code} {resp.text}")
        texts.append(resp.json()["choices"][0]["text"])
    return texts


async def traffic(h: EngineClusterHarness, ranks: Iterable[int]) -> list[int | None]:
    """One request per rank, concurrently; the HTTP codes (``None`` = unreachable)."""

    async def one(rank: int) -> int | None:
        try:
            return (await complete(h, rank, "traffic")).status_code
        except httpx.TransportError:
            return None

    return list(await asyncio.gather(*(one(r) for r in ranks)))


async def inject(h: EngineClusterHarness, rank: int, kind: str, **extra: Any) -> None:
    resp = await h.client(rank).post(
        "/sim/faults",
        json={"kind": kind, **extra},
        headers={"Authorization": f"Bearer {h.cluster_token}"},
    )
    expect(resp.status_code == 202, f"inject {kind} on rank {rank}: HTTP {resp.status_code} {resp.text}")


async def sim_info(h: EngineClusterHarness, rank: int) -> dict[str, Any]:
    resp = await h.client(rank).get("/sim/info", headers={"Authorization": f"Bearer {h.cluster_token}"})
    expect(resp.status_code == 200, f"info of rank {rank}: HTTP {resp.status_code}")
    info: dict[str, Any] = resp.json()
    return info


def new_request_id() -> str:
    return f"ft-{uuid.uuid4().hex[:12]}"


# -- scenarios -----------------------------------------------------------------------------------------
async def healthy_contract(h: EngineClusterHarness, ranks: Iterable[int]) -> list[str]:
    """Shapes and codes of a healthy instance; returns rank ``min(ranks)``'s outputs for PROMPTS."""
    ranks = tuple(ranks)
    for rank in ranks:
        entry = await status_of(h, rank)
        expect(entry == {"id": rank, "status": "healthy"}, f"fresh status of rank {rank}: {entry}")
        expect((await h.client(rank).get("/health")).status_code == 200, "health must be 200")
    client = h.client(ranks[0])
    models = (await client.get("/v1/models")).json()
    expect(models["object"] == "list" and len(models["data"]) == 1, f"models: {models}")
    model = models["data"][0]["id"]

    base = await outputs(h, ranks[0])
    expect(all(len(text) == MAX_TOKENS for text in base), f"max_tokens honoured: {base}")
    for rank in ranks[1:]:
        expect(await outputs(h, rank) == base, f"rank {rank} must produce the same greedy outputs")

    resp = await client.post("/v1/completions", json={"model": model, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS})
    body = resp.json()
    expect(body["object"] == "text_completion" and body["choices"][0]["finish_reason"] == "length", str(body))
    expect(body["usage"]["completion_tokens"] == MAX_TOKENS, f"usage: {body['usage']}")

    streamed = await _stream_text(client, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS})
    expect(streamed == base[0], f"streamed completion {streamed!r} != {base[0]!r}")

    chat_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS}
    chat = (await client.post("/v1/chat/completions", json=chat_body)).json()
    expect(chat["object"] == "chat.completion", str(chat))
    chat_text = chat["choices"][0]["message"]["content"]
    expect(await _stream_text(client, "/v1/chat/completions", chat_body) == chat_text, "streamed chat differs")

    for bad, code in (
        ({"prompt": "x", "max_tokens": 0}, 400),
        ({"max_tokens": 3}, 400),
        ({"prompt": "x", "model": "no-such-model"}, 404),
        ({"prompt": "x", "max_tokens": 10**6}, 400),
    ):
        resp = await client.post("/v1/completions", json=bad)
        expect(resp.status_code == code, f"{bad} → HTTP {resp.status_code}, expected {code}")
        expect("message" in resp.json()["error"], "an OpenAI error carries a message")
    resp = await client.post("/v1/chat/completions", json={"messages": []})
    expect(resp.status_code == 400, f"empty messages → HTTP {resp.status_code}")
    return base


async def apply_validation(h: EngineClusterHarness, rank: int) -> None:
    """400 for malformed commands; a well-formed command on a healthy engine is rejected in the status."""
    malformed: tuple[object, ...] = (
        b"not json",
        [],
        "scale_down",
        {},
        {"instruction": "explode", "request_id": "x"},
        {"instruction": "retry"},
        {"instruction": "retry", "request_id": ""},
        {"instruction": "retry", "request_id": "x", "params": []},
        {"instruction": "scale_down", "request_id": "x", "params": {"removed_dp_ranks": "2"}},
        {"instruction": "scale_down", "request_id": "x", "params": {"dp_store_port": 70000}},
    )
    for body in malformed:
        resp = await apply(h, rank, body)
        expect(resp.status_code == 400, f"apply {body!r} → HTTP {resp.status_code}, expected 400")
        expect(bool(resp.json().get("error")), "a 400 carries a reason")
    before = await status_of(h, rank)
    expect(before is not None and before["status"] == "healthy", "rank must be healthy for this scenario")
    request_id = new_request_id()
    resp = await apply(
        h, rank, {"instruction": "scale_down", "request_id": request_id, "params": {"removed_dp_ranks": [0]}}
    )
    expect(resp.status_code == 202 and resp.json()["request_id"] == request_id, f"apply answer: {resp.text}")
    entry = await status_of(h, rank)
    expect(
        entry is not None
        and entry["status"] == "healthy"
        and entry.get("last_ft_request_id") == request_id
        and entry.get("ft_error") == f"[FT] Rejecting scale_down on engine {rank}: status is HEALTHY",
        f"a command on a healthy engine is rejected in the status: {entry}",
    )
    expect((await complete(h, rank, "still serving")).status_code == 200, "a rejected command changes nothing")


async def transient_retry(
    h: EngineClusterHarness, ranks: Iterable[int], baseline: list[str], *, slow_rank: int | None = None
) -> None:
    """Every rank unhealthy, nobody dead; one ``retry`` round recovers all of them.

    With ``slow_rank``, that rank's rebuild is delayed: the others report ``recovering`` meanwhile.
    """
    ranks = tuple(ranks)
    await inject(h, ranks[-1], "transient")
    await wait_status(h, ranks, "unhealthy", within=h.collective_timeout + 5.0)
    for rank in ranks:
        resp = await complete(h, rank, "refused")
        expect(resp.status_code == 503, f"new request on unhealthy rank {rank}: HTTP {resp.status_code}")
        expect(resp.json()["error"]["message"] == ENGINE_FAULTED_TEXT, f"vLLM's own 503 text: {resp.text}")
        expect((await h.client(rank).get("/health")).status_code == 200, "health stays 200 while unhealthy")
    if slow_rank is not None:
        await inject(h, slow_rank, "slow_rebuild", delay_sec=3.0)
    request_id = new_request_id()
    for rank in ranks:
        resp = await apply(h, rank, {"instruction": "retry", "request_id": request_id})
        expect(resp.status_code == 202, f"retry on rank {rank}: HTTP {resp.status_code}")
    if slow_rank is not None:
        other = next(r for r in ranks if r != slow_rank)
        entry = await status_of(h, other)
        expect(
            entry is not None and entry["status"] == "unhealthy" and entry.get("ft_state") == "recovering",
            f"while a peer rebuilds slowly the round is still recovering: {entry}",
        )
    await wait_status(h, ranks, "healthy", within=30.0, ft_state_absent=True)
    for rank in ranks:
        entry = await status_of(h, rank)
        # the healthy push replaces the entry: last_ft_request_id, ft_error and ft_state are gone
        expect(entry == {"id": rank, "status": "healthy"}, f"after retry: {entry}")
    expect(await outputs(h, ranks[0]) == baseline, "outputs after retry must equal the baseline")


async def scale_down_rejections(h: EngineClusterHarness, rank: int, *, all_ranks: int) -> None:
    """Every scale_down validation on an unhealthy engine; each is rejected with a reason in the status."""
    cases: list[list[int]] = [[], [all_ranks], [rank], list(range(all_ranks))]
    for removed in cases:
        request_id = new_request_id()
        body: dict[str, Any] = {
            "instruction": "scale_down",
            "request_id": request_id,
            "params": {"removed_dp_ranks": removed, "dp_master_ip": "127.0.0.1", "dp_store_port": h.free_port()},
        }
        resp = await apply(h, rank, body)
        expect(resp.status_code == 202, f"well-formed scale_down {removed}: HTTP {resp.status_code}")
        entry = await status_of(h, rank)
        expect(
            entry is not None
            and entry["status"] == "unhealthy"
            and entry.get("last_ft_request_id") == request_id
            and bool(entry.get("ft_error")),
            f"scale_down {removed} must be rejected in the status: {entry}",
        )


async def scale_down_chain(h: EngineClusterHarness, baseline: list[str]) -> dict[str, Any]:
    """A1, A3, A4 on one 4-rank instance: kill 2 → remove; kill 0 → new master 1; too few slots → dead."""
    expect(h.dp_size == 4, "the chain needs 4 ranks")
    timeline: dict[str, Any] = {}
    # round 1: a non-zero rank dies under traffic
    await inject(h, 2, "kill_worker")
    await wait_status(h, [2], "dead", within=DEAD_WITHIN)
    timeline["traffic_1"] = await traffic(h, [0, 1, 3])
    await wait_status(h, [0, 1, 3], "unhealthy", within=h.collective_timeout + 5.0)
    expect((await complete(h, 1, "refused")).status_code == 503, "survivor refuses new requests")
    # a command on the dead rank is rejected: status is DEAD
    dead_id = new_request_id()
    await apply(h, 2, {"instruction": "retry", "request_id": dead_id})
    entry = await status_of(h, 2)
    expect(
        entry is not None and entry.get("ft_error") == "[FT] Rejecting retry on engine 2: status is DEAD",
        f"dead rank rejects: {entry}",
    )
    await scale_down_rejections(h, 1, all_ranks=4)
    round1 = new_request_id()
    for rank in (0, 1, 3):
        body = {
            "instruction": "scale_down",
            "request_id": round1,
            "params": {"removed_dp_ranks": [2], "dp_master_ip": "127.0.0.1", "dp_store_port": h.free_port()},
        }
        expect((await apply(h, rank, body)).status_code == 202, "apply accepted with 202")
    await wait_status(h, [0, 1, 3], "healthy", within=60.0, ft_state_absent=True)
    for rank in (0, 1, 3):
        entry = await status_of(h, rank)
        expect(
            entry == {"id": rank, "status": "healthy"}, f"after round 1 the healthy push replaced the entry: {entry}"
        )
    expect(await outputs(h, 1) == baseline, "outputs after removing rank 2 must equal the baseline")
    # round 2: the store master (rank 0) dies; survivors elect min(alive) = 1
    await inject(h, 0, "kill_worker")
    await wait_status(h, [0], "dead", within=DEAD_WITHIN)
    timeline["traffic_2"] = await traffic(h, [1, 3])
    await wait_status(h, [1, 3], "unhealthy", within=h.collective_timeout + 5.0)
    no_new = new_request_id()
    await apply(h, 1, {"instruction": "scale_down", "request_id": no_new, "params": {"removed_dp_ranks": [2]}})
    entry = await status_of(h, 1)
    expect(
        entry is not None and str(entry.get("ft_error")).startswith("Invalid removed_dp_ranks [2] for engine 1"),
        f"no new dead: {entry}",
    )
    round2 = new_request_id()
    store_port = h.free_port()
    for rank in (1, 3):
        body = {
            "instruction": "scale_down",
            "request_id": round2,
            "params": {"removed_dp_ranks": [0, 2], "dp_master_ip": "127.0.0.1", "dp_store_port": store_port},
        }
        expect((await apply(h, rank, body)).status_code == 202, "apply accepted with 202")
    await wait_status(h, [1, 3], "healthy", within=60.0, ft_state_absent=True)
    info = await sim_info(h, 3)
    expect(info["store_master"] == 1 and info["members"] == [1, 3], f"new master is rank 1: {info}")
    expect(info["dead_ranks"] == [0, 2], f"cumulative dead set in original ids: {info}")
    expect(await outputs(h, 3) == baseline, "outputs after removing ranks 0 and 2 must equal the baseline")
    timeline["placement_after_round_2"] = info["placement"]
    # round 3: too few expert slots for one survivor → the scale-down fails, the survivor reports dead
    await inject(h, 3, "kill_worker")
    await wait_status(h, [3], "dead", within=DEAD_WITHIN)
    timeline["traffic_3"] = await traffic(h, [1])
    await wait_status(h, [1], "unhealthy", within=h.collective_timeout + 5.0)
    round3 = new_request_id()
    body = {
        "instruction": "scale_down",
        "request_id": round3,
        # incremental list: the engine keeps the cumulative set itself
        "params": {"removed_dp_ranks": [3], "dp_master_ip": "127.0.0.1", "dp_store_port": h.free_port()},
    }
    expect((await apply(h, 1, body)).status_code == 202, "apply accepted with 202")

    async def failed_or_gone() -> bool:
        entry = await status_of(h, 1)
        timeline.setdefault("round3_entries", []).append(entry)
        return entry is None or (entry["status"] == "dead" and entry.get("ft_state") == "failed")

    await h.eventually(failed_or_gone, within=60.0, what="rank 1 dead after a failed scale_down")
    seen = [e for e in timeline["round3_entries"] if e is not None]
    expect(bool(seen) and seen[-1]["status"] == "dead", f"the failure is reported as dead first: {seen[-1:]}")
    expect("slot" in str(seen[-1].get("ft_error")), f"ft_error names the slot shortage: {seen[-1]}")
    expect(seen[-1].get("fault_info") == TERMINAL_FAULT_INFO, f"a failed scale_down is terminal: {seen[-1]}")

    async def gone() -> bool:
        return await status_of(h, 1) is None

    await h.eventually(gone, within=30.0, what="rank 1 exits after its terminal failure")
    return timeline


async def master_relocation(h: EngineClusterHarness, baseline: list[str]) -> None:
    """F-56: whichever rank is the current master can die, round after round (0 → 1 → 2)."""
    expect(h.dp_size == 4, "the relocation chain needs 4 ranks")
    removed: list[int] = []
    for victim, new_master in ((0, 1), (1, 2)):
        survivors = [r for r in range(4) if r not in removed and r != victim]
        await inject(h, victim, "kill_worker")
        await wait_status(h, [victim], "dead", within=DEAD_WITHIN)
        await traffic(h, survivors)
        await wait_status(h, survivors, "unhealthy", within=h.collective_timeout + 5.0)
        removed.append(victim)
        request_id = new_request_id()
        store_port = h.free_port()
        for rank in survivors:
            body = {
                "instruction": "scale_down",
                "request_id": request_id,
                "params": {"removed_dp_ranks": removed, "dp_master_ip": "127.0.0.1", "dp_store_port": store_port},
            }
            expect((await apply(h, rank, body)).status_code == 202, "apply accepted with 202")
        await wait_status(h, survivors, "healthy", within=60.0, ft_state_absent=True)
        info = await sim_info(h, survivors[-1])
        expect(info["store_master"] == new_master, f"master after removing {removed}: {info}")
        expect(info["members"] == survivors, f"members after removing {removed}: {info}")
        expect(await outputs(h, survivors[-1]) == baseline, f"outputs after removing {removed}")


async def wait_idle(h: EngineClusterHarness, ranks: Iterable[int]) -> None:
    """Until no rank runs a collective: the wave of the last request also ends with one empty step."""
    ranks = tuple(ranks)

    async def idle() -> bool:
        for rank in ranks:
            if (await sim_info(h, rank))["in_wave"]:
                return False
        return True

    await h.eventually(idle, within=h.collective_timeout + 5.0, what=f"ranks {list(ranks)} idle")


async def idle_kill(h: EngineClusterHarness, victim: int, survivors: Iterable[int]) -> None:
    """The RFC's idle row: without traffic, survivors of a dead peer stay healthy."""
    survivors = tuple(survivors)
    await wait_idle(h, (victim, *survivors))
    await inject(h, victim, "kill_worker")
    await wait_status(h, [victim], "dead", within=DEAD_WITHIN)
    await h.let_time_pass(h.collective_timeout + 1.0)
    for rank in survivors:
        entry = await status_of(h, rank)
        expect(entry is not None and entry["status"] == "healthy", f"idle survivor {rank} must stay healthy: {entry}")


async def hang_detected(h: EngineClusterHarness, victim: int, survivors: Iterable[int]) -> None:
    """A hung (SIGSTOP) worker: survivors under traffic time out in their collective → unhealthy."""
    survivors = tuple(survivors)
    await inject(h, victim, "hang")
    await traffic(h, survivors)
    await wait_status(h, survivors, "unhealthy", within=h.collective_timeout + 5.0)
    entry = await status_of(h, victim)
    expect(entry is not None and entry["status"] != "dead", f"a hung worker is not dead: {entry}")


async def _stream_text(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
    text = []
    done = False
    async with client.stream("POST", path, json={**body, "stream": True}) as resp:
        expect(resp.status_code == 200, f"stream {path}: HTTP {resp.status_code}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            expect("error" not in chunk, f"stream error: {chunk}")
            choice = chunk["choices"][0]
            text.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
    expect(done, "a stream ends with [DONE]")
    return "".join(text)
