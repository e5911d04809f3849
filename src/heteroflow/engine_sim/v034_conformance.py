"""Conformance checks of the profile ``vllm-0.34``: every fact of its list in ``engine-protocol.md``.

Each check is an ``async`` function of an :class:`~heteroflow.engine_sim.testing.EngineClusterHarness` (the
fake cluster in ``tests/unit/engine_sim``, real simulator processes in ``tests/integration``) that raises
:class:`~heteroflow.engine_sim.conformance.ConformanceError` on the first deviation. The facts, in the spec's
order, and the check that shows each:

- routes under ``/v1`` only, behind the API key; ``retry`` and ``scale_down`` — :func:`v034_routes_and_errors`
- the apply's 400 texts in vLLM's error body; 202 with the caller's ``request_id`` — :func:`v034_routes_and_errors`
- a rejected command: ``[FT] Rejecting <instr> on engine N: status is HEALTHY|DIAGNOSING|DEAD`` — :func:`v034_round`
- a fault first reads ``diagnosing``, then ``unhealthy``; a dead rank ``dead`` — :func:`v034_round`
- ``ft_state`` ``recovering`` with ``last_ft_request_id``; a second command: "another recovery is in
  progress" — :func:`v034_round`
- one round, one id, ten seconds: a survivor left out fails the round for the others after 10 s (``failed``,
  the check-in text, still ``unhealthy``) — :func:`v034_round`
- a failed ``retry`` is retryable (``unhealthy``) — :func:`v034_round`
- the vote: all commit, and the healthy push drops ``ft_state``, ``last_ft_request_id``, ``ft_error`` —
  :func:`v034_round`
- ``scale_down`` validation (empty, outside, own rank, every rank, nothing new) — :func:`v034_round`
- the store master is the lowest alive rank; ``dp_master_ip`` and ``dp_store_port`` required when it goes —
  :func:`v034_round`
- a failed ``scale_down`` is terminal: ``dead``, "Recovery failed; full restart required" — :func:`v034_round`
- admission: 503 with vLLM's ``EngineFaultedError`` text while not healthy; ``/health`` 503 only while dead —
  :func:`v034_round`
- elastic EP routes: ``POST /scale_elastic_ep``, ``POST /is_scaling_elastic_ep``, the status body, the 400 texts
  and refusals, the current size at once — :func:`v034_elastic_ep`; a scale-up with an externally launched rank
  — :func:`v034_elastic_ep_grow`; a scale-down retiring the top rank — :func:`v034_elastic_ep_shrink`; the FT
  sentinel's size frozen at launch — :func:`v034_elastic_ep_ft_after_grow`; the ready barrier's timeout (408,
  the old world serving) — :func:`v034_elastic_ep_prepare_timeout`
- a release cannot be launched with dead ranks (no such option: ``--dead-ranks`` is refused as unknown); a
  smaller contiguous DP world can (``dp_size`` k, ``k x slots_per_rank - E`` redundant experts, the expert
  layout checked at start), and scales down again — :func:`v034_smaller_world`
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from heteroflow.contracts.engine_protocol import (
    ANOTHER_RECOVERY_TEXT,
    ELASTIC_EP_PREPARE_TIMEOUT_TEXT,
    ELASTIC_EP_RETIRED_TEXT,
    ENGINE_FAULTED_TEXT,
    IS_SCALING_ELASTIC_EP_PATH,
    SCALE_ELASTIC_EP_PATH,
    TERMINAL_FAULT_INFO,
    VLLM_0_32,
    VLLM_0_34,
    checkin_failure_text,
    elastic_ep_ready_failed_text,
    elastic_ep_unexpected_rank_text,
)
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.conformance import DEAD_WITHIN, apply, expect, status_of
from heteroflow.engine_sim.testing import ElasticEpHarness, EngineClusterHarness

CHECKIN_SEC = 10.0
JSON = "application/json"


def _vllm_400(resp: httpx.Response, message: str) -> None:
    expect(resp.status_code == 400, f"expected 400 {message!r}, got HTTP {resp.status_code} {resp.text}")
    expect(
        resp.json() == {"error": {"message": message, "type": "Bad Request", "param": None, "code": 400}},
        f"vLLM's error body with {message!r}: {resp.text}",
    )


async def _raw_apply(h: EngineClusterHarness, rank: int, content: bytes, media: str) -> httpx.Response:
    return await h.client(rank).post(VLLM_0_34.apply_path, content=content, headers={"content-type": media})


async def v034_routes_and_errors(h: EngineClusterHarness, rank: int) -> None:
    """Routes, the key, every 400 text, the 202 body; nothing here changes the engine."""
    expect(await status_of(h, rank) == {"id": rank, "status": "healthy"}, "a fresh engine is healthy")
    gone = await h.client(rank).get(VLLM_0_32.status_path)
    expect(gone.status_code == 404, f"the un-prefixed route is gone in 0.34: HTTP {gone.status_code}")
    anonymous = await h.client(rank).get(VLLM_0_34.status_path, headers={"Authorization": "Bearer wrong"})
    expect(anonymous.status_code == 401, f"/v1 routes are behind the key: HTTP {anonymous.status_code}")
    cases: tuple[tuple[bytes, str, str], ...] = (
        (b"[1]", "application/json", "Request body must be a JSON object."),
        (b"{}", "application/json", "'instruction' is required."),
        (b'{"instruction": "explode", "request_id": "x"}', "application/json", "Invalid instruction: 'explode'."),
        (b'{"instruction": "retry"}', "application/json", "'request_id' must be a non-empty string."),
        (b'{"instruction": "retry", "request_id": " "}', JSON, "'request_id' must be a non-empty string."),
        (b'{"instruction": "retry", "request_id": "x", "params": null}', JSON, "'params' must be an object."),
        (b"{not json", "application/json", "Invalid JSON format"),
        (b"{}", "text/plain", "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"),
    )  # fmt: skip
    for content, media, message in cases:
        _vllm_400(await _raw_apply(h, rank, content, media), message)
    request_id = conformance.new_request_id()
    resp = await apply(h, rank, {"instruction": "retry", "request_id": request_id})
    expect(resp.status_code == 202, f"a well-formed command is accepted for processing: HTTP {resp.status_code}")
    expect(
        resp.json() == {"message": VLLM_0_34.accepted_message, "request_id": request_id},
        f"202 body with the caller's id: {resp.text}",
    )
    entry = await status_of(h, rank)
    expect(
        entry
        == {
            "id": rank,
            "status": "healthy",
            "last_ft_request_id": request_id,
            "ft_error": f"[FT] Rejecting retry on engine {rank}: status is HEALTHY",
            "ft_state": "failed",
        },
        f"a command on a healthy engine fails in the status: {entry}",
    )


def _scale_down(request_id: str, removed: list[int], *, port: int, master: bool = True) -> dict[str, Any]:
    params: dict[str, Any] = {"removed_dp_ranks": removed}
    if master:
        params |= {"dp_master_ip": "127.0.0.1", "dp_store_port": port}
    return {"instruction": "scale_down", "request_id": request_id, "params": params}


async def _faulted(h: EngineClusterHarness, ranks: list[int]) -> list[str]:
    """Traffic until ``ranks`` read ``unhealthy``; the statuses rank ``ranks[0]`` went through, in order."""
    await conformance.traffic(h, ranks)
    seen: list[str] = []

    async def unhealthy() -> bool:
        entries = [await status_of(h, r) for r in ranks]
        first = entries[0]
        if first is not None and (not seen or seen[-1] != first["status"]):
            seen.append(first["status"])
        return all(e is not None and e["status"] == "unhealthy" for e in entries)

    await h.eventually(unhealthy, within=h.collective_timeout + 5.0, what=f"ranks {ranks} unhealthy")
    return seen


async def v034_round(h: EngineClusterHarness) -> dict[str, Any]:
    """A 4-rank instance through every fault fact of 0.34 (see the module docstring); returns what it saw."""
    expect(h.dp_size == 4, "the round needs 4 ranks")
    seen: dict[str, Any] = {}
    await conformance.inject(h, 2, "kill_worker")
    await conformance.wait_status(h, [2], "dead", within=DEAD_WITHIN)
    dead_health = await h.client(2).get("/health")
    expect(dead_health.status_code == 503, f"/health is 503 while the engine is dead: {dead_health.status_code}")
    await conformance.traffic(h, [0, 1, 3])
    # a command while the engine is still diagnosing its fault is refused
    early = conformance.new_request_id()
    await apply(h, 0, _scale_down(early, [2], port=h.free_port()))
    entry = await status_of(h, 0)
    if entry is not None and entry["status"] == "diagnosing":
        expect(
            entry.get("ft_error") == "[FT] Rejecting scale_down on engine 0: status is DIAGNOSING",
            f"a command while diagnosing: {entry}",
        )
        seen["rejected_while_diagnosing"] = True
        refused = await conformance.complete(h, 0, "x")
        expect(refused.status_code == 503, f"a diagnosing engine refuses new requests: {refused.status_code}")
    seen["statuses"] = await _faulted(h, [0, 1, 3])
    expect(seen["statuses"][0] == "diagnosing", f"a fault first reads diagnosing: {seen['statuses']}")
    entry = await status_of(h, 0)
    expect(entry is not None and "ft_state" not in entry, f"the unhealthy push dropped the old outcome: {entry}")
    for rank in (0, 1, 3):
        resp = await conformance.complete(h, rank, "refused")
        expect(resp.status_code == 503, f"new request on a faulted engine: HTTP {resp.status_code}")
        expect(resp.json()["error"]["message"] == ENGINE_FAULTED_TEXT, f"vLLM's own 503 text: {resp.text}")
        expect((await h.client(rank).get("/health")).status_code == 200, "/health stays 200 while unhealthy")
    dead = conformance.new_request_id()
    await apply(h, 2, {"instruction": "retry", "request_id": dead})
    entry = await status_of(h, 2)
    expect(
        entry is not None and entry.get("ft_error") == "[FT] Rejecting retry on engine 2: status is DEAD",
        f"a dead engine refuses: {entry}",
    )
    # validation failures: reported in the status, the engine stays unhealthy (not terminal)
    for removed in ([], [4], [1], [0, 1, 2, 3], [9]):
        request_id = conformance.new_request_id()
        await apply(h, 1, _scale_down(request_id, removed, port=h.free_port()))
        entry = await status_of(h, 1)
        expect(
            entry is not None
            and entry["status"] == "unhealthy"
            and entry.get("ft_state") == "failed"
            and entry.get("last_ft_request_id") == request_id
            and bool(entry.get("ft_error")),
            f"scale_down {removed} fails in the status, retryable: {entry}",
        )
    # a retry that cannot gather every member (rank 2 is dead and not removed) fails its check-in: retryable
    retry_id = conformance.new_request_id()
    for rank in (0, 1, 3):
        await apply(h, rank, {"instruction": "retry", "request_id": retry_id})
    await h.let_time_pass(CHECKIN_SEC + 1.0)
    for rank in (0, 1, 3):
        entry = await status_of(h, rank)
        expect(
            entry is not None and entry["status"] == "unhealthy" and entry.get("ft_state") == "failed",
            f"a failed retry leaves rank {rank} unhealthy: {entry}",
        )
    # partial dispatch: rank 3 never gets the round's id
    partial = conformance.new_request_id()
    port = h.free_port()
    for rank in (0, 1):
        expect((await apply(h, rank, _scale_down(partial, [2], port=port))).status_code == 202, "apply 202")
    entry = await status_of(h, 0)
    expect(
        entry is not None and entry.get("ft_state") == "recovering" and entry.get("last_ft_request_id") == partial,
        f"a running command reads recovering with its id: {entry}",
    )
    await apply(h, 0, {"instruction": "retry", "request_id": conformance.new_request_id()})
    entry = await status_of(h, 0)
    expect(
        entry is not None and entry.get("ft_state") == "recovering" and entry.get("ft_error") == ANOTHER_RECOVERY_TEXT,
        f"a second command fails at once without disturbing the first: {entry}",
    )
    await h.let_time_pass(CHECKIN_SEC + 1.0)
    for rank in (0, 1):
        entry = await status_of(h, rank)
        expect(
            entry is not None
            and entry["status"] == "unhealthy"
            and entry.get("ft_state") == "failed"
            and entry.get("ft_error") == checkin_failure_text(partial),
            f"a round rank 3 never joined fails after 10 s on rank {rank}, retryable: {entry}",
        )
    seen["partial_dispatch"] = await status_of(h, 0)
    # the full round: every survivor, one id; all commit
    round1 = conformance.new_request_id()
    port = h.free_port()
    for rank in (0, 1, 3):
        expect((await apply(h, rank, _scale_down(round1, [2], port=port))).status_code == 202, "apply 202")
    await conformance.wait_status(h, [0, 1, 3], "healthy", within=30.0, ft_state_absent=True)
    for rank in (0, 1, 3):
        entry = await status_of(h, rank)
        expect(entry == {"id": rank, "status": "healthy"}, f"the healthy push replaced the entry: {entry}")
    # the lowest alive rank (0) goes: master ip and store port are required, the new master is rank 1
    await conformance.inject(h, 0, "kill_worker")
    await conformance.wait_status(h, [0], "dead", within=DEAD_WITHIN)
    await _faulted(h, [1, 3])
    missing = conformance.new_request_id()
    await apply(h, 1, _scale_down(missing, [0, 2], port=h.free_port(), master=False))
    entry = await status_of(h, 1)
    expect(
        entry is not None
        and entry.get("ft_error")
        == "dp_store_port and dp_master_ip required when the store master (rank 0) is removed",
        f"removing the store master needs its new address: {entry}",
    )
    round2 = conformance.new_request_id()
    port = h.free_port()
    for rank in (1, 3):
        expect((await apply(h, rank, _scale_down(round2, [0, 2], port=port))).status_code == 202, "apply 202")
    await conformance.wait_status(h, [1, 3], "healthy", within=30.0, ft_state_absent=True)
    info = await conformance.sim_info(h, 3)
    expect(info["store_master"] == 1 and info["members"] == [1, 3], f"master = lowest alive rank: {info}")
    # too few expert slots for the last survivor: the scale_down fails for good
    await conformance.inject(h, 3, "kill_worker")
    await conformance.wait_status(h, [3], "dead", within=DEAD_WITHIN)
    await _faulted(h, [1])
    round3 = conformance.new_request_id()
    await apply(h, 1, _scale_down(round3, [0, 2, 3], port=h.free_port()))

    async def terminal() -> bool:
        entry = await status_of(h, 1)
        if entry is not None and entry["status"] == "dead":
            seen["terminal"] = entry
            return True
        return False

    await h.eventually(terminal, within=30.0, what="rank 1 dead after its failed scale_down")
    expect(seen["terminal"].get("fault_info") == TERMINAL_FAULT_INFO, f"terminal: {seen['terminal']}")
    expect(seen["terminal"].get("ft_state") == "failed", f"terminal failure reads failed: {seen['terminal']}")
    return seen


async def _elastic_post(h: EngineClusterHarness, rank: int, path: str, body: object) -> httpx.Response:
    return await h.client(rank).post(path, content=json.dumps(body), headers={"content-type": JSON})


def _vllm_error(resp: httpx.Response, code: int, phrase: str, message: str) -> None:
    expect(resp.status_code == code, f"expected {code} {message!r}, got HTTP {resp.status_code} {resp.text}")
    expect(
        resp.json() == {"error": {"message": message, "type": phrase, "param": None, "code": code}},
        f"vLLM's error body with {message!r}: {resp.text}",
    )


async def elastic_status(h: EngineClusterHarness, rank: int) -> dict[str, Any]:
    resp = await _elastic_post(h, rank, IS_SCALING_ELASTIC_EP_PATH, {})
    expect(resp.status_code == 200, f"/is_scaling_elastic_ep on rank {rank}: HTTP {resp.status_code} {resp.text}")
    body: dict[str, Any] = resp.json()
    expect(
        set(body) == {"is_scaling_elastic_ep", "phase", "epoch", "error", "requested_data_parallel_size"},
        f"vLLM's status fields: {body}",
    )
    return body


async def v034_elastic_ep(h: EngineClusterHarness, rank: int) -> None:
    """The elastic EP routes (``--enable-elastic-ep``): the status body, the 400 texts, the refusals before
    anything is published (max size, experts), and the current size answered at once without an epoch.

    ``h`` runs the default layout (``num_experts`` 4 + 4 redundant) with ``--elastic-ep-max-dp-size`` unset."""
    idle = await elastic_status(h, rank)
    expect(
        idle
        == {
            "is_scaling_elastic_ep": False,
            "phase": "idle",
            "epoch": None,
            "error": None,
            "requested_data_parallel_size": None,
        },
        f"a fresh engine's elastic EP status: {idle}",
    )
    cases: tuple[tuple[object, str], ...] = (
        ({}, "new_data_parallel_size is required"),
        ({"new_data_parallel_size": 0}, "new_data_parallel_size must be a positive integer"),
        ({"new_data_parallel_size": "2"}, "new_data_parallel_size must be a positive integer"),
        ({"new_data_parallel_size": 2, "drain_timeout": 0}, "drain_timeout must be a positive integer"),
        ([1], "Request body must be a JSON object."),
        # the target above --elastic-ep-max-dp-size (default: the launch size)
        (
            {"new_data_parallel_size": h.dp_size + 1},
            f"Cannot scale to data_parallel_size {h.dp_size + 1}; --elastic-ep-max-dp-size is {h.dp_size}.",
        ),
        # (4 + 4) * 1 // dp_size - 4 < 0: the target cannot hold every expert
        (
            {"new_data_parallel_size": 1},
            f"Cannot scale external Elastic EP from DP size {h.dp_size} to 1: "
            "the target topology cannot retain all model experts.",
        ),
    )
    for body, message in cases:
        _vllm_error(await _elastic_post(h, rank, SCALE_ELASTIC_EP_PATH, body), 400, "Bad Request", message)
    raw = await h.client(rank).post(SCALE_ELASTIC_EP_PATH, content=b"{oops", headers={"content-type": JSON})
    _vllm_error(raw, 400, "Bad Request", "Invalid JSON format")
    same = await _elastic_post(h, rank, SCALE_ELASTIC_EP_PATH, {"new_data_parallel_size": h.dp_size})
    expect(same.status_code == 200, f"the current size: HTTP {same.status_code} {same.text}")
    expect(same.json() == {"message": f"Scaled to {h.dp_size} data parallel engines"}, same.text)
    after = await elastic_status(h, rank)
    expect(after == idle, f"the current size publishes nothing (no epoch, phase unchanged): {after}")


async def _scale_all(h: EngineClusterHarness, ranks: list[int], new: int, **extra: int) -> list[httpx.Response]:
    """The resize request on every old rank's API at once, as an orchestrator sends it."""
    body = {"new_data_parallel_size": new, **extra}
    return list(await asyncio.gather(*(_elastic_post(h, r, SCALE_ELASTIC_EP_PATH, body) for r in ranks)))


