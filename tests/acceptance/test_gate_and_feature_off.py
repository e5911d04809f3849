"""Acceptance rows that need their own, smaller cluster: A15 (a static gate failure) and A18 (the feature off).

Each runs DP 2 in one pod on one simulated node: the gate is static and the feature switch is global, so two
ranks show them as well as four, and each cluster starts in half the time.

- A15: the engines run with no redundant expert (``ClusterOptions.num_redundant_experts=0``): they serve, but
  the gate refuses every round (``EXPERT_REDUNDANCY_REQUIRED``) and the frozen fallback rebuilds the instance.
  The simulator has no fused MC2 at all, and the only reason code is the redundancy one: MC2 being off is
  not a rejection (every other row of the suite is a round the gate allowed on the same engines).
- A18: ``enable_dp_scale_down: false``: the NodeManagers' FT routes answer 404, the phase is DISABLED, a dead
  rank starts no round and the controller withdraws nothing, as in the baseline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from heteroflow.contracts.serving import NM_FT_APPLY_PATH, NM_FT_FINALIZE_PATH, NM_FT_GUARD_PATH, NM_FT_STATUS_PATH
from heteroflow.local.client import ClusterUnreachableError
from tests.acceptance.evidence import first_sample, scenario
from tests.acceptance.harness import ClusterUnderTest, events, running_cluster, traffic

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def gate_cut(tmp_path_factory: pytest.TempPathFactory, evidence_root: Path) -> Iterator[ClusterUnderTest]:
    yield from running_cluster(
        "gate", tmp_path_factory, evidence_root, ft={}, num_redundant_experts=0, dp_size=2, pods=1, sim_nodes=1
    )


def test_a15_static_gate_failure_records_the_reason_and_falls_back(gate_cut: ClusterUnderTest) -> None:
    cut = gate_cut
    cut.serving([0, 1])
    with scenario(cut, "A15-gate-refuses-no-redundant-experts") as sc:
        with traffic(cut.state):
            sc.fault("kill", "--rank", "1", target=[1])
            entry = cut.wait(lambda s: s["phase"] == "RECONFIGURING", within=60, what="the gate refuses")
        assert entry["gate"]["allowed"] is False
        assert entry["gate"]["reason_codes"] == ["EXPERT_REDUNDANCY_REQUIRED"]  # nothing about fused MC2
        assert entry["fallback_strategy"] == "InstanceReconfiguration"
        cut.serving([0, 1], within=180)
        timelines = sc.new_rounds()
        assert [t["kind"] for t in timelines] == ["scale_down", "fallback"]
        refused, fallback = timelines
        assert refused["outcome"] == "failed"
        [gate] = events(refused, "gate")
        assert gate["reason_codes"] == ["EXPERT_REDUNDANCY_REQUIRED"]
        # refused as the round's first step: no NodeManager guarded, nothing withdrawn, nothing applied
        assert events(refused, "guard") == []
        assert events(refused, "coordinator_del") == []
        assert events(refused, "apply") == []
        assert fallback["outcome"] == "succeeded"
        assert sc.inference(cut.baseline) == cut.baseline


@pytest.fixture(scope="module")
def off_cut(tmp_path_factory: pytest.TempPathFactory, evidence_root: Path) -> Iterator[ClusterUnderTest]:
    ft = {"enable_dp_scale_down": False}
    yield from running_cluster(
        "off", tmp_path_factory, evidence_root, ft=ft, serves=False, dp_size=2, pods=1, sim_nodes=1
    )


def test_a18_feature_off_node_manager_routes_404_and_no_round(off_cut: ClusterUnderTest) -> None:
    cut = off_cut
    pod = cut.inst.pods[0]
    with scenario(cut, "A18-feature-off") as sc:
        entry = cut.status()
        assert entry is not None
        assert entry["phase"] == "DISABLED"
        assert entry["can_serve"] is False  # F-40: a scale-down notion; the baseline view is still published
        assert cut.published() == [0, 1]
        codes = {}
        with cut.http() as http:
            for path, body in (
                (NM_FT_STATUS_PATH, {"endpoint_ids": [0]}),
                (NM_FT_GUARD_PATH, {"request_id": "acceptance", "lease_sec": 10}),
                (NM_FT_APPLY_PATH, {"instruction": "scale_down", "request_id": "acceptance", "params": {}}),
                (NM_FT_FINALIZE_PATH, {"request_id": "acceptance", "commit": False, "retired_endpoint_ids": []}),
            ):
                codes[path] = http.post(pod.node_manager_url + path, json=body).status_code
        assert sc.fact("node_manager_ft_route_codes", codes) == dict.fromkeys(codes, 404)
        before = sc.inference()
        assert before == cut.baseline
        with traffic(cut.state):
            sc.fault("kill", "--rank", "1", target=[1])
            heard = cut.wait(
                lambda s: s["engine_statuses"].get("1") == "dead", within=30, what="the controller hears of rank 1"
            )
            # A report wakes the strategy center at once; watch a few of its decisions go by before
            # concluding that none started anything.
            watch_until = time.monotonic() + 3.0
            while time.monotonic() < watch_until:
                entry = cut.status()
                assert entry is not None
                assert (entry["phase"], entry["rounds"], entry["running_strategy"]) == ("DISABLED", [], None), entry
                time.sleep(0.2)  # observation period of the watch, not a synchronisation
        assert heard["last_decision"] == "no_action:FEATURE_DISABLED"
        assert sc.new_rounds() == []
        assert cut.published() == [0, 1]  # no DEL, no ADD: the view is the baseline's
        assert {s.get("phase") for s in sc.series()} == {"DISABLED"}
        never_withdrawn = first_sample(sc.series(), lambda s: s.get("coordinator_published") not in ([0, 1], None))
        assert never_withdrawn is None, never_withdrawn
        # read before the completion below: a NodeManager whose dead engine no round took over exits 60 s after
        # the death (the baseline recreates the pod), and the completion may be held up to its 30 s deadline
        assert not cut.engines()[1]["running"]  # its NodeManager saw the engine die (F-2)
        # without scale-down the instance has no recovery of its own (the baseline recreates the pod): the
        # survivor stays unhealthy, and requests fail instead of being answered by a rebuilt group
        with cut.client(timeout_sec=30) as client:
            try:
                outcome = f"answered: {client.completion('after the fault')!r}"
            except ClusterUnreachableError as exc:
                outcome = f"refused: {exc}"
        sc.fact("completion_after_fault_without_recovery", outcome)
