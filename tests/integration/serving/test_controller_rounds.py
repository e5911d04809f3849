"""The controller end to end over real NodeManagers and the simulator's fake engines (RFC §8 rows).

Each test injects the fault into the engines themselves (a worker dies; survivors meet it in a collective)
and watches the controller, the NodeManagers, the engines and the Coordinator's view. Pod ``a`` (ip
127.0.0.1) runs ranks 0-1, pod ``b`` (127.0.0.2) ranks 2-3.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.contracts.serving import NM_FT_APPLY_PATH, NM_FT_STATUS_PATH
from heteroflow.engine_sim import conformance
from heteroflow.serving.coordinator.testing import TEST_API_KEY
from tests.integration.serving.controller_harness import Plane, loop_now, run_plane

Check = Callable[[dict[str, Any]], bool]


def scaled_down(expected: list[int]) -> Check:
    return lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["dead_committed"] == expected and s["can_serve"]


def reconfiguring(s: dict[str, Any]) -> bool:
    return bool(s["phase"] == "RECONFIGURING")


def events(timeline: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in timeline["events"] if e["kind"] == kind]


async def survivors_answer(plane: Plane, ranks: list[int]) -> None:
    outputs = {rank: await conformance.outputs(plane.cluster, rank) for rank in ranks}
    assert len({tuple(o) for o in outputs.values()}) == 1, outputs  # every survivor computes the same model


def test_a1_one_dead_rank_is_removed_and_survivors_serve(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        baseline = await conformance.outputs(plane.cluster, 0)
        ops_before = len(plane.coordinator.ops)
        await plane.kill_and_traffic(1)
        status = await plane.until(scaled_down([1]), within=20, what="rank 1 committed dead")
        assert status["alive_dp_ranks"] == [0, 2, 3]
        assert status["pending_removed_ranks"] == []
        assert status["last_error"] is None
        assert status["gate"]["allowed"] is True
        assert plane.coordinator.published() == [0, 2, 3]
        ops = plane.coordinator.ops[ops_before:]
        # the dead rank is withdrawn at its first report, before the round; the round withdraws the rest. Until
        # the first report reaches the controller (a NodeManager poll away) only its periodic SET of the whole
        # instance can go out
        first_del = [op for op, _ in ops].index("DEL")  # a first fault report (the dead rank's or a survivor's)
        assert all(op == ("SET", [0, 1, 2, 3]) for op in ops[:first_del]), ops[:first_del]
        ops = ops[first_del:]
        assert [1] in [ids for ids, _ in plane.coordinator.faulted]
        dels = [i for i, (op, _) in enumerate(ops) if op == "DEL"]
        withdrawn = {rank for i in dels for rank in ops[i][1]}
        assert withdrawn == {0, 1, 2, 3}
        assert max(dels) < ops.index(("ADD", [0, 2, 3]))
        timeline = await plane.round(status["request_id"])
        assert timeline["outcome"] == "committed"
        # the round keeps why it started: the decision's reason and each rank's engine status and evidence then
        trigger = timeline["trigger"]
        assert trigger["reason"] == "COMPLETE_SNAPSHOT"
        by_rank = {row["rank"]: row for row in trigger["ranks"]}
        assert by_rank[1]["health"] == "dead"
        assert by_rank[1]["evidence"] is not None
        assert sorted(by_rank) == [0, 1, 2, 3]
        times = timeline["times"]
        moments = [datetime.fromisoformat(times[k]) for k in ("fault_at", "decided_at", "committed_at")]
        assert moments == sorted(moments)
        assert times["serving_resumed_at"] is not None
        assert datetime.fromisoformat(times["serving_resumed_at"]) >= moments[-1]
        # what clients saw comes from the Coordinator, over the window from the fault to after the round
        await plane.until(
            lambda s: bool(plane.coordinator.outcome_queries), within=5, what="the Coordinator asked for clients"
        )
        timeline = await plane.round(status["request_id"])
        assert timeline["clients"]["held"] == 3
        assert timeline["clients"]["longest_wait_sec"] == 7.5
        query = plane.coordinator.outcome_queries[-1]
        assert float(query["since"]) == pytest.approx(moments[0].timestamp(), abs=0.01)
        assert query["instance_id"] == "inst-1"
        applies = events(timeline, "apply")
        assert sorted(e["pod_id"] for e in applies) == ["pod-a", "pod-b"]  # one per routable pod, once
        assert all(e["http_status"] == 202 for e in applies)
        assert all(e["body"]["params"] == {"removed_dp_ranks": [1], "dp_master_ip": "127.0.0.1"} for e in applies)
        assert [e["ok"] for e in events(timeline, "probe")] == [True, True, True]
        assert {e["pod_id"] for e in events(timeline, "finalize")} == {"pod-a", "pod-b"}
        phases = [e["to"] for e in events(timeline, "phase")]
        assert phases[-1] == "SCALED_DOWN_RUNNING"
        assert "POST_SCALE_CLEANUP" in phases
        for nm in plane.node_managers.values():
            assert nm.service_state.retired == {1}
        # inference works on every survivor and the answers agree with the pre-fault model
        await survivors_answer(plane, [0, 2, 3])
        assert await conformance.outputs(plane.cluster, 0) == baseline

    run_plane(scenario, tmp_path)


def test_a3_a4_master_moves_and_rounds_accumulate(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.kill_and_traffic(0)
        first = await plane.until(scaled_down([0]), within=20, what="rank 0 committed dead")
        timeline = await plane.round(first["request_id"])
        assert {e["body"]["params"]["dp_master_ip"] for e in events(timeline, "apply")} == {"127.0.0.1"}  # rank 1
        assert first["alive_dp_ranks"] == [1, 2, 3]  # ids are never renumbered
        await survivors_answer(plane, [1, 2, 3])
        ops_before = len(plane.coordinator.ops)

        await plane.kill_and_traffic(1)
        second = await plane.until(scaled_down([0, 1]), within=20, what="rank 1 committed dead too")
        assert second["request_id"] != first["request_id"]
        timeline = await plane.round(second["request_id"])
        applies = events(timeline, "apply")
        assert [e["pod_id"] for e in applies] == ["pod-b"]  # pod a has no survivor: guard/finalize only
        assert applies[0]["body"]["params"] == {"removed_dp_ranks": [0, 1], "dp_master_ip": "127.0.0.2"}
        assert {e["pod_id"] for e in events(timeline, "guard")} == {"pod-a", "pod-b"}
        assert {e["pod_id"] for e in events(timeline, "finalize")} == {"pod-a", "pod-b"}
        await survivors_answer(plane, [2, 3])
        # the second DEL withdraws only what was published; no later operation brings 0 or 1 back
        ops = plane.coordinator.ops[ops_before:]
        assert [1] in [ids for ids, _ in plane.coordinator.faulted]  # withdrawn at its first report
        withdrawn = [rank for op, ids in ops[: ops.index(("ADD", [2, 3]))] if op == "DEL" for rank in ids]
        assert sorted(withdrawn) == [1, 2, 3]  # each published rank once; 0 was no longer published
        after_add = ops[ops.index(("ADD", [2, 3])) :]
        assert all(not ({0, 1} & set(ids)) for _, ids in after_add)
        await plane.until(lambda s: len(plane.coordinator.ops) > ops_before + 3, within=5, what="a periodic SET")
        assert plane.coordinator.published() == [2, 3]
        assert second["rounds"][-2:] == [first["request_id"], second["request_id"]]

    run_plane(scenario, tmp_path)


def test_a10_several_dead_in_one_apply(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.kill_and_traffic(1, 2)
        status = await plane.until(scaled_down([1, 2]), within=20, what="ranks 1 and 2 committed dead")
        timeline = await plane.round(status["request_id"])
        assert events(timeline, "decided")[0]["candidates"] == [1, 2]
        applies = events(timeline, "apply")
        assert len(applies) == 2
        assert all(e["body"]["params"]["removed_dp_ranks"] == [1, 2] for e in applies)
        assert plane.coordinator.published() == [0, 3]
        await survivors_answer(plane, [0, 3])

    run_plane(scenario, tmp_path)


def test_a10_a_dead_found_during_the_round_is_absorbed(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        killed_late = False

        async def kill_rank_3_at_first_poll(pod: str, request: httpx.Request) -> httpx.Response | None:
            nonlocal killed_late
            if request.url.path == NM_FT_STATUS_PATH and not killed_late and plane.in_round():
                killed_late = True
                plane.cluster.kill_worker(3)  # dies after the decision, before the round's first poll
                await plane.cluster.settle()
            return None

        plane.hooks.append(kill_rank_3_at_first_poll)
        await plane.kill_and_traffic(1)
        status = await plane.until(scaled_down([1, 3]), within=20, what="ranks 1 and 3 committed dead")
        timeline = await plane.round(status["request_id"])
        assert events(timeline, "decided")[0]["candidates"] == [1]
        assert events(timeline, "absorbed")[0]["ranks"] == [3]
        applies = events(timeline, "apply")
        assert len(applies) == 2  # one apply per pod, carrying both DEADs
        assert all(e["body"]["params"]["removed_dp_ranks"] == [1, 3] for e in applies)
        assert plane.coordinator.published() == [0, 2]
        await survivors_answer(plane, [0, 2])

    run_plane(scenario, tmp_path)


def test_a10_no_survivor_left_goes_to_reconfiguration(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        done = False

        async def kill_the_rest(pod: str, request: httpx.Request) -> httpx.Response | None:
            nonlocal done
            if request.url.path == NM_FT_STATUS_PATH and not done and plane.in_round():
                done = True
                for rank in (0, 2, 3):
                    plane.cluster.kill_worker(rank)
                await plane.cluster.settle()
            return None

        plane.hooks.append(kill_the_rest)
        launched_before = {name: len(launcher.launched) for name, launcher in plane.launchers.items()}
        await plane.kill_and_traffic(1)
        status = await plane.until(reconfiguring, within=20, what="reconfiguration")
        assert status["fallback_strategy"] == "InstanceReconfiguration"
        assert status["dead_committed"] == []
        assert "survivor" in (status["last_error"] or "")
        assert not status["can_serve"]
        timeline = await plane.round(status["rounds"][-1])
        assert events(timeline, "apply") == []  # never applied
        assert {e["pod_id"] for e in events(timeline, "finalize") if not e["commit"]} == {"pod-a", "pod-b"}
        # the fallback really relaunches every engine (a full rebuild: nothing retired)
        await plane.until(
            lambda s: all(len(plane.launchers[n].launched) >= launched_before[n] + 2 for n in plane.launchers),
            within=10,
            what="every engine relaunched",
        )
        for nm in plane.node_managers.values():
            assert nm.service_state.retired == frozenset()

    run_plane(scenario, tmp_path)


def test_a15_static_gate_failure_records_the_reason_and_falls_back(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.kill_and_traffic(1)
        status = await plane.until(reconfiguring, within=20, what="gate refusal")
        assert status["gate"]["allowed"] is False
        assert status["gate"]["reason_codes"] == ["EXPERT_REDUNDANCY_REQUIRED"]
        timeline = await plane.round(status["rounds"][-1])
        assert events(timeline, "guard") == []  # refused before any NodeManager was touched
        assert events(timeline, "apply") == []
        assert events(timeline, "coordinator_del") == []  # the round never withdrew the view

    run_plane(scenario, tmp_path, spec_extra={"num_redundant_experts": 0})


def test_a16_engine_failure_after_apply_aborts_without_a_second_apply(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        # three of four ranks gone: the last survivor has 2 expert slots for 4 experts, and the engine says so
        await plane.kill_and_traffic(0, 2, 3)
        status = await plane.until(reconfiguring, within=20, what="the round fails after apply")
        timeline = await plane.round(status["rounds"][-1])
        assert len(events(timeline, "apply")) == 1
        assert "after apply" in (status["last_error"] or "")
        assert {e["pod_id"] for e in events(timeline, "finalize") if not e["commit"]} == {"pod-a", "pod-b"}
        assert status["dead_committed"] == []

    run_plane(scenario, tmp_path)


def test_a16_query_error_and_apply_refusal_fail_the_round(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        async def refuse_apply(pod: str, request: httpx.Request) -> httpx.Response | None:
            if request.url.path == NM_FT_APPLY_PATH and pod == "b":
                return httpx.Response(502, json={"error": "apply_rejected", "detail": "injected"})
            return None

        plane.hooks.append(refuse_apply)
        await plane.kill_and_traffic(1)
        status = await plane.until(reconfiguring, within=20, what="the round fails at apply")
        assert "apply not accepted by pod pod-b" in (status["last_error"] or "")
        timeline = await plane.round(status["rounds"][-1])
        codes = sorted(str(e["http_status"]) for e in events(timeline, "apply"))
        assert codes in (["502"], ["202", "502"])  # pod a may have been applied first; never a second apply
        assert len(events(timeline, "apply")) <= 2

    run_plane(scenario, tmp_path)


def test_a1_under_load_through_the_coordinator_no_request_reaches_a_withdrawn_endpoint(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        assert plane.real_coordinator is not None
        assert plane.engine_router is not None
        assert plane.view_calls is not None
        results: list[tuple[int, float]] = []
        stop = asyncio.Event()
        transport = httpx.ASGITransport(app=plane.real_coordinator)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://coordinator", headers={"Authorization": f"Bearer {TEST_API_KEY}"}
        ) as client:

            async def load() -> None:
                while not stop.is_set():
                    body = {"model": "heteroflow-sim-moe", "prompt": "load", "max_tokens": 4}
                    response = await client.post("/v1/completions", json=body, timeout=30)
                    results.append((response.status_code, loop_now()))
                    if response.status_code != 200:
                        await asyncio.sleep(0.05)  # a client's own back-off after a 503, as Retry-After asks

            workers = [asyncio.create_task(load()) for _ in range(8)]
            await plane.until(lambda s: sum(c == 200 for c, _ in results) >= 20, within=10, what="traffic flows")
            plane.cluster.kill_worker(1)  # the load itself makes the survivors meet the fault
            await plane.until(scaled_down([1]), within=20, what="rank 1 committed under load")
            committed_at = loop_now()
            await plane.until(
                lambda s: sum(c == 200 and t > committed_at for c, t in results) >= 20,
                within=15,
                what="completions answer again through the coordinator",
            )
            stop.set()
            await asyncio.gather(*workers)

        # each rank is judged by its own withdrawals: a rank's first fault report withdraws that rank alone (a
        # DEL of one id), the others stay published, and may be sent to, until their own DEL returns
        views, received = plane.view_calls, plane.engine_router.received
        add = next(c for c in views.calls if c.op == "ADD")
        assert add.published == frozenset({0, 2, 3})
        for rank in range(4):
            windows = views.withdrawn_windows(rank)
            assert [w for w in windows if w[0] < add.sent], f"rank {rank} was never withdrawn before the ADD"
            assert all(end >= add.sent for _, end in windows), f"rank {rank} was published again before the ADD"
            reached = [t for r, t in received if r == rank and any(a < t < b for a, b in windows)]
            assert reached == [], f"rank {rank} was sent requests while withdrawn: {windows}"
        assert views.withdrawn_windows(1)[0][1] == float("inf")  # never the removed rank again
        assert {r for r, t in received if t > add.sent} == {0, 2, 3}

    # real time: the Coordinator waits for a view change on its own clock, not the loop's
    run_plane(scenario, tmp_path, real_coordinator=True, virtual_time=False)
