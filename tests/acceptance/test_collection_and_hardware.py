"""Acceptance rows where no scale-down may happen, or hardware decides the path: A2, A9, A12, A14 (and A6's
twin for a hardware-matched round).

One cluster with the defaults except a 5 s ``software_fault_collection_timeout_sec`` (the spec's only demand is
"below the engine's recovery timeout"; 60 s would make each of these rows a minute). Every row but the last
ends in a whole-instance reconfiguration, which brings the instance back on 4 ranks for the next one; A12's L5
fault stands, so its reconfiguration leaves rank 1 out, and the row clears the fault and restores 4 ranks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heteroflow.local.faults import KillMode, kill
from tests.acceptance.evidence import scenario
from tests.acceptance.harness import (
    ClusterUnderTest,
    events,
    running_cluster,
    timestamp,
    traffic,
)
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

COLLECTION_TIMEOUT_SEC = 5.0
WINDOW_SEC = 5.0
"""``hardware_ft_correlation_window_sec``, default."""


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory, evidence_root: Path) -> Iterator[ClusterUnderTest]:
    ft = {"software_fault_collection_timeout_sec": COLLECTION_TIMEOUT_SEC}
    yield from running_cluster("collection", tmp_path_factory, evidence_root, ft=ft)


def reconfigured(cut: ClusterUnderTest, *, within: float = 60) -> dict[str, Any]:
    return cut.wait(lambda s: s["phase"] == "RECONFIGURING", within=within, what="a whole-instance reconfiguration")


def fallback_started(timelines: list[dict[str, Any]]) -> float:
    """When the reconfiguration began (the fallback's timeline opens right after the decision)."""
    [fallback] = [t for t in timelines if t["kind"] == "fallback"]
    return timestamp(fallback["started_at"])


def assert_rebuilt_without_a_round(sc_rounds: list[dict[str, Any]]) -> None:
    """Only the fallback ran: no scale-down round, no fast recovery, hence no guard, no DEL of a round, no apply."""
    assert [t["kind"] for t in sc_rounds] == ["fallback"], [t["kind"] for t in sc_rounds]
    [fallback] = sc_rounds
    assert fallback["outcome"] == "succeeded"
    assert [e["strategy"] for e in events(fallback, "fallback")] == ["InstanceReconfiguration"]
    assert events(fallback, "apply") == []


def test_a2_idle_service_starts_no_round_and_the_collection_times_out(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    # the last request's wave ends with one more empty collective step: a kill during it would be traffic
    until(cut.idle, within=30, what="every rank idle")
    with scenario(cut, "A02-idle-rank-1-dead") as sc:
        sc.fault("kill", "--rank", "1", target=[1])
        injected = time.monotonic()
        entry = reconfigured(cut)
        assert entry["last_error"] == "COLLECTION_TIMEOUT"
        assert entry["fallback_strategy"] == "InstanceReconfiguration"
        # the collection timeout runs from the first evidence, as the controller logged it
        [first] = cut.controller_events("controller.fault_reported", since=sc.started_wall, endpoint_id=1)[:1]
        waited = fallback_started(sc.new_rounds()) - timestamp(first["timestamp"])
        assert sc.fact("first_evidence_to_reconfiguration_sec", round(waited, 3)) >= COLLECTION_TIMEOUT_SEC - 0.05
        # the survivors never met the fault: they stayed healthy until the rebuild stopped them
        series = sc.engine_series()
        survivors = [{r: s[str(r)]["state"] for r in (0, 2, 3) if str(r) in s} for s in series]
        before_rebuild = list(itertools.takewhile(lambda states: "stopped" not in states.values(), survivors))
        assert before_rebuild, "the rebuild began before the first sample"
        assert series[len(before_rebuild) - 1]["t"] >= sc.t_of(injected)  # the stretch reaches past the kill
        assert all(state == "healthy" for states in before_rebuild for state in states.values()), before_rebuild
        collecting = [s for s in sc.series() if s.get("phase") == "NORMAL" and s.get("last_decision")]
        assert any(s["last_decision"] == "wait:COLLECTING" for s in collecting)
        cut.serving([0, 1, 2, 3], within=180)
        assert_rebuilt_without_a_round(sc.new_rounds())
        assert sc.inference(cut.baseline) == cut.baseline


def test_a9_all_unhealthy_without_fast_recovery_guesses_nothing_and_reconfigures(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A09-all-unhealthy-no-fast-recovery") as sc:
        # no traffic needed: the transient fault pulls every peer into a wave and leaves the group
        sc.fault("transient", "--rank", "3", target=[3])
        unhealthy = cut.wait(
            lambda s: s["engine_statuses"] == dict.fromkeys(("0", "1", "2", "3"), "unhealthy"),
            within=20,
            what="every rank unhealthy, none dead",
        )
        assert unhealthy["phase"] == "NORMAL"  # waiting for a DEAD happens outside any round
        entry = reconfigured(cut)
        assert entry["last_error"] == "COLLECTION_TIMEOUT"
        first = cut.controller_events("controller.fault_reported", since=sc.started_wall, status="unhealthy")[0]
        waited = fallback_started(sc.new_rounds()) - timestamp(first["timestamp"])
        assert sc.fact("first_evidence_to_reconfiguration_sec", round(waited, 3)) >= COLLECTION_TIMEOUT_SEC - 0.05
        decisions = {s.get("last_decision") for s in sc.series() if s.get("phase") == "NORMAL"}
        assert "wait:WAITING_FOR_DEAD" in decisions
        assert not any("dead" in (s.get("engine_statuses") or {}).values() for s in sc.series())
        cut.serving([0, 1, 2, 3], within=180)
        assert_rebuilt_without_a_round(sc.new_rounds())  # no guess: no scale-down, no retry
        assert sc.inference(cut.baseline) == cut.baseline


def test_a12_hardware_fault_without_confirmation_reconfigures_when_the_window_expires(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A12-hardware-rank-1-no-engine-fault") as sc:
        assert "MAPPED [1]" in sc.fault("hardware", "--rank", "1", target=[1])
        entry = reconfigured(cut)
        [received] = cut.controller_events("controller.hardware_fault", since=sc.started_wall, ranks=[1])
        waited = fallback_started(sc.new_rounds()) - timestamp(received["timestamp"])
        assert sc.fact("report_to_reconfiguration_sec", round(waited, 3)) >= WINDOW_SEC - 0.05  # the whole window
        assert entry["last_error"] == "CORRELATION_EXPIRED"
        assert cut.controller_events("controller.decision", since=sc.started_wall, decision="wait:CORRELATION_WINDOW")
        assert entry["fallback_strategy"] == "InstanceReconfiguration"
        # the L5 fault stands (the card must be reset before it is trusted again): the reconfiguration relaunches
        # every rank but rank 1, and the instance serves scaled down without it
        rebuilt = cut.serving([0, 2, 3], dead=[1], within=180)
        assert rebuilt["relaunch"]["kind"] == "WITHOUT_RANKS", rebuilt["relaunch"]
        assert (rebuilt["relaunch"]["ranks"], rebuilt["relaunch"]["reason_code"]) == (
            [1],
            "standing_fault_ranks_left_out",
        )
        assert rebuilt["standing_hardware_faults"] == rebuilt["relaunch"]["faults"] != []
        assert_rebuilt_without_a_round(sc.new_rounds())  # hardware ranks never enter removed_dp_ranks
        assert sc.inference(cut.baseline) == cut.baseline
        assert "cleared" in sc.fault("hardware", "--rank", "1", "--cleared", target=[1])  # the card was reset
        cut.restore_full_size()


def hardware_report(cut: ClusterUnderTest, *, node: str, card: str, cleared: bool = False) -> dict[str, Any]:
    with cut.client() as client:
        return client.report_hardware_fault(
            {
                "node_name": node,
                "card": card,
                "fault_code": "XID79",
                "level": 5,
                "source": "acceptance",
                "detail": "injected by the acceptance suite",
                "cleared": cleared,
            }
        )


def test_a14_an_unknown_card_name_takes_the_original_strategy_without_a_window(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    node = cut.inst.pod("inst-1-pod-a").node_name
    with scenario(cut, "A14-unknown-card-name") as sc:
        answer = sc.inject(
            f"POST /controller/report_hardware_fault node_name={node} card='slot 4 / left' level=5",
            lambda: hardware_report(cut, node=node, card="slot 4 / left"),
            target=[],
        )
        assert answer["mappings"]["inst-1"].startswith("UNMAPPABLE unknown card-name format")
        entry = reconfigured(cut, within=WINDOW_SEC)
        [received] = cut.controller_events("controller.hardware_fault", since=sc.started_wall, mapping="UNMAPPABLE")
        waited = fallback_started(sc.new_rounds()) - timestamp(received["timestamp"])
        assert sc.fact("report_to_reconfiguration_sec", round(waited, 3)) < 1.0  # no window waited for
        assert entry["last_error"] == "HARDWARE_UNMAPPABLE"
        assert entry["fallback_strategy"] == "InstanceReconfiguration"  # the deployment's original strategy
        cut.serving([0, 1, 2, 3], within=180)
        assert_rebuilt_without_a_round(sc.new_rounds())
        assert sc.inference(cut.baseline) == cut.baseline


def test_a14_an_empty_card_name_maps_every_rank_of_the_node_and_a6_pod_kept(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    node = cut.inst.pod("inst-1-pod-b").node_name
    with scenario(cut, "A14-A06-empty-card-name-node-of-pod-b") as sc:
        with traffic(cut.state):
            answer = sc.inject(
                f"POST /controller/report_hardware_fault node_name={node} card='' level=5",
                lambda: hardware_report(cut, node=node, card=""),
                target=[2, 3],
            )
            assert answer["mappings"] == {"inst-1": "MAPPED [2, 3]"}  # every rank of the instance on that node

            def kill_both() -> list[str]:
                with cut.client() as client:
                    return [kill(client, cut.inst, rank, mode=KillMode.WORKER) for rank in (2, 3)]

            sc.inject(
                "heteroflow fault kill --rank 2 and --rank 3 (in-process, milliseconds apart)", kill_both, target=[2, 3]
            )
            entry = cut.serving([0, 1], dead=[2, 3], within=60)
        [timeline] = [t for t in sc.new_rounds() if t["kind"] == "scale_down"]
        [decided] = events(timeline, "decided")
        assert decided["hardware_matched"] is True
        absorbed = [r for e in events(timeline, "absorbed") for r in e["ranks"]]
        assert sorted(decided["candidates"] + absorbed) == [2, 3]
        [apply] = events(timeline, "apply")  # pod b has no survivor left: only pod a is applied, once
        assert (apply["pod_id"], apply["http_status"], apply["body"]["params"]["removed_dp_ranks"]) == (
            "inst-1-pod-a",
            202,
            [2, 3],
        )
        assert events(timeline, "pod_stop") == []  # A6 again: scale-up off, the emptied pod b is kept
        assert {p["pod_id"]: p["state"] for p in entry["pods"]}["inst-1-pod-b"] == "up"
        matched = sc.sampled(lambda s: s.get("phase") == "SCALED_DOWN_RUNNING")
        assert matched is not None
        assert sc.inference(cut.baseline) == cut.baseline
        hardware_report(cut, node=node, card="", cleared=True)  # the node was serviced: its cards stand no more
        cut.standing_faults_cleared()