async def _health_200(h: EngineClusterHarness, rank: int) -> bool:
    try:
        return (await h.client(rank).get("/health")).status_code == 200
    except httpx.TransportError:
        return False


async def _logged(h: ElasticEpHarness, rank: int, text: str) -> bool:
    return text in h.log_text(rank)


async def _gated(h: EngineClusterHarness, rank: int) -> bool:
    """The rank's elastic EP serving gate is closed (a path it does not exempt answers 503)."""
    return (await h.client(rank).get("/v1/models")).status_code == 503


async def v034_elastic_ep_grow(h: ElasticEpHarness, baseline: list[str]) -> dict[str, Any]:
    """A 2-rank world grows to 3: rank 2 launched with ``VLLM_ELASTIC_EP_SCALE_UP_LAUNCH=1`` waits for rank 0's
    bootstrap, both old ranks get the request; a request still running on rank 1 when its gate closes (prepared)
    finishes before the commit (pause mode ``"wait"``); 200 on each, the new rank serves only after the commit, every
    rank serves the same greedy outputs, the redundancy is ``(4 + 4) * 3 // 2 - 4 = 8``, and the FT sentinel's
    size stays the launch size (2 on the old ranks, 3 on the new one). Returns what it saw."""
    expect(h.dp_size == 2, "the resize checks start from 2 ranks")
    seen: dict[str, Any] = {}
    h.launch_scale_up(2, new_dp_size=3)
    waiting = "launched rank 2 waits for rank 0's scale-up handshake"
    await h.eventually(lambda: _logged(h, 2, waiting), within=60.0, what="the launched rank 2 waits for rank 0")
    # a request running on rank 1 when the gate closes (prepare done) finishes (pause mode "wait") before the
    # commit, in lockstep with rank 0: rank 2 is up already, so the prepare takes a few polls only
    running = asyncio.create_task(h.client(1).post("/v1/completions", json={"prompt": "a long one", "max_tokens": 256}))
    scale = asyncio.create_task(_scale_all(h, [0, 1], 3))
    await h.eventually(lambda: _gated(h, 1), within=30.0, what="rank 1's serving gate closes once prepared")
    expect(not running.done(), "the request was still running on rank 1 when its resize had prepared")
    answers = await scale
    for rank, resp in enumerate(answers):
        expect(resp.status_code == 200, f"scale-up on rank {rank}: HTTP {resp.status_code} {resp.text}")
        expect(resp.json() == {"message": "Scaled to 3 data parallel engines"}, resp.text)
    finished = await running
    expect(
        finished.status_code == 200 and finished.json()["choices"][0]["finish_reason"] == "length",
        f"the running request finished across the resize: HTTP {finished.status_code} {finished.text[:200]}",
    )
    status = await elastic_status(h, 0)
    expect(
        status["phase"] == "completed"
        and not status["is_scaling_elastic_ep"]
        and status["requested_data_parallel_size"] == 3
        and status["error"] is None
        and isinstance(status["epoch"], str)
        and len(status["epoch"]) == 32,
        f"a completed scale-up with its uuid hex epoch: {status}",
    )
    seen["status"] = status
    await h.eventually(lambda: _health_200(h, 2), within=30.0, what="the scale-up-launched rank 2 serves")
    for rank in (0, 1, 2):
        info = await conformance.sim_info(h, rank)
        expect(
            (info["dp_size"], info["members"], info["num_redundant_experts"]) == (3, [0, 1, 2], 8),
            f"rank {rank} in the grown world: {info}",
        )
        expect(info["ft_dp_size"] == (3 if rank == 2 else 2), f"the FT sentinel keeps its launch size: {info}")
        expect(await conformance.outputs(h, rank) == baseline, f"rank {rank} serves the same greedy outputs")
    return seen


