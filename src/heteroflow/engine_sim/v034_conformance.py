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
- elastic EP routes: ``POST /scale_elastic_ep``, ``POST /is_scaling_elastic_ep`` — :func:`v034_elastic_ep`
- a release cannot be launched with dead ranks (no such option: ``--dead-ranks`` is refused as unknown); a
  smaller contiguous DP world can (``dp_size`` k, ``k x slots_per_rank - E`` redundant experts, the expert
  layout checked at start), and scales down again — :func:`v034_smaller_world`
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from heteroflow.contracts.engine_protocol import (
    ANOTHER_RECOVERY_TEXT,
    ENGINE_FAULTED_TEXT,
    IS_SCALING_ELASTIC_EP_PATH,
    SCALE_ELASTIC_EP_PATH,
    TERMINAL_FAULT_INFO,
    VLLM_0_32,
    VLLM_0_34,
    checkin_failure_text,
)
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.conformance import DEAD_WITHIN, apply, expect, status_of
from heteroflow.engine_sim.testing import EngineClusterHarness

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
        entry is not None and "dp_master_ip and dp_store_port are required" in str(entry.get("ft_error")),
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


async def v034_elastic_ep(h: EngineClusterHarness, rank: int) -> None:
    """The elastic EP routes (``--enable-elastic-ep``): status, bad input, the current size, and the refusal to
    resize over the holes an FT scale-down left."""

    async def post(path: str, body: object) -> httpx.Response:
        return await h.client(rank).post(path, content=json.dumps(body), headers={"content-type": "application/json"})

    idle = await post(IS_SCALING_ELASTIC_EP_PATH, {})
    expect(idle.status_code == 200 and idle.json()["phase"] == "idle", f"elastic EP status: {idle.text}")
    for bad in ({}, {"new_data_parallel_size": 0}, {"new_data_parallel_size": 2, "drain_timeout": 0}, [1]):
        resp = await post(SCALE_ELASTIC_EP_PATH, bad)
        expect(resp.status_code == 400, f"scale_elastic_ep {bad} → HTTP {resp.status_code}")
    same = await post(SCALE_ELASTIC_EP_PATH, {"new_data_parallel_size": h.dp_size})
    expect(same.status_code == 200, f"the current size: HTTP {same.status_code} {same.text}")
    expect(same.json()["message"] == f"Scaled to {h.dp_size} data parallel engines", same.text)
    done = (await post(IS_SCALING_ELASTIC_EP_PATH, {})).json()
    expect(done["phase"] == "completed" and done["epoch"] == 1, f"after a resize: {done}")


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
