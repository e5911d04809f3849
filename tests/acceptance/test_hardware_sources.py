"""A11-A14 through both hardware sources the controller's ResourceMonitor follows, on real processes: the local
cluster's controller reads MindCluster ConfigMap documents from its hardware folder and the platform's
hardware-event feed, and ``heteroflow fault hardware --via mindcluster|gpu-health`` writes a document or sends an
XID in the node agent's heartbeat. Nothing is reported to the controller directly here.

One default cluster; the rows share it in this order: A11 via MindCluster (rank 2 removed), A13 via GPU health
(a fault on the committed rank 2), A12 via GPU health (rank 3, never confirmed: rebuilt on 4 ranks), A11 via GPU
health (rank 1 removed), A13 via MindCluster (the committed rank 1), A12 via MindCluster (rank 0 at L6, never
confirmed: rebuilt without rank 0, whose card stands faulty, then restored on 4 ranks once it is cleared), A14 via
MindCluster (a card name of no known format: rebuilt at once).

The GPU-health rows send XID 94 (L4, a contained error): an L5-L6 fault stands until its source clears it, and that
source clears a fault only once it stops being reported (``HETEROFLOW_MONITOR_PLATFORM_FAULT_HOLD_SEC``, 300 s), so
an L6 XID would keep its rank out of every later rebuild of the shared cluster. The MindCluster rows clear their
fault through the document, as the device plugin does when a card is healthy again, and wait until the controller
lists no standing fault.

A14 has no GPU-health row: that source names every card by its uuid or its index on the node, both formats the
mapping reads, so it cannot produce an unmappable fault; its other cause, a pod that registered no node name,
cannot happen in a local cluster (the in-process tests cover it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.evidence import scenario
from tests.acceptance.harness import ClusterUnderTest, running_cluster, timestamp
from tests.acceptance.rows import GPU_HEALTH, MINDCLUSTER, WINDOW_SEC, key_in, scale_down_matched

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory, evidence_root: Path) -> Iterator[ClusterUnderTest]:
    yield from running_cluster("sources", tmp_path_factory, evidence_root, ft={})


def taken(cut: ClusterUnderTest, key: str) -> dict[str, Any]:
    """The controller's record of the hardware fault ``key`` (its status's ``hardware_faults``)."""
    entry = cut.status()
    assert entry is not None
    [fault] = [f for f in entry["hardware_faults"] if f["key"] == key]
    return dict(fault)


def handled_without_a_round(
    cut: ClusterUnderTest, sc: Any, *, rank: int, via: str, source: str, code: str | None = None
) -> None:
    """A13 on the committed ``rank``: taken, marked handled, and nothing happens for longer than a window."""
    before = cut.status()
    assert before is not None
    said = sc.fault("hardware", "--rank", str(rank), "--via", via, *(("--code", code) if code else ()), target=[rank])
    assert f"from {source}: inst-1 MAPPED [{rank}]" in said, said
    key = key_in(said)
    sent = time.monotonic()
    while time.monotonic() < sent + WINDOW_SEC + 1.5:
        entry = cut.status()
        assert entry is not None
        assert (entry["phase"], entry["dead_committed"], entry["rounds"]) == (
            "SCALED_DOWN_RUNNING",
            before["dead_committed"],
            before["rounds"],
        ), entry
        time.sleep(0.2)  # observation period of the watch above, not a synchronisation
    assert sc.new_rounds() == []
    assert taken(cut, key)["pending"] is False  # marked handled: no window stands for it
    assert cut.published() == before["published_endpoints"]
    assert sc.inference(cut.baseline) == cut.baseline


def rebuilt_after(cut: ClusterUnderTest, sc: Any, *, reason: str, key: str, left_out: tuple[int, ...] = ()) -> float:
    """The instance reconfigured for ``reason`` and serves on 4 ranks again (or without ``left_out``, the ranks on
    a card with a standing fault), with only the fallback run; seconds from the controller taking ``key`` to the
    fallback's start."""
    entry = cut.wait(lambda s: s["phase"] == "RECONFIGURING", within=60, what="a whole-instance reconfiguration")
    assert (entry["last_error"], entry["fallback_strategy"]) == (reason, "InstanceReconfiguration")
    serving = cut.serving([r for r in range(4) if r not in left_out], dead=left_out, within=180)
    if left_out:
        relaunch = serving["relaunch"]
        assert (relaunch["kind"], relaunch["ranks"], relaunch["faults"]) == ("WITHOUT_RANKS", list(left_out), [key])
        assert serving["standing_hardware_faults"] == [key]
    rounds = sc.new_rounds()
    assert [t["kind"] for t in rounds] == ["fallback"], rounds  # hardware ranks never enter removed_dp_ranks
    assert rounds[0]["outcome"] == "succeeded"
    [seen] = [e for e in cut.controller_events("controller.hardware_fault", since=sc.started_wall) if e["key"] == key]
    return timestamp(rounds[0]["started_at"]) - timestamp(seen["timestamp"])