async def v034_elastic_ep_shrink(h: ElasticEpHarness, baseline: list[str]) -> None:
    """The grown world shrinks back to 2: every rank gets the request and answers 200; rank 2 is retired for
    good (503 with vLLM's text on every path but ``/health`` and ``/is_scaling_elastic_ep``), ranks 0 and 1
    rebuild over ``range(2)`` with ``(4 + 8) * 2 // 3 - 4 = 4`` redundant experts and serve the same outputs."""
    answers = await _scale_all(h, [0, 1, 2], 2)
    for rank, resp in enumerate(answers):
        expect(resp.status_code == 200, f"scale-down on rank {rank}: HTTP {resp.status_code} {resp.text}")
    refused = await conformance.complete(h, 2, "retired")
    expect(refused.status_code == 503 and refused.json() == {"error": ELASTIC_EP_RETIRED_TEXT}, refused.text)
    ft = await h.client(2).get(VLLM_0_34.status_path)
    expect(ft.status_code == 503, f"the FT status of a retired rank is gated too: HTTP {ft.status_code}")
    expect((await h.client(2).get("/health")).status_code == 200, "a retired rank stays up for its orchestrator")
    retired = await elastic_status(h, 2)
    expect(retired["phase"] == "completed", f"the retired rank's status stays readable: {retired}")
    for rank in (0, 1):
        info = await conformance.sim_info(h, rank)
        expect(
            (info["dp_size"], info["members"], info["num_redundant_experts"]) == (2, [0, 1], 4),
            f"rank {rank} after the scale-down: {info}",
        )
        expect(await conformance.outputs(h, rank) == baseline, f"rank {rank} serves the same greedy outputs")
    h.stop(2)


