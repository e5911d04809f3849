"""A fallback never relaunches a rank on a card with a standing hardware fault (``core/relaunch.py``).

The real controller, two real NodeManagers and the simulator's fake engines (``controller_harness``), pods on
nodes whose endpoints register their cards (rank 3 runs on node b's second card). A hardware fault that no
software evidence confirms within the correlation window rebuilds the whole instance (A12); here that fault
stands while it does. Locally the instance comes back without the rank (the fault arrives through the platform's
hardware-event feed, as XIDs an agent posted), or says why it cannot and relaunches nothing until the fault
clears; on Kubernetes the pod is deleted for replacement and the instance is relaunched on the new cards.

The simulator's in-process engines cannot be started again once stopped, so where a relaunch must succeed
:func:`relaunched_in_place` answers the NodeManagers' engines restart for them (what they would have stopped and
started, the retired set the controller sent) and leaves the engines running: the controller's side — the
plan, the restart bodies, the wait for ready engines, the runtime, the publication — is the real one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from heteroflow.contracts.serving import NM_ENGINES_RESTART_PATH, DeviceInfo, EnginesResponse, EnginesStartRequest
from heteroflow.core.clock import SystemClock
from heteroflow.serving.controller.monitor import GpuHealthSource
from heteroflow.serving.controller.testing import RecordingPodReplacement
from heteroflow.storage.db import create_db_engine, upgrade_database
from tests.integration.serving.controller_harness import Plane, loop_now, run_plane
from tests.integration.serving.test_hardware_faults import (
    GPU_DEVICES,
    GPU_NODES,
    GPU_UUIDS,
    NODES,
    NPU_DEVICES,
    SHORT_WINDOW,
    monitoring,
    report,
)
from tests.support.harness import running_server
from tests.support.polling import eventually

RANK_3_CARD = {"node_name": "node-b", "card": "Ascend910-1", "fault_code": "80E18402", "level": 6}


POD_RANKS = {"a": [0, 1], "b": [2, 3]}


def relaunched_in_place(plane: Plane) -> list[tuple[str, list[int]]]:
    """Answer every engines restart as the NodeManager would, without stopping the engines; returns the
    (pod, retired set) of each restart asked for, in order."""
    asked: list[tuple[str, list[int]]] = []

    async def restart(pod: str, request: httpx.Request) -> httpx.Response | None:
        if request.url.path != NM_ENGINES_RESTART_PATH:
            return None
        body = EnginesStartRequest.model_validate_json(request.content)
        retired = sorted(body.retired_endpoint_ids or [])
        asked.append((pod, retired))
        mine = POD_RANKS[pod]
        answer = EnginesResponse(
            stopped_endpoint_ids=mine,
            started_endpoint_ids=[r for r in mine if r not in retired],
            retired_endpoint_ids=[r for r in mine if r in retired],
        )
        return httpx.Response(200, json=answer.model_dump(mode="json"))

    plane.hooks.append(restart)
    return asked


async def fallbacks(plane: Plane) -> list[dict[str, Any]]:
    """Every fallback's timeline, oldest first."""
    response = await plane.http.get("/controller/fault_tolerance/rounds", params={"instance_id": "inst-1"})
    assert response.status_code == 200, response.text
    found = []
    for summary in response.json():
        if summary["kind"] == "fallback":
            found.append(await plane.round(summary["request_id"]))
    return found


def kinds(timeline: dict[str, Any]) -> list[str]:
    return [e["kind"] for e in timeline["events"]]


def restarts(timeline: dict[str, Any]) -> dict[str, tuple[list[int], list[int]]]:
    """pod → (retired, started) of each engines restart the fallback sent."""
    return {e["pod_id"]: (e["retired"], e["started"]) for e in timeline["events"] if e["kind"] == "engines_restart"}


async def metric(plane: Plane, line_start: str) -> str:
    text = (await plane.http.get("/metrics")).text
    (line,) = [line for line in text.splitlines() if line.startswith(line_start)]
    return line


