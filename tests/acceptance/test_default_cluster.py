"""Acceptance rows on one default cluster (DP 4 over 2 pods, scale-down on, every other key at its default):
A1 + A5, A3 + A4, A13, A16, A11, A17, A10 + A6, and A10's "no survivor left".

The rows share the cluster in this order because each leaves the state the next needs: two committed rounds
([2], then [0, 2]: cumulative removal, the master moves to rank 1), a hardware fault on a committed rank (cleared
again at the row's end: an L5 fault stands and would keep rank 2 out of the next rebuild), a third
removal the lone survivor cannot take (its expert slots run out: the engine fails after apply, the round aborts
and the instance is rebuilt on 4 ranks), a hardware-first round, a controller killed mid-round (rebuilt again),
two ranks at once, and the last two ranks dying together (rebuilt once more).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heteroflow.local.faults import KillMode, kill
from tests.acceptance.evidence import first_sample, scenario
from tests.acceptance.harness import (
    ClusterUnderTest,
    events,
    log_events,
    running_cluster,
    timestamp,
    traffic,
)
from tests.acceptance.rows import rank_0_dead_moves_the_master, scale_down_rounds
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

POD_A, POD_B = "inst-1-pod-a", "inst-1-pod-b"


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory, evidence_root: Path) -> Iterator[ClusterUnderTest]:
    yield from running_cluster("default", tmp_path_factory, evidence_root, ft={})


def kill_workers(cut: ClusterUnderTest, *ranks: int) -> list[str]:
    """Kill the workers of ``ranks`` within milliseconds (what ``heteroflow fault kill`` does for one rank)."""
    with cut.client() as client:
        return [kill(client, cut.inst, rank, mode=KillMode.WORKER) for rank in ranks]


def test_a1_a5_non_zero_rank_dead_is_removed_by_one_apply_and_survivors_serve(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A01-A05-rank-2-dead-under-traffic") as sc:
        with traffic(cut.state) as load:
            assert "rank 2" in sc.fault("kill", "--rank", "2", target=[2])
            entry = cut.serving([0, 1, 3], dead=[2], within=60)
            after = time.monotonic()
            until(lambda: load.answered_since(after) >= 3, within=30, what="completions answer after the round")
        [timeline] = scale_down_rounds(sc.new_rounds())
        assert timeline["request_id"] == entry["request_id"]
        assert timeline["outcome"] == "committed"
        [decided] = events(timeline, "decided")
        assert (decided["candidates"], decided["survivors"]) == ([2], [0, 1, 3])
        applies = events(timeline, "apply")
        assert sorted(a["pod_id"] for a in applies) == [POD_A, POD_B]  # one apply per pod, never twice
        for apply in applies:
            assert apply["http_status"] == 202
            assert apply["body"]["instruction"] == "scale_down"
            assert apply["body"]["request_id"] == entry["request_id"]
            assert apply["body"]["params"]["removed_dp_ranks"] == [2]  # only the target rank
        assert {a["pod_id"]: a["body"]["endpoint_ids"] for a in applies} == {POD_A: [0, 1], POD_B: [3]}
        kinds = [e["kind"] for e in timeline["events"]]
        assert kinds.index("coordinator_del") < kinds.index("apply")  # withdrawn before any apply
        [add] = events(timeline, "coordinator_add")
        assert add["endpoint_ids"] == [0, 1, 3]
        lines = sc.fact("nm_apply_lines", cut.node_manager_events("ft.apply", entry["request_id"]))
        assert {pod: len(found) for pod, found in lines.items()} == {POD_A: 1, POD_B: 1}
        # the engines really rebuilt without rank 2, ids unchanged
        infos = sc.fact("sim_info_after", {r: cut.sim_info(r) for r in (0, 1, 3)})
        assert all(info["members"] == [0, 1, 3] and info["dp_rank"] == r for r, info in infos.items())
        ft = sc.fact("engine_ft_status_after", {r: cut.engine_ft_status(r)["engines"][0] for r in (0, 1, 3)})
        # vLLM 0.34: the healthy push after the round replaced each entry (no ft_state, id or error left)
        assert ft == {r: {"id": r, "status": "healthy"} for r in (0, 1, 3)}
        # A5: pod b still serves rank 3, so it is not stopped
        assert events(timeline, "pod_stop") == []
        engines = sc.fact("node_manager_view_after", cut.engines())
        assert engines[3]["running"]
        assert engines[3]["ready"]
        assert not engines[3]["retired"]
        assert engines[2]["retired"]
        assert sc.inference(cut.baseline) == cut.baseline


def test_a3_a4_rank_0_dead_moves_the_master_and_the_second_apply_is_cumulative(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 3], dead=[2])
    with scenario(cut, "A03-A04-rank-0-dead-second-round") as sc:
        rank_0_dead_moves_the_master(cut, sc, dead_before=[2])


def test_a13_hardware_fault_on_a_committed_rank_is_handled_without_a_new_round(cut: ClusterUnderTest) -> None:
    before = cut.serving([1, 3], dead=[0, 2])
    window = 5.0  # hardware_ft_correlation_window_sec, default
    with scenario(cut, "A13-hardware-fault-on-committed-rank-2") as sc:
        said = sc.fault("hardware", "--rank", "2", target=[2])
        assert "MAPPED [2]" in said
        sent = time.monotonic()
        # Absence of a reaction can only be observed over the time that would otherwise produce one: an
        # unhandled hardware-first fault would expire its window and reconfigure the instance.
        while time.monotonic() < sent + window + 1.5:
            entry = cut.status()
            assert entry is not None
            assert (entry["phase"], entry["dead_committed"], entry["rounds"]) == (
                "SCALED_DOWN_RUNNING",
                [0, 2],
                before["rounds"],
            ), entry
            time.sleep(0.2)  # observation period of the watch above, not a synchronisation
        assert sc.new_rounds() == []
        logged = [
            e
            for e in log_events(Path(cut.state.log_dir) / "controller.log", "controller.hardware_fault")
            if e.get("ranks") == [2]
        ]
        assert sc.fact("controller_log_hardware_fault", logged[-1:])[0]["mapping"] == "MAPPED"
        assert cut.published() == [1, 3]
        assert sc.inference(cut.baseline) == cut.baseline
        # an L5 fault stands until its source clears it: the operator reports the card healthy again, so that
        # the next whole-instance relaunch starts rank 2 on it
        standing = cut.status()
        assert standing is not None
        assert len(standing["standing_hardware_faults"]) == 1, standing
        assert "cleared" in sc.fault("hardware", "--rank", "2", "--cleared", target=[2])
        cut.standing_faults_cleared()


def test_a16_engine_failure_after_apply_aborts_without_retry_and_falls_back(cut: ClusterUnderTest) -> None:
    cut.serving([1, 3], dead=[0, 2])
    incarnations = {r: e["incarnation"] for r, e in cut.engines().items()}
    with scenario(cut, "A16-lone-survivor-fails-its-rebuild") as sc:
        with traffic(cut.state):
            # rank 3 would be left alone with 2 expert slots for 4 experts: it accepts the apply (202) and fails
            # its rebuild; that is the engine's judgement (F-55: the gate only warns by default)
            sc.fault("kill", "--rank", "1", target=[1])
            cut.wait(lambda s: s["phase"] == "RECONFIGURING", within=60, what="the round fails after apply")
        entry = cut.serving([0, 1, 2, 3], within=180)
        timelines = sc.new_rounds()
        [timeline] = scale_down_rounds(timelines)
        assert timeline["outcome"] == "failed"
        [gate] = events(timeline, "gate")
        assert gate["allowed"] is True
        assert any("expert capacity" in w for w in gate["warnings"])
        [apply] = events(timeline, "apply")  # the only routable pod, once: never retried
        assert (apply["pod_id"], apply["http_status"], apply["body"]["params"]["removed_dp_ranks"]) == (
            POD_B,
            202,
            [0, 1, 2],
        )
        [failed] = events(timeline, "failed")
        assert "after apply" in failed["error"]
        aborts = [e for e in events(timeline, "finalize") if e["commit"] is False]
        assert sorted(e["pod_id"] for e in aborts) == [POD_A, POD_B]
        assert events(timeline, "coordinator_add") == []
        lines = sc.fact("nm_apply_lines", cut.node_manager_events("ft.apply", timeline["request_id"]))
        assert {pod: len(found) for pod, found in lines.items()} == {POD_A: 0, POD_B: 1}
        reconfiguring = first_sample(sc.series(), lambda s: s.get("phase") == "RECONFIGURING")
        assert reconfiguring is not None
        assert reconfiguring["fallback_strategy"] == "InstanceReconfiguration"
        assert "after apply" in (reconfiguring["last_error"] or "")
        [fallback] = [t for t in timelines if t["kind"] == "fallback"]
        assert fallback["outcome"] == "succeeded"
        assert sorted(e["pod_id"] for e in events(fallback, "engines_restart")) == [POD_A, POD_B]
        assert entry["dead_committed"] == []  # a rebuild clears the scale-down history
        after = {r: e["incarnation"] for r, e in cut.engines().items()}
        assert all(after[r] > incarnations[r] for r in range(4)), (incarnations, after)  # really relaunched
        assert sc.inference(cut.baseline) == cut.baseline


def test_a11_hardware_first_then_the_same_rank_dead_scales_down_matched(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A11-hardware-first-then-rank-2-dead") as sc:
        with traffic(cut.state):
            assert "MAPPED [2]" in sc.fault("hardware", "--rank", "2", target=[2])
            reported = time.monotonic()  # the controller has the report: kill at once, the window is running
            sc.inject(
                "heteroflow fault kill --rank 2 (in-process: POST <engine 2>/sim/faults kill_worker)",
                lambda: kill_workers(cut, 2),
                target=[2],
            )
            assert sc.fact("kill_after_report_sec", round(time.monotonic() - reported, 3)) < 5.0
            entry = cut.serving([0, 1, 3], dead=[2], within=60)
        [timeline] = scale_down_rounds(sc.new_rounds())
        assert timeline["request_id"] == entry["request_id"]
        assert timeline["outcome"] == "committed"
        [decided] = events(timeline, "decided")
        assert decided["hardware_matched"] is True
        window = cut.controller_events("controller.decision", since=sc.started_wall, decision="wait:CORRELATION_WINDOW")
        assert window, "no correlation window opened"
        assert timestamp(window[0]["timestamp"]) <= timestamp(decided["at"])  # it opened before the decision
        assert decided["candidates"] == [2]  # the apply parameters come from the software DEAD
        assert decided["fallback"] == "InstanceReconfiguration"  # a matched hardware U+D never falls back softer
        applies = events(timeline, "apply")
        assert len(applies) == 2
        assert all(a["http_status"] == 202 and a["body"]["params"]["removed_dp_ranks"] == [2] for a in applies)
        assert sc.inference(cut.baseline) == cut.baseline
        assert "cleared" in sc.fault("hardware", "--rank", "2", "--cleared", target=[2])  # the card is healthy again
        cut.standing_faults_cleared()


def test_a17_controller_killed_mid_round_never_replays_apply_and_falls_back(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 3], dead=[2])
    incarnations = {r: e["incarnation"] for r, e in cut.engines().items()}
    with scenario(cut, "A17-controller-killed-in-scaling-down") as sc:
        # rank 3 waits 10 s before joining the rebuild: the round stays in SCALING_DOWN after its applies long
        # enough to kill the controller there, deterministically
        sc.inject(
            "POST <engine 3>/sim/faults {'kind': 'slow_rebuild', 'delay_sec': 10}",
            lambda: cut.inject_sim(3, "slow_rebuild", delay_sec=10),
            target=[3],
        )
        with traffic(cut.state):
            sc.fault("kill", "--rank", "0", target=[0])

            def applied() -> dict[str, Any] | None:
                entry = cut.status()
                if entry is None or entry["phase"] != "SCALING_DOWN":
                    return None
                timeline = cut.round(entry["request_id"])
                return timeline if len(events(timeline, "apply")) == 2 else None

            timeline = until(applied, within=60, what="both applies sent, the round in SCALING_DOWN")
            request_id = timeline["request_id"]
            sc.save("round_before_kill.json", timeline)
            cut.controller_down = True
            environ: dict[str, str] = {}

            def kill_controller() -> str:
                pid = cut.controller_pid()
                environ.update(cut.kill_controller())
                return f"killed pid {pid} while {request_id} was in SCALING_DOWN"

            sc.inject("SIGKILL to the controller's process group (pid from the state file)", kill_controller, target=[])
            sc.inject(
                "the controller started again with the state file's command line and the environment it had",
                lambda: f"started pid {cut.start_controller(environ)}",
                target=[],
            )
            cut.wait(lambda s: s["phase"] == "RECONFIGURING", within=60, what="restored as RECONFIGURING")
            cut.controller_down = False
        entry = cut.serving([0, 1, 2, 3], within=180)
        # never replayed: each pod got exactly the one apply of the interrupted round, and the restarted
        # controller aborted it with the persisted request id
        applies = sc.fact("nm_apply_lines", cut.node_manager_events("ft.apply", request_id))
        assert {pod: len(lines) for pod, lines in applies.items()} == {POD_A: 1, POD_B: 1}
        finalized = sc.fact("nm_finalize_lines", cut.node_manager_events("ft.finalize", request_id))
        assert all(any(line["commit"] is False for line in lines) for lines in finalized.values()), finalized
        assert all(not any(line["commit"] for line in lines) for lines in finalized.values()), finalized
        rounds = sc.fact("rounds_known_after_restart", cut.rounds())
        assert [r["kind"] for r in rounds] == ["fallback"], rounds
        assert rounds[0]["outcome"] == "succeeded"
        restored = first_sample(sc.series(), lambda s: s.get("phase") == "RECONFIGURING")
        assert restored is not None
        assert restored["fallback_strategy"] == "InstanceReconfiguration"
        assert not any(0 in (s.get("dead_committed") or []) for s in sc.series())  # the round never committed
        assert entry["dead_committed"] == []
        after = {r: e["incarnation"] for r, e in cut.engines().items()}
        assert all(after[r] > incarnations[r] for r in (0, 1, 3)), (incarnations, after)
        assert sc.inference(cut.baseline) == cut.baseline


def test_a17_controller_crash_in_the_commit_window_never_replays_and_falls_back(cut: ClusterUnderTest) -> None:
    """The other window of A17: the NodeManagers committed, the controller had not persisted. The controller
    is started with its test-only crash hook (``HETEROFLOW_CONTROLLER_CRASH_AT_STEP=after_node_manager_commit``,
    exit code 86 right after finalize(commit) reached every pod), then started again without it."""
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A17-controller-crash-after-node-manager-commit") as sc:
        cut.controller_down = True
        environ: dict[str, str] = {}

        def kill_controller() -> str:
            pid = cut.controller_pid()
            environ.update(cut.kill_controller())
            return f"killed pid {pid}, to start it again with the crash hook"

        sc.inject("SIGKILL to the controller's process group (pid from the state file)", kill_controller, target=[])
        hooked = {**environ, "HETEROFLOW_CONTROLLER_CRASH_AT_STEP": "after_node_manager_commit"}
        sc.inject(
            "controller restarted with HETEROFLOW_CONTROLLER_CRASH_AT_STEP=after_node_manager_commit",
            lambda: f"started pid {cut.start_controller(hooked)}",
            target=[],
        )
        cut.serving([0, 1, 2, 3], within=120)  # the hooked controller took the instance over
        controller = next(p for p in cut.cluster.processes if p.name == "controller")
        with traffic(cut.state):
            sc.fault("kill", "--rank", "1", target=[1])
            code = until(controller.exit_code, within=60, what="the controller crashes in the commit window")
            assert sc.fact("controller_exit_code", code) == 86
        hooks = log_events(Path(cut.state.log_dir) / "controller.log", "controller.crash_hook")
        assert sc.fact("controller_log_crash_hook", hooks[-1])["step"] == "after_node_manager_commit"
        applied = [
            line
            for pod in cut.inst.pods
            for line in log_events(cut.node_manager_log(pod.pod_id), "ft.apply")
            if timestamp(line["timestamp"]) >= sc.started_wall
        ]
        [request_id] = {line["request_id"] for line in applied}  # the interrupted round
        finalized = sc.fact("nm_finalize_lines", cut.node_manager_events("ft.finalize", request_id))
        assert all(any(line["commit"] for line in lines) for lines in finalized.values()), finalized
        sc.inject(
            "the controller started again without the hook",
            lambda: f"started pid {cut.start_controller(environ)}",
            target=[],
        )
        cut.wait(lambda s: s["phase"] == "RECONFIGURING", within=60, what="restored as RECONFIGURING")
        cut.controller_down = False
        entry = cut.serving([0, 1, 2, 3], within=180)
        applies = sc.fact("nm_apply_lines", cut.node_manager_events("ft.apply", request_id))
        assert {pod: len(lines) for pod, lines in applies.items()} == {POD_A: 1, POD_B: 1}  # never replayed
        assert [r["kind"] for r in cut.rounds()] == ["fallback"]
        restored = first_sample(sc.series(), lambda s: s.get("phase") == "RECONFIGURING")
        assert restored is not None
        assert restored["fallback_strategy"] == "InstanceReconfiguration"
        assert entry["dead_committed"] == []  # the rebuild replaced the pods' retired sets: both sides agree
        assert all(not e["retired"] for e in cut.engines().values())
        assert sc.inference(cut.baseline) == cut.baseline


def test_a10_a6_several_dead_in_one_apply_and_an_emptied_pod_is_not_stopped(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A10-A06-ranks-0-and-1-dead-together") as sc:
        with traffic(cut.state):
            sc.inject(
                "heteroflow fault kill --rank 0; heteroflow fault kill --rank 1 (in-process, milliseconds apart)",
                lambda: kill_workers(cut, 0, 1),
                target=[0, 1],
            )
            entry = cut.serving([2, 3], dead=[0, 1], within=60)
        [timeline] = scale_down_rounds(sc.new_rounds())  # one round for both
        assert timeline["request_id"] == entry["request_id"]
        assert timeline["outcome"] == "committed"
        [decided] = events(timeline, "decided")
        absorbed = [r for e in events(timeline, "absorbed") for r in e["ranks"]]
        assert sorted(decided["candidates"] + absorbed) == [0, 1]  # a DEAD seen during the round is absorbed
        sc.fact("absorbed_during_round", absorbed)
        [apply] = events(timeline, "apply")  # pod a has no survivor: guard and finalize only
        assert (apply["pod_id"], apply["http_status"], apply["body"]["params"]["removed_dp_ranks"]) == (
            POD_B,
            202,
            [0, 1],
        )
        assert sorted(e["pod_id"] for e in events(timeline, "finalize") if e["commit"]) == [POD_A, POD_B]
        # A6: pod a is fully emptied and scale-up is off: not stopped, its NodeManager keeps running
        assert events(timeline, "pod_stop") == []
        node_manager = next(p for p in cut.cluster.processes if p.name == f"node-manager:{POD_A}")
        assert node_manager.exit_code() is None
        pods = {p["pod_id"]: p["state"] for p in entry["pods"]}
        assert pods == {POD_A: "up", POD_B: "up"}
        assert sc.fact("node_manager_view_pod_a", cut.node_manager_status(POD_A))["endpoints"]
        assert sc.inference(cut.baseline) == cut.baseline


def test_a10_no_survivor_left_goes_to_reconfiguration(cut: ClusterUnderTest) -> None:
    cut.serving([2, 3], dead=[0, 1])
    with scenario(cut, "A10-last-ranks-2-and-3-dead") as sc:
        sc.inject(
            "heteroflow fault kill --rank 2; heteroflow fault kill --rank 3 (in-process, milliseconds apart)",
            lambda: kill_workers(cut, 2, 3),
            target=[2, 3],
        )
        cut.wait(lambda s: s["phase"] == "RECONFIGURING", within=60, what="no survivor: reconfiguration")
        entry = cut.serving([0, 1, 2, 3], within=180)
        timelines = sc.new_rounds()
        for timeline in scale_down_rounds(timelines):  # a round may have started before the second DEAD
            assert events(timeline, "apply") == []
            assert timeline["outcome"] == "failed"
        reconfiguring = first_sample(sc.series(), lambda s: s.get("phase") == "RECONFIGURING")
        assert reconfiguring is not None
        assert reconfiguring["fallback_strategy"] == "InstanceReconfiguration"
        reason = sc.fact("reconfiguration_reason", reconfiguring["last_error"])
        assert reason == "ALL_DEAD" or "survivor" in (reason or ""), reason
        assert [t["outcome"] for t in timelines if t["kind"] == "fallback"] == ["succeeded"]
        assert entry["dead_committed"] == []
        assert sc.inference(cut.baseline) == cut.baseline