async def v034_elastic_ep_ft_after_grow(h: ElasticEpHarness) -> None:
    """After a scale-up, each rank's FT keeps the size it was constructed with: when the scale-up-launched rank
    2 dies, the old ranks (FT size 2) refuse ``scale_down [2]`` as outside their range, and stay unhealthy."""
    await conformance.inject(h, 2, "kill_worker")
    await conformance.wait_status(h, [2], "dead", within=DEAD_WITHIN)
    await _faulted(h, [0, 1])
    request_id = conformance.new_request_id()
    port = h.free_port()
    for rank in (0, 1):
        expect((await apply(h, rank, _scale_down(request_id, [2], port=port))).status_code == 202, "apply 202")
    for rank in (0, 1):
        entry = await status_of(h, rank)
        expect(
            entry is not None
            and entry["status"] == "unhealthy"
            and entry.get("ft_state") == "failed"
            and entry.get("last_ft_request_id") == request_id
            and entry.get("ft_error")
            == f"Invalid removed_dp_ranks [2] for engine {rank} (dp_rank={rank}, dead_dp_ranks=[])",
            f"rank {rank}'s FT still counts 2 ranks after the scale-up: {entry}",
        )


async def v034_elastic_ep_prepare_timeout(h: EngineClusterHarness, baseline: list[str]) -> None:
    """A scale-up whose new rank never comes: rank 0's ready barrier times out (``h``'s
    ``--elastic-ep-prepare-timeout-sec``; vLLM: 300 s),
    408 with vLLM's drain-timeout text, phase ``failed`` with "Timed out waiting for external Elastic EP ranks
    to prepare."; the old world never switched and serves at its old size with the same outputs."""
    expect(h.dp_size == 2, "the check starts from 2 ranks")
    answers = await _scale_all(h, [0, 1], 3, drain_timeout=7)
    _vllm_error(answers[0], 408, "Request Timeout", "Scale failed due to request drain timeout after 7 seconds")
    status = await elastic_status(h, 0)
    expect(
        status["phase"] == "failed"
        and not status["is_scaling_elastic_ep"]
        and status["error"] == ELASTIC_EP_PREPARE_TIMEOUT_TEXT
        and status["requested_data_parallel_size"] == 3,
        f"the failed prepare in the status: {status}",
    )
    # rank 1 either timed out itself (408) or saw rank 0's error first (500 "Scale failed")
    expect(answers[1].status_code in (408, 500), f"rank 1: HTTP {answers[1].status_code} {answers[1].text}")
    expect((await elastic_status(h, 1))["phase"] == "failed", "rank 1's operation failed too")
    for rank in (0, 1):
        info = await conformance.sim_info(h, rank)
        expect((info["dp_size"], info["members"]) == (2, [0, 1]), f"rank {rank} kept the old world: {info}")
        expect(await conformance.outputs(h, rank) == baseline, f"rank {rank} still serves the same outputs")


