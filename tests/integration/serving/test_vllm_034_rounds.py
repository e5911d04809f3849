"""The controller's round against engines speaking vLLM 0.34 (the simulator's fakes, profile ``vllm-0.34``).

What 0.34 adds to a round (``engine-protocol.md``): a fault first reads ``diagnosing``; every survivor must get
the round's id within 10 s; a failed ``scale_down`` is terminal. Pod ``a`` runs ranks 0-1, pod ``b`` ranks 2-3.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from heteroflow.contracts.serving import NM_FT_APPLY_PATH
from heteroflow.serving.controller.core.runtime import FallbackStrategy
from tests.integration.serving.controller_harness import Plane, run_plane


def events(timeline: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in timeline["events"] if e["kind"] == kind]


def test_a_diagnosing_survivor_is_waited_for_and_the_apply_reaches_every_survivor_at_once(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.kill_and_traffic(1)
        status = await plane.until(
            lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["dead_committed"] == [1] and s["can_serve"],
            within=30,
            what="rank 1 committed dead",
        )
        assert status["engine_capability"]["protocol_profile"] == "vllm-0.34"
        assert status["engine_capability"]["scale_down_supported"] is True
        timeline = await plane.round(status["request_id"])
        assert timeline["outcome"] == "committed"
        polled = [str(v) for e in events(timeline, "status_poll") for v in e["entries"].values()]
        assert not any("error" in v for v in polled), polled  # no poll of a 0.34 engine is a protocol error
        (dispatch,) = events(timeline, "dispatch")
        assert dispatch["ok"] is True
        assert 0 <= dispatch["spread_sec"] <= dispatch["last_ack_sec"] < dispatch["budget_sec"] == 5.0
        assert all("acknowledged_after_sec" in e for e in events(timeline, "apply"))
        metrics = (await plane.http.get("/metrics")).text
        assert 'heteroflow_controller_apply_dispatch_seconds_count{measure="spread"} 1.0' in metrics

    run_plane(scenario, tmp_path, diagnosing_sec=1.0, profile_name="vllm-0.34")


def test_a_survivor_not_reached_in_time_stops_the_round_before_vllms_check_in(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        async def slow_apply(name: str, request: httpx.Request) -> httpx.Response | None:
            if name == "b" and request.url.path == NM_FT_APPLY_PATH:
                await asyncio.sleep(4.0)  # pod b's apply is late: past the dispatch budget
            return None

        plane.hooks.append(slow_apply)
        await plane.kill_and_traffic(1)
        status = await plane.until(
            lambda s: s["last_error"] is not None and "did not reach" in s["last_error"],
            within=30,
            what="the round stops at its dispatch budget",
        )
        timeline = await plane.round(status["request_id"])
        dispatch = events(timeline, "dispatch")
        assert [(d["ok"], d["missing"]) for d in dispatch] == [(False, ["pod-b"])]
        (failed,) = events(timeline, "failed")
        assert "within 1 s" in failed["error"]
        assert failed["terminal"] is False
        # stopped at the budget: the failure comes one second after the apply went out, not at vLLM's 10 s
        (apply_phase,) = [e for e in events(timeline, "phase") if e["to"] == "SCALING_DOWN"]
        assert failed["t_sec"] - apply_phase["t_sec"] < 2.0

    run_plane(scenario, tmp_path, ft={"apply_dispatch_budget_sec": 1.0})


def test_a_terminal_scale_down_failure_goes_to_the_whole_instance_path_at_once(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        # rank 0 alone cannot hold the 4 experts in its 2 slots: vLLM 0.34's vote fails, the engine is dead for good
        launched_before = {name: len(launcher.launched) for name, launcher in plane.launchers.items()}
        await plane.kill_and_traffic(1, 2, 3)
        status = await plane.until(
            lambda s: s["last_error"] is not None and "failed terminally" in s["last_error"],
            within=30,
            what="the round fails terminally",
        )
        assert status["fallback_strategy"] == "InstanceReconfiguration"
        timeline = await plane.round(status["request_id"])
        (failed,) = events(timeline, "failed")
        assert failed["terminal"] is True
        assert "Recovery failed; full restart required" in failed["error"]
        # no deadline waited out: the terminal status ends the round within a few polls of the apply
        (apply_phase,) = [e for e in events(timeline, "phase") if e["to"] == "SCALING_DOWN"]
        assert failed["t_sec"] - apply_phase["t_sec"] < 2.0
        # every engine of the instance is relaunched, none left out as retired (a full rebuild)
        await plane.until(
            lambda s: all(len(plane.launchers[n].launched) >= launched_before[n] + 2 for n in plane.launchers),
            within=10,
            what="every engine relaunched",
        )
        assert status["dead_committed"] == []

    # the configured fallback (a relaunch of the survivors in place) is overridden: a released engine cannot be
    # started with ranks already dead, and the engines said only a full restart helps
    run_plane(scenario, tmp_path, fallback=FallbackStrategy.ENGINE_RELAUNCH)
