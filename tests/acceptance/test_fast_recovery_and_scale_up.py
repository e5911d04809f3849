"""Acceptance rows that need a flag on: A8 (``enable_fast_recovery``) and A5/A7 (``enable_dp_scale_up``).

One cluster with both flags, to spend one start instead of two. They do not interact: fast recovery applies
only to an all-UNHEALTHY snapshot with no DEAD, pod stops only after a committed round; A7's rounds have a DEAD
from the start, so fast recovery is never applicable there, and A8 commits nothing, so no pod is ever
recyclable there. The spec runs A8 "with the flag on; every other row with defaults": scale-up is on for
A5-A7 because A7 needs it, and A5 is only meaningful with it (with scale-up off nothing is ever stopped).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.evidence import scenario
from tests.acceptance.harness import (
    ClusterUnderTest,
    events,
    running_cluster,
    traffic,
)
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

POD_A, POD_B = "inst-1-pod-a", "inst-1-pod-b"


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory, evidence_root: Path) -> Iterator[ClusterUnderTest]:
    ft = {"enable_fast_recovery": True, "enable_dp_scale_up": True}
    yield from running_cluster("flags", tmp_path_factory, evidence_root, ft=ft)


def of_kind(timelines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [t for t in timelines if t["kind"] == kind]


def test_a8_all_unhealthy_with_fast_recovery_retries_and_serves_again(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    incarnations = {r: e["incarnation"] for r, e in cut.engines().items()}
    with scenario(cut, "A08-all-unhealthy-fast-recovery") as sc:
        sc.fault("transient", "--rank", "3", target=[3])  # every rank unhealthy, none dead
        cut.wait(lambda s: s["running_strategy"] == "fast_recovery", within=30, what="fast recovery starts")
        entry = cut.serving([0, 1, 2, 3], within=60)
        timelines = sc.new_rounds()
        assert [t["kind"] for t in timelines] == ["fast_recovery"]  # never a scale-down, never a rebuild
        [recovery] = timelines
        assert recovery["outcome"] == "succeeded"
        applies = events(recovery, "apply")
        assert sorted(a["pod_id"] for a in applies) == [POD_A, POD_B]
        assert {a["body"]["instruction"] for a in applies} == {"retry"}
        assert all(a["http_status"] == 202 for a in applies)
        assert entry["dead_committed"] == []
        assert "RECONFIGURING" not in {s.get("phase") for s in sc.series()}
        assert {r: e["incarnation"] for r, e in cut.engines().items()} == incarnations  # no relaunch
        ft = sc.fact("engine_ft_status_after", {r: cut.engine_ft_status(r)["engines"][0] for r in range(4)})
        # vLLM 0.34: the healthy push after the retry replaced each entry (no ft_state, id or error left)
        assert ft == {r: {"id": r, "status": "healthy"} for r in range(4)}
        assert sc.inference(cut.baseline) == cut.baseline


def test_a8_a_failed_fast_recovery_reconfigures_and_never_scales_down(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A08-fast-recovery-fails") as sc:
        # rank 3 joins its retry rebuild only after 10 s; its worker dies meanwhile: a DEAD during fast
        # recovery, which must end in a whole-instance reconfiguration, not in a scale-down of rank 3
        sc.inject(
            "POST <engine 3>/sim/faults {'kind': 'slow_rebuild', 'delay_sec': 10}",
            lambda: cut.inject_sim(3, "slow_rebuild", delay_sec=10),
            target=[3],
        )
        sc.fault("transient", "--rank", "2", target=[2])

        def retried() -> dict[str, Any] | None:
            found = of_kind(sc.new_rounds(), "fast_recovery")
            return found[0] if found and len(events(found[0], "apply")) == 2 else None

        until(retried, within=30, what="the retry dispatched to both pods")
        sc.fault("kill", "--rank", "3", target=[3])
        entry = cut.wait(lambda s: s["phase"] == "RECONFIGURING", within=60, what="reconfiguration")
        assert entry["fallback_strategy"] == "InstanceReconfiguration"
        assert entry["last_error"] == "fast recovery failed"
        cut.serving([0, 1, 2, 3], within=180)
        timelines = sc.new_rounds()
        assert [t["kind"] for t in timelines] == ["fast_recovery", "fallback"]  # no scale-down round at all
        assert [t["outcome"] for t in timelines] == ["failed", "succeeded"]
        assert not any(s.get("dead_committed") for s in sc.series())
        assert sc.inference(cut.baseline) == cut.baseline


def test_a5_a_partly_emptied_pod_is_not_stopped_even_with_scale_up(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A05-rank-1-dead-pod-a-partly-emptied") as sc:
        with traffic(cut.state):
            sc.fault("kill", "--rank", "1", target=[1])
            entry = cut.serving([0, 2, 3], dead=[1], within=60)
        [timeline] = of_kind(sc.new_rounds(), "scale_down")
        assert timeline["request_id"] == entry["request_id"]
        assert events(timeline, "pod_stop") == []  # rank 0 still serves on pod a
        engines = sc.fact("node_manager_view_after", cut.engines())
        assert engines[0]["running"]
        assert engines[0]["ready"]
        assert sc.inference(cut.baseline) == cut.baseline


def test_a7_a_fully_emptied_pod_is_stopped_once_with_scale_up(cut: ClusterUnderTest) -> None:
    cut.serving([0, 2, 3], dead=[1])
    with scenario(cut, "A07-rank-0-dead-pod-a-emptied") as sc:
        with traffic(cut.state):
            sc.fault("kill", "--rank", "0", target=[0])
            entry = cut.serving([2, 3], dead=[0, 1], within=60)
        [timeline] = of_kind(sc.new_rounds(), "scale_down")
        assert timeline["request_id"] == entry["request_id"]
        stops = events(timeline, "pod_stop")
        assert [(e["pod_id"], e["ok"]) for e in stops] == [(POD_A, True)]  # once, only the emptied pod
        kinds = [e["kind"] for e in timeline["events"]]
        assert kinds.index("finalize") < kinds.index("pod_stop") < kinds.index("coordinator_add")

        def pod_a_stopped() -> dict[int, dict[str, Any]] | None:
            view = cut.engines()
            return view if not view[0]["running"] and not view[1]["running"] else None

        engines = until(pod_a_stopped, within=30, what="pod a's engines stopped")
        sc.fact("node_manager_view_after", engines)
        assert engines[2]["running"]
        assert engines[3]["running"]
        # never retried: the one stop of the round is the only stop of the whole scenario
        assert [e["pod_id"] for t in sc.new_rounds() for e in events(t, "pod_stop")] == [POD_A]
        assert sc.inference(cut.baseline) == cut.baseline