async def v034_smaller_world(h: EngineClusterHarness, baseline: list[str] | None = None) -> None:
    """An instance relaunched without a lost rank, as a release can be: a smaller contiguous world.

    Ranks ``range(k)``, no dead set, master 0, the same greedy outputs (``baseline``, when given); its own rank 0
    fails and the others scale it down (a new store address: the master goes), and serve the same outputs."""
    k = h.dp_size
    expect(k >= 2, "a scale-down needs 2 ranks")
    served = await conformance.healthy_contract(h, range(k))
    expect(baseline is None or served == baseline, f"the smaller world serves the same outputs: {served}")
    info = await conformance.sim_info(h, k - 1)
    expect(
        (info["dp_size"], info["members"], info["dead_ranks"], info["store_master"]) == (k, list(range(k)), [], 0),
        f"a fresh contiguous world: {info}",
    )
    await conformance.inject(h, 0, "kill_worker")
    await conformance.wait_status(h, [0], "dead", within=DEAD_WITHIN)
    survivors = list(range(1, k))
    await _faulted(h, survivors)
    request_id = conformance.new_request_id()
    port = h.free_port()
    for rank in survivors:
        expect((await apply(h, rank, _scale_down(request_id, [0], port=port))).status_code == 202, "apply 202")
    await conformance.wait_status(h, survivors, "healthy", within=30.0, ft_state_absent=True)
    info = await conformance.sim_info(h, survivors[-1])
    expect(
        (info["members"], info["dead_ranks"], info["store_master"]) == (survivors, [0], 1),
        f"scaled down in the new world's ids, master = lowest alive: {info}",
    )
    after = await conformance.outputs(h, survivors[-1])
    expect(after == served, f"the same greedy outputs after the scale-down: {after}")


