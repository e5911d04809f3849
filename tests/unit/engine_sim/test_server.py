"""HTTP details of the engine API over the fake backend (fast, no processes, no torch)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from heteroflow.contracts.engine_protocol import ANOTHER_RECOVERY_TEXT, ENGINE_FAULTED_TEXT, checkin_failure_text
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.backend import FaultKind
from heteroflow.engine_sim.completions import completion_chunks
from heteroflow.engine_sim.engine import RequestAbortedError
from heteroflow.engine_sim.testing import TEST_CLUSTER_TOKEN, FakeEngineCluster

AUTH = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}


def run(scenario: Callable[[FakeEngineCluster], Awaitable[None]], **cluster_args: Any) -> None:
    async def main() -> None:
        cluster = FakeEngineCluster(**cluster_args)
        await cluster.start()
        try:
            await scenario(cluster)
        finally:
            await cluster.close()

    asyncio.run(main())


def test_fault_injection_needs_the_cluster_token() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        client = h.client(0)
        missing = {"Authorization": ""}
        assert (await client.post("/sim/faults", json={"kind": "hang"}, headers=missing)).status_code == 401
        bad = {"Authorization": "Bearer wrong"}
        assert (await client.post("/sim/faults", json={"kind": "hang"}, headers=bad)).status_code == 401
        assert (await client.get("/sim/info", headers=bad)).status_code == 401
        resp = await client.post("/sim/faults", json={"kind": "explode"}, headers=AUTH)
        assert resp.status_code == 400
        assert "kind" in resp.json()["error"]
        resp = await client.post("/sim/faults", json={"kind": "slow_rebuild", "delay_sec": -1}, headers=AUTH)
        assert resp.status_code == 400
        resp = await client.post("/sim/faults", content=b"{", headers={**AUTH, "content-type": "application/json"})
        assert resp.status_code == 400
        assert (await client.get("/sim/info", headers=AUTH)).json()["members"] == [0, 1, 2, 3]

    run(scenario)


def test_without_a_cluster_token_the_injection_route_is_disabled_and_the_rest_is_open() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        resp = await h.client(0).post("/sim/faults", json={"kind": "hang"}, headers={"Authorization": "Bearer "})
        assert resp.status_code == 403
        assert "disabled" in resp.json()["error"]
        assert "authorization" not in h.client(0).headers
        await conformance.healthy_contract(h, [0, 1])
        await conformance.apply_validation(h, 1)

    run(scenario, cluster_token="")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", {"prompt": 5}),  # authentication comes before validation
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("GET", "/v1/fault_tolerance/status", None),
        ("POST", "/v1/fault_tolerance/apply", {"instruction": "retry", "request_id": "r"}),
    ],
)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic xyz", "Bearer "])
def test_with_a_cluster_token_openai_and_ft_routes_need_it(
    method: str, path: str, body: dict[str, Any] | None, authorization: str | None
) -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        client = h.client(0)
        resp = await client.request(method, path, json=body, headers={"Authorization": authorization or ""})
        assert resp.status_code == 401
        assert resp.headers["www-authenticate"] == "Bearer"
        assert "cluster token" in str(resp.json()["error"])
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        entry = await conformance.status_of(h, 0)
        assert entry is None or entry == {"id": 0, "status": "healthy"}

    run(scenario)


def test_a_refused_token_is_answered_in_the_routes_error_shape_and_unguarded_paths_are_not_refused() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        client = h.client(0)
        anonymous = {"Authorization": ""}
        openai = await client.post("/v1/completions", json={"prompt": "x"}, headers=anonymous)
        assert openai.status_code == 401
        assert openai.json()["error"]["type"] == "AuthenticationError"
        assert openai.json()["error"]["code"] == 401
        for plain in [
            await client.get("/v1/fault_tolerance/status", headers=anonymous),
            await client.post("/sim/faults", json={"kind": "hang"}, headers=anonymous),
        ]:
            assert plain.status_code == 401
            assert plain.headers["www-authenticate"] == "Bearer"
            assert isinstance(plain.json()["error"], str)
        # only the OpenAI, FT and sim-only paths are guarded: an unknown path is not found, not refused
        assert (await client.get("/nowhere", headers=anonymous)).status_code == 404

    run(scenario)


def test_bodies_too_deep_too_large_or_not_text_are_a_4xx_in_each_routes_error_shape() -> None:
    deep = b"[" * 10_000 + b"]" * 10_000  # past CPython's recursion limit: the apply route's RecursionError was a 500
    big = b'{"prompt": "' + b"a" * (1 << 20) + b'"}'
    undecodable = b'{"prompt": "\xff"}'  # FastAPI's own answer was {"detail": "There was an error parsing the body"}

    async def scenario(h: FakeEngineCluster) -> None:
        client = h.client(0)
        json_body = {"content-type": "application/json"}
        for raw, status, fragment in [
            (deep, 400, "nested deeper"),
            (big, 413, "larger than"),
            (undecodable, 400, "UTF-8"),
            (b'{"model": "\\ud800", "prompt": "x"}', 400, "surrogate"),  # was a 500: the answer echoed it
            (b'{"model": "m", "prompt": "x", "max_tokens": NaN}', 400, "NaN"),
        ]:
            ft = await client.post("/v1/fault_tolerance/apply", content=raw, headers=json_body)
            assert ft.status_code == status, ft.text
            assert fragment in ft.json()["error"]["message"]  # vLLM 0.34's error body on its FT routes
            openai = await client.post("/v1/completions", content=raw, headers=json_body)
            assert openai.status_code == status, openai.text
            assert fragment in openai.json()["error"]["message"]
            sim = await client.post("/sim/faults", content=raw, headers=json_body)
            assert sim.status_code == status, sim.text
            assert fragment in sim.json()["error"]
        assert (await conformance.complete(h, 0, "still serving")).status_code == 200

    run(scenario)


def test_the_ft_route_prefix_is_configurable() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        assert (await h.client(0).get("/fault_tolerance/status")).json()["engines"] == [{"id": 0, "status": "healthy"}]
        assert (await h.client(0).get("/v1/fault_tolerance/status")).status_code == 404
        await conformance.apply_validation(h, 0)

    run(scenario, prefix="")


def test_no_command_within_the_recovery_timeout_makes_the_engine_exit() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        h.kill_worker(2)
        await conformance.traffic(h, [0, 1, 3])
        await conformance.wait_status(h, [0, 1, 3], "unhealthy", within=1.0)
        await h.let_time_pass(29.0)
        assert await conformance.status_of(h, 1) is not None
        await h.let_time_pass(1.5)
        for rank in range(4):
            assert await conformance.status_of(h, rank) is None, f"rank {rank} must have exited"
        assert h.cores[1].exit_code == 1

    run(scenario, engine_recovery_timeout_sec=30.0)


def test_dead_and_unhealthy_engines_answer_503_but_stay_live() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        h.kill_worker(2)
        await h.settle()
        for rank in (2, 1):
            if rank == 1:
                await conformance.traffic(h, [1])
                await h.settle()
            resp = await conformance.complete(h, rank, "x")
            assert resp.status_code == 503
            assert resp.json()["error"]["type"] == "ServiceUnavailableError"
            assert resp.json()["error"]["message"] == ENGINE_FAULTED_TEXT
            # vLLM 0.34: /health is 503 only while the engine is dead
            assert (await h.client(rank).get("/health")).status_code == (503 if rank == 2 else 200)
            stream = await h.client(rank).post("/v1/completions", json={"prompt": "x", "stream": True})
            assert stream.status_code == 503

    run(scenario)


def test_a_failed_retry_leaves_survivors_unhealthy_then_scale_down_recovers() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        await conformance.inject(h, 0, "transient")
        await conformance.wait_status(h, range(4), "unhealthy", within=1.0)
        h.kill_worker(3)  # dies before the retry: the retry cannot gather every member
        for rank in range(3):
            await conformance.apply(h, rank, {"instruction": "retry", "request_id": "retry-1"})
        await h.let_time_pass(11.0)
        for rank in range(3):
            entry = await conformance.status_of(h, rank)
            assert entry is not None
            assert entry["status"] == "unhealthy"
            assert entry["ft_state"] == "failed"
            # vLLM 0.34's check-in: not every survivor joined within 10 s; retryable, the engine stays unhealthy
            assert entry["ft_error"] == checkin_failure_text("retry-1")
        for rank in range(3):
            body = {"instruction": "scale_down", "request_id": "sd-1", "params": {"removed_dp_ranks": [3]}}
            assert (await conformance.apply(h, rank, body)).status_code == 202
        await conformance.wait_status(h, range(3), "healthy", within=2.0, ft_state_absent=True)

    run(scenario, rebuild_timeout_sec=10.0)


def test_a_second_command_while_one_runs_is_rejected_without_disturbing_it() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        await conformance.inject(h, 1, "transient")
        await conformance.wait_status(h, range(4), "unhealthy", within=1.0)
        await conformance.inject(h, 3, "slow_rebuild", delay_sec=5.0)
        for rank in range(4):
            await conformance.apply(h, rank, {"instruction": "retry", "request_id": "slow"})
        await h.settle()
        entry = await conformance.status_of(h, 0)
        assert entry is not None
        assert entry["ft_state"] == "recovering"
        await conformance.apply(h, 0, {"instruction": "retry", "request_id": "again"})
        entry = await conformance.status_of(h, 0)
        assert entry is not None
        assert entry["ft_state"] == "recovering"
        assert entry["ft_error"] == ANOTHER_RECOVERY_TEXT
        await conformance.wait_status(h, range(4), "healthy", within=10.0, ft_state_absent=True)

    run(scenario)


def test_survivors_that_disagree_on_the_round_fail_it() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        h.kill_worker(2)
        h.kill_worker(3)
        await conformance.traffic(h, [0, 1])
        await conformance.wait_status(h, [0, 1], "unhealthy", within=1.0)
        await conformance.apply(
            h, 0, {"instruction": "scale_down", "request_id": "r", "params": {"removed_dp_ranks": [2]}}
        )
        await conformance.apply(
            h, 1, {"instruction": "scale_down", "request_id": "r", "params": {"removed_dp_ranks": [2, 3]}}
        )

        # rank 0 waits for rank 3, which never joins: the check-in fails both; nothing commits
        async def both_failed() -> bool:
            entries = [await conformance.status_of(h, rank) for rank in (0, 1)]
            return all(e is not None and e.get("ft_state") == "failed" for e in entries)

        await h.eventually(both_failed, within=12.0, what="both survivors failed the round")
        assert h.cores[0].state.dead_ranks == h.cores[1].state.dead_ranks == frozenset()

    run(scenario, rebuild_timeout_sec=10.0)


def test_chat_accepts_text_parts_and_refuses_others() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        client = h.client(0)
        plain = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5}
        parts = {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 5,
        }
        a = (await client.post("/v1/chat/completions", json=plain)).json()
        b = (await client.post("/v1/chat/completions", json=parts)).json()
        assert a["choices"][0]["message"] == b["choices"][0]["message"]
        assert len(a["choices"][0]["message"]["content"]) == 5
        image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
        assert (await client.post("/v1/chat/completions", json=image)).status_code == 400
        resp = await client.post("/v1/completions", content=b"{", headers={"content-type": "application/json"})
        assert resp.status_code == 400
        assert (await client.post("/v1/completions", json={"prompt": ["a", "b"]})).status_code == 400
        assert (await client.post("/v1/completions", json={"prompt": ""})).status_code == 400
        assert (await client.post("/v1/completions", json={"prompt": "x" * 5000})).status_code == 400
        assert (await client.post("/v1/completions", json={"prompt": "x", "n": 2})).status_code == 400

    run(scenario)


def test_an_in_flight_generation_is_aborted_when_the_engine_turns_unhealthy() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        core = h.cores[0]
        stream = core.generate(prompt_tokens=(1, 2, 3), max_tokens=50)
        await anext(stream)
        core.inject(FaultKind.TRANSIENT)
        with pytest.raises(RequestAbortedError):
            async for _ in stream:
                pass
        assert core.status().aborted == 1

    run(scenario)


def test_a_stream_that_fails_mid_way_ends_with_an_error_event_and_no_done() -> None:
    async def failing() -> AsyncIterator[int]:
        yield 2
        raise RequestAbortedError("engine unhealthy: RuntimeError")

    async def collect() -> list[str]:
        return [chunk async for chunk in completion_chunks("id", 0, "m", 1, failing())]

    chunks = asyncio.run(collect())
    assert '"error"' in chunks[-1]
    assert all("[DONE]" not in c for c in chunks)
    assert len(chunks) == 3


def test_kill_process_makes_the_rank_unreachable() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        await conformance.inject(h, 1, "kill_process")
        assert await conformance.status_of(h, 1) is None
        assert await conformance.status_of(h, 0) == {"id": 0, "status": "healthy"}

    run(scenario)


def test_metrics_follow_the_ft_status() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        await conformance.complete(h, 0, "count me")
        await conformance.apply(h, 0, {"instruction": "retry", "request_id": "rejected"})
        await conformance.inject(h, 0, "transient")
        await h.settle()
        text = (await h.client(0).get("/metrics")).text
        assert 'heteroflow_engine_sim_status{dp_rank="0",status="unhealthy"} 1.0' in text
        assert 'heteroflow_engine_sim_requests_completed_total{dp_rank="0"} 1.0' in text
        assert 'heteroflow_engine_sim_ft_commands_total{dp_rank="0",outcome="rejected"} 1.0' in text
        assert 'heteroflow_engine_sim_collective_faults_total{dp_rank="0"} 1.0' in text

    run(scenario)


def test_vllm_034_an_aborted_in_flight_request_answers_200_abort_and_diagnosing_shows_in_the_metrics() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        core = h.cores[0]
        request = asyncio.ensure_future(
            h.client(0).post("/v1/completions", json={"prompt": "a long answer", "max_tokens": 256})
        )
        await h.settle()  # the request reached the engine and is generating (one token per loop turn)
        assert core.status().in_flight == 1
        core.inject(FaultKind.TRANSIENT)
        resp = await request
        assert resp.status_code == 200
        assert resp.json()["choices"][0]["finish_reason"] == "abort"
        assert resp.json()["choices"][0]["text"] == ""
        await h.settle()
        assert (await conformance.status_of(h, 0) or {})["status"] == "diagnosing"
        text = (await h.client(0).get("/metrics")).text
        assert 'heteroflow_engine_sim_status{dp_rank="0",status="diagnosing"} 1.0' in text

    run(scenario, diagnosing_sec=5.0)