def test_locally_a_rebuild_comes_back_without_the_rank_on_a_card_the_feed_reported_faulty(tmp_path: Any) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'platform.db'}")
    upgrade_database(engine)
    try:
        with running_server(engine) as platform:
            agent = platform.token("agent")
            node_b = platform.register(agent, GPU_NODES["b"])
            cards = [{"index": i, "uuid": GPU_UUIDS[2 + i], "ecc_uncorrected_total": 0} for i in range(2)]
            assert platform.beat(agent, node_b, cards).status_code == 200
            platform.drain()
            monitor_token = platform.token("nodes:read")

            async def scenario(plane: Plane) -> None:
                asked = relaunched_in_place(plane)
                source = GpuHealthSource(
                    base_url="http://platform",
                    token=monitor_token,
                    poll_sec=0.05,
                    hold_sec=300.0,
                    clock=SystemClock(),
                    transport=httpx.ASGITransport(app=platform.client.app),
                )
                async with monitoring(plane, [source]) as monitor:
                    await eventually(
                        lambda: monitor.status().source("gpu-health").snapshots > 0, within=5, what="first poll"
                    )
                    gone = {"index": 1, "uuid": GPU_UUIDS[3], "xid": 79, "occurred_at": "2026-03-01T11:59:00Z"}
                    beat = await asyncio.to_thread(platform.beat, agent, node_b, [], xid_events=[gone])
                    assert beat.json()["xid_events"]["stored"] == 1
                    key = f"XID79|{GPU_UUIDS[3]}|gpu-node-b"
                    # no engine confirms it within the window: the whole instance is rebuilt, without rank 3
                    status = await plane.until(
                        lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["can_serve"], within=20, what="rebuilt"
                    )
                    assert status["dead_committed"] == [3]
                    assert status["alive_dp_ranks"] == [0, 1, 2]
                    assert status["published_endpoints"] == [0, 1, 2]
                    assert status["standing_hardware_faults"] == [key]
                    assert status["relaunch"] == {
                        "kind": "WITHOUT_RANKS",
                        "reason_code": "standing_fault_ranks_left_out",
                        "reason": "ranks 3 run on cards with a standing hardware fault: the instance is relaunched "
                        "without them (3 of 4 DP ranks)",
                        "ranks": [3],
                        "faults": [key],
                        "pods": [],
                        "gate_reasons": [],
                    }
                    assert status["last_error"] is None
                    (fallback,) = await fallbacks(plane)
                    assert fallback["outcome"] == "succeeded"
                    assert "ranks_left_out" in kinds(fallback)
                    assert asked == [("a", [3]), ("b", [3])]  # every NodeManager's retired set: rank 3 left out
                    assert restarts(fallback) == {"pod-a": ([], [0, 1]), "pod-b": ([3], [2])}
                    # the evidence was reset by the rebuild; the standing fault was not: a later rebuild skips it too
                    inst = plane.controller.instances["inst-1"]  # type: ignore[index]
                    assert inst.evidence.hardware_seen == {}
                    assert list(inst.standing.faults) == [key]

            run_plane(
                scenario, tmp_path, node_names=GPU_NODES, device_infos=GPU_DEVICES, ft=SHORT_WINDOW, virtual_time=False
            )
    finally:
        engine.dispose()


def test_locally_an_instance_that_cannot_run_without_the_ranks_says_why_and_resumes_when_the_fault_clears(
    tmp_path: Any,
) -> None:
    async def scenario(plane: Plane) -> None:
        asked = relaunched_in_place(plane)
        node_a = {"node_name": "node-a", "card": "", "fault_code": "NODE_DOWN", "level": 6, "source": "operator"}
        node_b = {**node_a, "node_name": "node-b"}
        await report(plane, **node_a)
        await report(plane, **node_b)
        status = await plane.until(
            lambda s: (s["relaunch"] or {}).get("kind") == "REFUSED", within=10, what="the relaunch refused"
        )
        assert status["phase"] == "RECONFIGURING"
        assert status["relaunch"]["reason_code"] == "standing_fault_every_rank"
        assert status["relaunch"]["ranks"] == [0, 1, 2, 3]
        assert status["last_error"].startswith("RELAUNCH_REFUSED: every rank to start (0, 1, 2, 3) runs on a card")
        assert status["intervention_required"] is None  # nothing was relaunched, so no attempt was spent
        assert await metric(plane, 'heteroflow_controller_relaunch_refused{instance_id="inst-1"}') == (
            'heteroflow_controller_relaunch_refused{instance_id="inst-1"} 1.0'
        )
        # no relaunch loop: well past every back-off, still one fallback that restarted nothing
        watch_until = loop_now() + 70.0
        while loop_now() < watch_until:
            assert asked == []
            await asyncio.sleep(1.0)  # watching for a relaunch that must not come
        (fallback,) = await fallbacks(plane)
        assert fallback["outcome"] == "refused"
        assert restarts(fallback) == {}
        assert asked == []  # not one engine was restarted
        assert (await plane.status())["phase"] == "RECONFIGURING"
        # node b is repaired: the fallback runs again, and the instance comes back on it alone
        await report(plane, **node_b, cleared=True)
        status = await plane.until(
            lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["can_serve"], within=20, what="back on node b"
        )
        assert status["dead_committed"] == [0, 1]
        assert status["relaunch"]["kind"] == "WITHOUT_RANKS"
        assert status["standing_hardware_faults"] == ["NODE_DOWN||node-a"]
        assert await metric(plane, 'heteroflow_controller_relaunch_refused{instance_id="inst-1"}') == (
            'heteroflow_controller_relaunch_refused{instance_id="inst-1"} 0.0'
        )
        first, second = await fallbacks(plane)
        assert "relaunch_refused" in kinds(first)
        assert second["outcome"] == "succeeded"
        assert asked == [("a", [0, 1]), ("b", [0, 1])]
        assert restarts(second) == {"pod-a": ([0, 1], []), "pod-b": ([], [2, 3])}

    run_plane(scenario, tmp_path, node_names=NODES, device_infos=NPU_DEVICES, ft=SHORT_WINDOW)


