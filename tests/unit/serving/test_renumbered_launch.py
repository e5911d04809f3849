"""A launch without some ranks: the survivors run as a smaller, contiguous world, and the NodeManager translates.

A released vLLM cannot be started with ranks already dead (``engine-protocol.md``), so original ranks 1, 2, 3 of
an instance of 4 whose rank 0 is retired run as engine ranks 0, 1, 2 of a world of 3. The engines are the
simulator's in-process fakes of that 3-rank world; one NodeManager runs endpoints 1-3 and is told rank 0 was
retired before the launch. Everything above it (the controller, the status, the Coordinator's view) keeps the
original ids: the NodeManager translates the launch line, each engine's FT status ``id`` and every
``removed_dp_ranks``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from heteroflow.contracts.serving import (
    NM_FT_APPLY_PATH,
    NM_FT_GUARD_PATH,
    NM_FT_STATUS_PATH,
    EngineRank,
    FtFlags,
)
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.testing import FakeEngineCluster
from heteroflow.serving.node_manager.assembly import create_app
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN, FakeController, FakeLauncher

from .harness import make_node_manager

HEADERS = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}


def test_a_launch_without_rank_0_runs_renumbered_and_every_answer_is_translated() -> None:
    async def main() -> None:
        # the engines' own world: 3 ranks of 2 slots, 4 logical + 2 redundant experts (what the NodeManager asks)
        cluster = FakeEngineCluster(dp_size=3, num_redundant_experts=2, profile_name="vllm-0.34")
        await cluster.start()
        controller = FakeController(flags=FtFlags(enable_dp_scale_down_proxy=True))

        def kill(endpoint_id: int) -> None:
            cluster.cores[endpoint_id - 1].exit_requested.set()

        nm, launcher = make_node_manager(
            cluster,
            controller,
            (1, 2, 3),
            name="a",
            launcher=FakeLauncher(on_kill=kill),
            client_for=lambda endpoint_id: cluster.client(endpoint_id - 1),
            spec_extra={"dead_ranks": [0]},
        )
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(nm, cluster_token=TEST_CLUSTER_TOKEN)), base_url="http://nm"
        )
        try:
            await nm.start(loops=False)
            await nm.controller_once()
            # the launch line: a world of 3, each engine at its position among the started ranks
            for endpoint_id, engine_rank in ((1, 0), (2, 1), (3, 2)):
                argv = list(launcher.current(endpoint_id).command.argv)
                assert argv[argv.index("--dp-size") + 1] == "3"
                assert argv[argv.index("--dp-rank") + 1] == str(engine_rank)
                assert argv[argv.index("--num-redundant-experts") + 1] == "2"  # 3 ranks x 2 slots - 4 logical
                assert "--dead-ranks" not in argv
            await cluster.settle()
            for endpoint_id in (1, 2, 3):
                assert await nm.check_ready(endpoint_id)
                await nm.poll_once(endpoint_id)

            async def entries() -> dict[int, dict[str, Any]]:
                response = await http.post(NM_FT_STATUS_PATH, json={"endpoint_ids": [1, 2, 3]}, headers=HEADERS)
                assert response.status_code == 200, response.text
                return {e["endpoint_id"]: e for e in response.json()["entries"]}

            # each engine answers with its own id; the NodeManager reports it under the endpoint's
            found = await entries()
            assert {e: (found[e]["status"]["id"], found[e]["status"]["status"]) for e in found} == {
                1: (1, "healthy"),
                2: (2, "healthy"),
                3: (3, "healthy"),
            }
            status = nm.status()
            assert [(e.endpoint_id, e.engine_rank, e.engine_dp_size) for e in status.endpoints] == [
                (1, 0, 3),
                (2, 1, 3),
                (3, 2, 3),
            ]
            assert nm.heartbeat().engine_ranks == [
                EngineRank(endpoint_id=1, engine_rank=0, dp_size=3),
                EngineRank(endpoint_id=2, engine_rank=1, dp_size=3),
                EngineRank(endpoint_id=3, engine_rank=2, dp_size=3),
            ]
            # original rank 2 (engine rank 1) dies; the controller names it, cumulatively, in original ids
            cluster.kill_worker(1)
            await conformance.traffic(cluster, [0, 2])
            await cluster.settle()

            async def ready_to_apply() -> bool:
                found = await entries()
                return found[2]["status"]["status"] == "dead" and all(
                    found[e]["status"]["status"] == "unhealthy" for e in (1, 3)
                )

            await cluster.eventually(ready_to_apply, within=5.0, what="rank 2 dead, the others unhealthy")
            guard = await http.post(NM_FT_GUARD_PATH, json={"request_id": "r-1", "lease_sec": 60}, headers=HEADERS)
            assert guard.status_code == 200, guard.text
            body = {
                "instruction": "scale_down",
                "request_id": "r-1",
                "params": {"removed_dp_ranks": [0, 2], "dp_master_ip": "127.0.0.1"},
            }
            answer = await http.post(NM_FT_APPLY_PATH, json=body, headers=HEADERS)
            assert answer.status_code == 202, answer.text
            assert [r["endpoint_id"] for r in answer.json()["results"]] == [1, 3]

            async def healthy() -> bool:
                found = await entries()
                return all(found[e]["status"]["status"] == "healthy" for e in (1, 3))

            await cluster.eventually(healthy, within=5.0, what="the survivors healthy")
            # the engines removed their own rank 1; rank 0, retired before the launch, was never theirs
            for engine_rank in (0, 2):
                assert cluster.cores[engine_rank].state.dead_ranks == {1}
        finally:
            await http.aclose()
            await nm.close()
            await cluster.close()

    asyncio.run(main())
