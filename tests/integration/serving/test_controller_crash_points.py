"""Crash injection in process (F-32, A17), on virtual time: the controller's crash hook fires at each step
boundary of a round, which cuts everything it can reach (NodeManagers, Coordinator, store) as a killed process
loses it; a new controller starts on the same store. A round in flight is never replayed: it becomes
RECONFIGURING with its fallback (including the commit window where the NodeManagers committed and the controller
had not persisted yet); a persisted SCALED_DOWN_RUNNING is kept and republished.

The same rows run against the real process, killed by its own exit, in ``test_controller_restart.py``.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from heteroflow.serving.controller.crash_hook import CRASH_EXIT_CODE, CRASH_STEPS
from tests.integration.serving.controller_harness import Plane, run_plane
from tests.integration.serving.test_controller_restart import APPLIED_BEFORE_CRASH

APPLY_PATH = "/node-manager/fault-tolerance/apply"


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_a_controller_stopped_at_a_step_boundary_never_replays_the_round(tmp_path: Path, step: str) -> None:
    applies: list[tuple[str, str]] = []

    async def count_applies(pod: str, request: httpx.Request) -> httpx.Response | None:
        if request.url.path == APPLY_PATH:
            applies.append((pod, httpx.Response(200, content=request.content).json()["request_id"]))
        return None

    async def scenario(plane: Plane) -> None:
        plane.hooks.append(count_applies)
        await plane.kill_and_traffic(1)
        assert await plane.killed(within=30) == CRASH_EXIT_CODE
        applied = list(applies)
        assert len(applied) == APPLIED_BEFORE_CRASH[step]
        round_id = applied[0][1] if applied else None

        await plane.restart_controller()
        if step == "after_round_persisted":
            status = await plane.until(
                lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["serving_published"],
                within=30,
                what="the committed round is kept and republished",
            )
            assert status["dead_committed"] == [1]
        else:
            status = await plane.until(
                lambda s: s["phase"] == "RECONFIGURING", within=30, what="the interrupted round falls back"
            )
            assert status["fallback_strategy"] == "InstanceReconfiguration"
            assert status["last_error"]
            assert status["pending_removed_ranks"] == []
            # the fallback really runs: every engine relaunched through the NodeManagers, nothing retired
            await plane.until(
                lambda s: all(len(launcher.launched) >= 4 for launcher in plane.launchers.values()),
                within=30,
                what="the fallback relaunches the engines",
            )
            for nm in plane.node_managers.values():
                assert nm.service_state.retired == frozenset()
        # no second apply, ever: neither a replay of the old round nor a new round on the restored state
        assert applies == applied
        if round_id is not None:
            assert {rid for _, rid in applies} == {round_id}

    run_plane(scenario, tmp_path, crash_at=step)