def test_on_kubernetes_the_pod_is_deleted_for_replacement_and_the_instance_relaunched_on_its_new_cards(
    tmp_path: Any,
) -> None:
    async def scenario(plane: Plane) -> None:
        asked = relaunched_in_place(plane)
        ctrl = plane.controller

        async def comes_back(pod_id: str) -> None:
            """What the StatefulSet and the scheduler do: the pod is created again, on the node's other cards."""
            old = ctrl.pods[pod_id].registration
            moved = [
                e.model_copy(update={"device_infos": [DeviceInfo(device_id=f"Ascend910-{4 + e.id}", index=4 + e.id)]})
                for e in old.endpoints
            ]
            body = old.model_copy(update={"endpoints": moved}).model_dump(mode="json")
            response = await plane.http.post("/controller/node_manager/register", json=body)
            assert response.status_code == 200, response.text

        replacement = RecordingPodReplacement(on_replace=comes_back, failures=1)
        ctrl.pod_replacement = replacement
        # before any replacement a pod may not change its cards (F-31)
        old = ctrl.pods["pod-b"].registration
        changed = old.model_copy(
            update={"endpoints": [e.model_copy(update={"device_infos": []}) for e in old.endpoints]}
        )
        refused = await plane.http.post("/controller/node_manager/register", json=changed.model_dump(mode="json"))
        assert refused.status_code == 409, refused.text
        await report(plane, **RANK_3_CARD, source="operator")
        status = await plane.until(
            lambda s: s["phase"] == "NORMAL" and s["can_serve"] and s["relaunch"] is not None,
            within=20,
            what="relaunched on the replaced pod",
        )
        assert replacement.replaced == ["pod-b"]  # the first deletion failed and was retried once
        assert status["dead_committed"] == []
        assert status["published_endpoints"] == [0, 1, 2, 3]
        assert status["relaunch"]["kind"] == "REPLACE_PODS"
        assert status["relaunch"]["pods"] == ["pod-b"]
        assert status["relaunch"]["reason_code"] == "standing_fault_pods_replaced"
        pod_b = next(p for p in status["pods"] if p["pod_id"] == "pod-b")
        assert [r["devices"] for r in pod_b["ranks"]] == [
            [{"device_id": "Ascend910-6", "index": 6}],
            [{"device_id": "Ascend910-7", "index": 7}],
        ]
        (fallback,) = await fallbacks(plane)
        events = kinds(fallback)
        assert events.index("fallback_failed") < events.index("pods_replaced") < events.index("engines_restart")
        assert asked == [("a", []), ("b", [])]  # the replaced pod comes back whole: nothing left out
        assert restarts(fallback) == {"pod-a": ([], [0, 1]), "pod-b": ([], [2, 3])}
        # the fault still stands, but on a card the instance no longer uses: a later rebuild stays in place
        assert status["standing_hardware_faults"] == ["80E18402|Ascend910-1|node-b"]

    run_plane(scenario, tmp_path, node_names=NODES, device_infos=NPU_DEVICES, ft=SHORT_WINDOW)