async def v034_elastic_ep_unexpected_rank(h: ElasticEpHarness) -> None:
    """A rank launched for a scale-up outside ``range(cur, new)`` fails the operation with vLLM's text on rank
    0 (its handshake server raises it, ``external_elastic_ep.py`` L144-150, L497-498) and "failed while waiting
    for ranks to prepare" on the others (L500-505): 500 "Scale failed" on both, the old world serving on."""
    expect(h.dp_size == 2, "the check starts from 2 ranks")
    h.launch_scale_up(3, new_dp_size=4)  # the resize is to 3: only rank 2 may join
    answers = await _scale_all(h, [0, 1], 3)
    for resp in answers:
        _vllm_error(resp, 500, "Internal Server Error", "Scale failed")
    unexpected = elastic_ep_unexpected_rank_text(3)
    status = await elastic_status(h, 0)
    expect(status["phase"] == "failed" and status["error"] == unexpected, f"rank 0's failure: {status}")
    status = await elastic_status(h, 1)
    expect(
        status["phase"] == "failed" and status["error"] == elastic_ep_ready_failed_text(unexpected),
        f"rank 1's failure: {status}",
    )
    for rank in (0, 1):
        expect((await conformance.complete(h, rank, "still")).status_code == 200, f"rank {rank} serves on")
    h.stop(3)