def test_a11_via_mindcluster_hardware_first_then_rank_2_dead(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A11-mindcluster-rank-2") as sc:
        scale_down_matched(cut, sc, rank=2, via="mindcluster", source=MINDCLUSTER, serving=[0, 1, 3])
        said = sc.fault("hardware", "--rank", "2", "--via", "mindcluster", "--cleared", target=[2])
        assert "no longer lists" in said, said  # the committed round forgot it; the document is clean again
        cut.standing_faults_cleared()  # the source's clear reached the controller: the card stands no more


def test_a13_via_gpu_health_xid_on_the_committed_rank_2(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 3], dead=[2])
    with scenario(cut, "A13-gpu-health-committed-rank-2") as sc:
        handled_without_a_round(cut, sc, rank=2, via="gpu-health", source=GPU_HEALTH, code="94")


def test_a12_via_gpu_health_xid_never_confirmed_reconfigures(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 3], dead=[2])
    with scenario(cut, "A12-gpu-health-rank-3") as sc:
        said = sc.fault("hardware", "--rank", "3", "--via", "gpu-health", "--code", "94", target=[3])
        assert f"from {GPU_HEALTH}: inst-1 MAPPED [3]" in said, said
        assert "(L4)" in said  # XID 94: the level follows from the XID
        waited = rebuilt_after(cut, sc, reason="CORRELATION_EXPIRED", key=key_in(said))
        assert sc.fact("hardware_to_reconfiguration_sec", round(waited, 3)) >= WINDOW_SEC - 0.05  # the whole window
        assert sc.inference(cut.baseline) == cut.baseline


def test_a11_via_gpu_health_hardware_first_then_rank_1_dead(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A11-gpu-health-rank-1") as sc:
        scale_down_matched(cut, sc, rank=1, via="gpu-health", source=GPU_HEALTH, serving=[0, 2, 3], code="94")


def test_a13_via_mindcluster_fault_on_the_committed_rank_1(cut: ClusterUnderTest) -> None:
    cut.serving([0, 2, 3], dead=[1])
    with scenario(cut, "A13-mindcluster-committed-rank-1") as sc:
        handled_without_a_round(cut, sc, rank=1, via="mindcluster", source=MINDCLUSTER)
        sc.fault("hardware", "--rank", "1", "--via", "mindcluster", "--cleared", target=[1])
        cut.standing_faults_cleared()


def test_a12_via_mindcluster_fault_never_confirmed_reconfigures(cut: ClusterUnderTest) -> None:
    cut.serving([0, 2, 3], dead=[1])
    with scenario(cut, "A12-mindcluster-rank-0") as sc:
        said = sc.fault("hardware", "--rank", "0", "--via", "mindcluster", "--level", "6", target=[0])
        assert f"from {MINDCLUSTER}: inst-1 MAPPED [0]" in said, said
        assert "SeparateNPU" in said
        # L6 stands: the reconfiguration relaunches every rank but rank 0 (the store master moves to rank 1)
        waited = rebuilt_after(cut, sc, reason="CORRELATION_EXPIRED", key=key_in(said), left_out=(0,))
        assert sc.fact("hardware_to_reconfiguration_sec", round(waited, 3)) >= WINDOW_SEC - 0.05
        assert sc.inference(cut.baseline) == cut.baseline
        sc.fault("hardware", "--rank", "0", "--via", "mindcluster", "--cleared", target=[0])  # the card replaced
        cut.restore_full_size()


def test_a14_via_mindcluster_unknown_card_name_takes_the_original_strategy(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "A14-mindcluster-unknown-card-name") as sc:
        said = sc.fault("hardware", "--rank", "0", "--via", "mindcluster", "--card", "npu slot 3", target=[])
        assert f"from {MINDCLUSTER}: inst-1 UNMAPPABLE unknown card-name format" in said, said
        waited = rebuilt_after(cut, sc, reason="HARDWARE_UNMAPPABLE", key=key_in(said))
        assert sc.fact("hardware_to_reconfiguration_sec", round(waited, 3)) < 1.0  # no window waited for
        sc.fault("hardware", "--rank", "0", "--via", "mindcluster", "--card", "npu slot 3", "--cleared", target=[])
        assert sc.inference(cut.baseline) == cut.baseline
