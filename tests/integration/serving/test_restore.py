"""Capacity back: a scaled-down instance restored to its configured size by a planned relaunch at full size.

The real controller, two real NodeManagers and the simulator's fake engines speaking vLLM 0.34 (pod ``a`` runs
ranks 0-1, pod ``b`` ranks 2-3). Each scenario first scales the instance down by killing rank 2's worker. The
in-process fake engines do not come back from a relaunch, so these scenarios check what the controller asks for
and records; the relaunched instance serving again (and the degraded one after a failure) is checked on real
processes in ``tests/e2e/test_restore.py``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from heteroflow.contracts.serving import NM_ENGINES_RESTART_PATH
from tests.integration.serving.controller_harness import Plane, loop_now, run_plane
from tests.support.polling import eventually

RESTORE = "/controller/fault_tolerance/instances/inst-1/restore"


def events(timeline: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in timeline["events"] if e["kind"] == kind]


async def scaled_down(plane: Plane) -> dict[str, Any]:
    await plane.kill_and_traffic(2)
    return await plane.until(
        lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["dead_committed"] == [2] and s["can_serve"],
        within=30,
        what="rank 2 committed dead",
    )


def restart_bodies(plane: Plane) -> list[tuple[str, list[int]]]:
    """Record every engine restart the controller asks of a NodeManager: (pod, retired set)."""
    seen: list[tuple[str, list[int]]] = []

    async def record(name: str, request: httpx.Request) -> httpx.Response | None:
        if request.url.path == NM_ENGINES_RESTART_PATH:
            seen.append((name, json.loads(request.content)["retired_endpoint_ids"]))
        return None

    plane.hooks.append(record)
    return seen


def test_a_restore_relaunches_every_rank_at_the_configured_size(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        before = await scaled_down(plane)
        assert before["restorable"] == "ready"
        assert before["restore"] is None
        restarts = restart_bodies(plane)
        answer = await plane.http.post(RESTORE)
        assert answer.status_code == 202, answer.text
        request_id = answer.json()["request_id"]
        status = await plane.until(
            lambda s: s["restore"] is not None and s["running_strategy"] == "restore", within=5, what="restoring"
        )
        assert status["restore"]["state"] == "running"
        assert status["restore"]["ranks"] == [2]
        assert status["restore"]["requested_by"] == "operator"
        assert status["last_error"].startswith("RESTORING")
        # a second restore while the first runs is refused, with the reason
        again = await plane.http.post(RESTORE)
        assert again.status_code == 409
        assert again.json()["error"] == "restore_refused"
        assert "restore strategy is running" in again.json()["detail"]
        await plane.until(lambda s: len(restarts) >= 2, within=10, what="both pods restarted")
        # every NodeManager's retired set emptied: rank 2 starts again, the group at its configured size
        assert sorted(restarts[:2]) == [("a", []), ("b", [])]
        timeline = (await plane.http.get(f"/controller/fault_tolerance/rounds/{request_id}")).json()
        assert timeline["kind"] == "restore"
        (requested,) = events(timeline, "restore_requested")
        assert requested["ranks"] == [2]
        assert requested["alive"] == [0, 1, 3]
        assert requested["original"] == [0, 1, 2, 3]
        assert [e["to"] for e in events(timeline, "phase")] == ["RECONFIGURING"]
        assert sorted(e["pod_id"] for e in events(timeline, "engines_restart")) == ["pod-a", "pod-b"]
        # the instance's view was withdrawn for the relaunch: the Coordinator routes or holds the model's requests
        assert plane.coordinator.published() == []

    run_plane(scenario, tmp_path, diagnosing_sec=0.5, profile_name="vllm-0.34")


def test_engines_refusing_the_full_size_start_fail_the_restore_into_the_degraded_relaunch(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        await scaled_down(plane)
        restarts = restart_bodies(plane)

        async def refuse_full_size(name: str, request: httpx.Request) -> httpx.Response | None:
            # pod b's NodeManager cannot start the full-size group; the degraded group's start goes through
            if (
                name == "b"
                and request.url.path == NM_ENGINES_RESTART_PATH
                and json.loads(request.content)["retired_endpoint_ids"] == []
            ):
                return httpx.Response(500, json={"error": "engine_start_failed", "detail": "engines refused to start"})
            return None

        plane.hooks.append(refuse_full_size)
        answer = await plane.http.post(RESTORE)
        assert answer.status_code == 202, answer.text
        request_id = answer.json()["request_id"]

        async def failed() -> dict[str, Any] | None:
            timeline = (await plane.http.get(f"/controller/fault_tolerance/rounds/{request_id}")).json()
            return timeline if events(timeline, "restore_failed") else None

        timeline = await eventually(failed, within=30, what="the restore failed")
        assert "500" in events(timeline, "restore_failed")[0]["error"]
        # the survivors relaunched as they ran: rank 2 still retired on both pods
        await plane.until(lambda s: ("b", [2]) in restarts and ("a", [2]) in restarts, within=30, what="degraded")
        status = await plane.status()
        assert status["dead_committed"] == [2]
        assert status["fallback_strategy"] == "EngineRelaunch"
        assert status["running_strategy"] == "restore"  # its degraded relaunch runs inside the restore

    run_plane(scenario, tmp_path, profile_name="vllm-0.34")


def test_the_automatic_policy_waits_its_delay_and_the_route_refuses_what_it_cannot(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        # a running instance at full size has nothing to restore; an unknown one is 404; no token is 401
        refused = await plane.http.post(RESTORE)
        assert refused.status_code == 409
        assert "nothing to restore" in refused.json()["detail"]
        unknown = await plane.http.post("/controller/fault_tolerance/instances/nope/restore")
        assert unknown.status_code == 404
        anonymous = await plane.http.post(RESTORE, headers={"Authorization": "Bearer wrong"})
        assert anonymous.status_code == 401
        scaled = await scaled_down(plane)
        committed_at = loop_now()
        assert scaled["restore"] is None
        status = await plane.until(lambda s: s["restore"] is not None, within=30, what="the policy restores")
        assert loop_now() - committed_at >= 2.0  # not before auto_restore_delay_sec
        assert status["restore"]["requested_by"] == "auto_restore"
        assert status["restore"]["ranks"] == [2]

    run_plane(scenario, tmp_path, ft={"auto_restore": True, "auto_restore_delay_sec": 2.0})


def test_without_the_policy_a_scaled_down_instance_stays_degraded(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        await scaled_down(plane)
        await asyncio.sleep(10.0)  # virtual time: ten seconds of the controller's loops, far past any delay
        status = await plane.status()
        assert status["restore"] is None
        assert status["dead_committed"] == [2]
        assert status["restorable"] == "ready"

    run_plane(scenario, tmp_path, ft={"auto_restore_delay_sec": 0.5})