async def v034_elastic_ep_after_ft_scale_down(h: ElasticEpHarness) -> None:
    """After an FT ``scale_down`` removed rank 1, a scale-up to 3 (rank 2 launched for it) waits at the ready
    barrier for every rank of ``range(3)``, the removed rank 1 included, and times out: 408, ``failed``, the
    survivor serving on alone. Rank 2 is up before the request and gets ready while rank 0 still waits, so the
    only rank missing is the removed one. Nothing in the release refuses it earlier (inferred from its source,
    not run: elastic EP never reads the FT state). Needs the ranks' logs (:meth:`ElasticEpHarness.log_text`)."""
    expect(h.dp_size == 2, "the check starts from 2 ranks")
    await conformance.inject(h, 1, "kill_worker")
    await conformance.wait_status(h, [1], "dead", within=DEAD_WITHIN)
    await _faulted(h, [0])
    request_id = conformance.new_request_id()
    expect((await apply(h, 0, _scale_down(request_id, [1], port=h.free_port()))).status_code == 202, "apply 202")
    await conformance.wait_status(h, [0], "healthy", within=30.0, ft_state_absent=True)
    h.launch_scale_up(2, new_dp_size=3)
    waiting = "launched rank 2 waits for rank 0's scale-up handshake"
    await h.eventually(lambda: _logged(h, 2, waiting), within=60.0, what="the launched rank 2 waits for rank 0")
    scale = asyncio.create_task(_scale_all(h, [0], 3))
    ready = "launched rank 2 ready"
    await h.eventually(lambda: _logged(h, 2, ready), within=30.0, what="the launched rank 2 got ready")
    expect(not scale.done(), "rank 2 got ready while rank 0 still waited at the ready barrier")
    answer = (await asyncio.wait_for(scale, timeout=60.0))[0]
    _vllm_error(answer, 408, "Request Timeout", "Scale failed due to request drain timeout after 120 seconds")
    status = await elastic_status(h, 0)
    expect(
        status["phase"] == "failed" and status["error"] == ELASTIC_EP_PREPARE_TIMEOUT_TEXT,
        f"the ready barrier waited for the removed rank: {status}",
    )
    expect(f"elastic EP {status['epoch']}: {ready}" in h.log_text(2), "rank 2 was ready for this very operation")
    info = await conformance.sim_info(h, 0)
    expect((info["members"], info["dead_ranks"]) == ([0], [1]), f"the survivor kept its world: {info}")
    expect((await conformance.complete(h, 0, "alone")).status_code == 200, "the survivor serves on")
    h.stop(2)
