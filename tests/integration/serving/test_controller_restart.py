"""Crash injection (F-32, A17) against the real process: ``heteroflow controller`` exits through its crash hook
at a step boundary of a round and is started again on the same SQLite store. A round in flight is never
replayed: it becomes RECONFIGURING with its fallback; a persisted SCALED_DOWN_RUNNING is kept and republished.

Every step boundary runs in process on virtual time in ``test_controller_crash_points.py`` (the same
expectations, :data:`APPLIED_BEFORE_CRASH`); here two rows prove the same of the real process, its exit and its
store across processes: a round in flight after its applies, and a round persisted as finished.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from heteroflow.serving.controller.crash_hook import CRASH_EXIT_CODE, CRASH_STEPS
from tests.integration.serving.controller_harness import ProcessPlane, run_process_plane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

APPLIED_BEFORE_CRASH = {
    "after_write_ahead": 0,
    "after_guard": 0,
    "before_apply": 0,
    "after_apply": 2,
    "after_node_manager_commit": 2,
    "after_commit_persisted": 2,
    "after_round_persisted": 2,
}


def test_every_step_has_an_expectation() -> None:
    assert set(APPLIED_BEFORE_CRASH) == set(CRASH_STEPS)


PROCESS_STEPS = ("after_apply", "after_round_persisted")


@pytest.mark.parametrize("step", PROCESS_STEPS)
def test_controller_killed_at_a_step_boundary_never_replays_the_round(tmp_path: Path, step: str) -> None:
    async def scenario(plane: ProcessPlane) -> None:
        plane.start_controller(crash_at=step)
        await plane.until(lambda s: s["phase"] == "NORMAL", within=30, what="the instance is assembled")
        await plane.kill_and_traffic(1)
        assert await plane.exited(within=30) == CRASH_EXIT_CODE, plane.controller_log()
        applied = list(plane.applies)
        assert len(applied) == APPLIED_BEFORE_CRASH[step]
        round_id = applied[0][1] if applied else None

        plane.start_controller()
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
            assert status["last_error"]  # why it is reconfiguring (the restart, then any fallback attempt)
            assert "controller.runtime_restored" in plane.controller_log()
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
        assert plane.applies == applied
        if round_id is not None:
            assert {rid for _, rid in plane.applies} == {round_id}

    run_process_plane(scenario, tmp_path)
