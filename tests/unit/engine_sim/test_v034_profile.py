"""The simulator in profile ``vllm-0.34`` against every fact of that profile in ``engine-protocol.md``.

The fake cluster's engines run on a fake clock that a pump moves while the checks await (the ten-second
check-in and the diagnosis take engine seconds, not real ones).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from heteroflow.contracts.engine_protocol import TERMINAL_FAULT_INFO, checkin_failure_text
from heteroflow.engine_sim import conformance, v034_conformance
from heteroflow.engine_sim.fake import FAKE_ELASTIC_EP_TEXT
from heteroflow.engine_sim.testing import FakeEngineCluster

PUMP_SEC = 0.05
"""Engine seconds the fake clock moves per real 10 ms while a check awaits (autojump)."""


def run(scenario: Callable[[FakeEngineCluster], Awaitable[object]], **cluster_args: object) -> None:
    async def main() -> None:
        args: dict[str, object] = {"dp_size": 4, "diagnosing_sec": 1.0, **cluster_args}
        cluster = FakeEngineCluster(**args)  # type: ignore[arg-type]
        await cluster.start()

        async def pump() -> None:
            while True:
                await asyncio.sleep(0.01)
                cluster.clock.advance(PUMP_SEC)
                cluster.tick()

        pumping = asyncio.create_task(pump())
        try:
            await scenario(cluster)
        finally:
            pumping.cancel()
            await cluster.close()

    asyncio.run(main())


def test_the_default_profile_is_vllm_034() -> None:
    assert FakeEngineCluster(dp_size=2).profile_name == "vllm-0.34"


def test_routes_400_texts_and_the_202_body_are_vllm_034s() -> None:
    run(lambda h: v034_conformance.v034_routes_and_errors(h, 1))


def test_a_fault_reads_as_vllm_034_from_diagnosing_to_a_terminal_failure() -> None:
    seen: dict[str, object] = {}

    async def scenario(h: FakeEngineCluster) -> None:
        seen.update(await v034_conformance.v034_round(h))

    run(scenario)
    assert seen["statuses"] == ["diagnosing", "unhealthy"]
    assert seen["rejected_while_diagnosing"] is True
    partial = seen["partial_dispatch"]
    assert isinstance(partial, dict)
    assert partial["status"] == "unhealthy"
    assert partial["ft_state"] == "failed"
    assert partial["ft_error"] == checkin_failure_text(str(partial["last_ft_request_id"]))
    terminal = seen["terminal"]
    assert isinstance(terminal, dict)
    assert terminal["fault_info"] == TERMINAL_FAULT_INFO


def test_the_elastic_ep_routes_answer_as_vllm_034s() -> None:
    run(lambda h: v034_conformance.v034_elastic_ep(h, 0), enable_elastic_ep=True)


def test_without_enable_elastic_ep_the_routes_do_not_exist() -> None:
    async def scenario(h: FakeEngineCluster) -> None:
        resp = await h.client(0).post("/is_scaling_elastic_ep", json={})
        assert resp.status_code == 404

    run(scenario)


def test_after_a_scale_down_a_resize_to_the_launch_size_is_answered_at_once_and_fills_no_hole() -> None:
    """An FT scale_down keeps vLLM's data_parallel_size (the dead set grows instead): a request for that size is
    "already" done (async_llm.py L1327-1334), 200 with no epoch, and the removed rank stays removed."""

    async def scenario(h: FakeEngineCluster) -> None:
        h.kill_worker(2)
        await h.settle()
        await conformance.traffic(h, [0, 1, 3])
        await conformance.wait_status(h, [0, 1, 3], "unhealthy", within=10.0)
        body = {
            "instruction": "scale_down",
            "request_id": "sd",
            "params": {"removed_dp_ranks": [2], "dp_master_ip": "127.0.0.1", "dp_store_port": 29999},
        }
        for rank in (0, 1, 3):
            await conformance.apply(h, rank, body)
        await conformance.wait_status(h, [0, 1, 3], "healthy", within=10.0)
        resp = await h.client(0).post("/scale_elastic_ep", json={"new_data_parallel_size": 4})
        assert resp.status_code == 200
        assert resp.json() == {"message": "Scaled to 4 data parallel engines"}
        status = (await h.client(0).post("/is_scaling_elastic_ep", json={})).json()
        assert status["phase"] == "idle"
        assert status["epoch"] is None
        info = await conformance.sim_info(h, 0)
        assert info["members"] == [0, 1, 3]
        assert info["dead_ranks"] == [2]

    run(scenario, enable_elastic_ep=True)


def test_a_resize_the_in_memory_backend_cannot_run_fails_as_vllm_answers_other_failures() -> None:
    """Any failure but a refusal or a timeout: 500 "Scale failed", the reason in the status (api_router.py
    L77-81); the engine keeps serving (the prepare never switched it)."""

    async def scenario(h: FakeEngineCluster) -> None:
        resp = await h.client(1).post("/scale_elastic_ep", json={"new_data_parallel_size": 1})
        assert resp.status_code == 500
        assert resp.json() == {
            "error": {"message": "Scale failed", "type": "Internal Server Error", "param": None, "code": 500}
        }
        status = (await h.client(1).post("/is_scaling_elastic_ep", json={})).json()
        assert status["phase"] == "failed"
        assert status["is_scaling_elastic_ep"] is False
        assert status["error"] == FAKE_ELASTIC_EP_TEXT
        assert status["requested_data_parallel_size"] == 1
        assert (await conformance.complete(h, 1, "still serving")).status_code == 200

    run(scenario, enable_elastic_ep=True, dp_size=2)


def test_a_smaller_contiguous_world_starts_where_a_launch_with_dead_ranks_cannot_and_scales_down_again() -> None:
    """The survivors of rank 0 of 4 as 0.34 can relaunch them: 3 ranks, 2 slots each, 3 x 2 - 4 = 2 redundant."""
    run(
        lambda h: v034_conformance.v034_smaller_world(h),
        dp_size=3,
        num_experts=4,
        num_redundant_experts=2,
        slots_per_rank=2,
    )
