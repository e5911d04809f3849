"""Row bodies that more than one cluster walks: the same injection and the same assertions, whatever the cluster
(its configuration, its addresses) and whatever was committed before. Each runs inside the row's scenario
(:func:`tests.acceptance.evidence.scenario`), which saves the evidence.
"""

from __future__ import annotations

import re
import time
from typing import Any

from heteroflow.local.faults import KillMode, kill
from tests.acceptance.harness import ClusterUnderTest, events, timestamp, traffic
from tests.support.polling import until

WINDOW_SEC = 5.0
"""``hardware_ft_correlation_window_sec``, default."""
MINDCLUSTER = "mindcluster-dir"
GPU_HEALTH = "gpu-health"
"""The two hardware sources as the controller names them (``source`` of its ``controller.hardware_fault`` lines)."""


def scale_down_rounds(timelines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in timelines if t.get("kind") == "scale_down"]


def set_operations(cut: ClusterUnderTest) -> int:
    """SETs the Coordinator applied so far (its ``heteroflow_coordinator_view_operations_total`` counter)."""
    with cut.http() as http:
        text = http.get(cut.state.coordinator_url + "/metrics").text
    found = re.search(r'view_operations_total\{[^}]*op="SET"[^}]*outcome="applied"[^}]*\} ([0-9.e+]+)', text)
    if found is None:
        found = re.search(r'view_operations_total\{[^}]*outcome="applied"[^}]*op="SET"[^}]*\} ([0-9.e+]+)', text)
    return int(float(found.group(1))) if found else 0


def key_in(said: str) -> str:
    """The fault key ``heteroflow fault hardware --via <source>`` printed (``… the controller took <key> …``)."""
    return said.split("the controller took ", 1)[1].split(" after ", 1)[0]


def rank_0_dead_moves_the_master(cut: ClusterUnderTest, sc: Any, *, dead_before: list[int]) -> dict[str, Any]:
    """A3 + A4: rank 0 (the store master) dies under traffic with ``dead_before`` committed. One committed round:
    survivors = the rest, every pod with a survivor gets one apply (202) carrying the cumulative removal and
    ``dp_master_ip`` = the address of min(survivors); the engines rebuilt around that rank as store master with
    their ids unchanged; two periodic SETs after the commit never re-add a committed rank. The status entry."""
    dead = sorted([0, *dead_before])
    survivors = [r for r in range(cut.inst.dp_size) if r not in dead]
    master = survivors[0]
    with traffic(cut.state):
        sc.fault("kill", "--rank", "0", target=[0])
        entry = cut.serving(survivors, dead=dead, within=60)
    committed_at = time.monotonic()
    sets_at_commit = set_operations(cut)
    [timeline] = scale_down_rounds(sc.new_rounds())
    assert timeline["outcome"] == "committed"
    [decided] = events(timeline, "decided")
    assert (decided["candidates"], decided["survivors"], decided["dead_committed"]) == (
        [0],
        survivors,
        sorted(dead_before),
    )
    applies = events(timeline, "apply")
    assert sorted(a["pod_id"] for a in applies) == sorted({cut.inst.endpoint(r).pod for r in survivors})
    for apply in applies:
        assert apply["http_status"] == 202
        assert apply["body"]["params"]["removed_dp_ranks"] == dead  # cumulative (A4)
        assert apply["body"]["params"]["dp_master_ip"] == cut.inst.endpoint(master).ip  # min(survivors) (A3)
    # A3, proven against the engines: the new store master is min(survivors), ids were not renumbered
    infos = sc.fact("sim_info_after", {r: cut.sim_info(r) for r in survivors})
    for rank, info in infos.items():
        assert (info["dp_rank"], info["members"], info["dead_ranks"], info["store_master"]) == (
            rank,
            survivors,
            dead,
            master,
        )
    # A4: SET never re-adds a committed rank: wait for two periodic SETs after the commit, the view stays
    until(lambda: set_operations(cut) >= sets_at_commit + 2, within=30, what="two periodic SETs after the commit")
    assert cut.published() == survivors
    after_commit = [s for s in sc.series() if s["t"] >= sc.t_of(committed_at)]
    views = {tuple(s["coordinator_published"]) for s in after_commit if s.get("coordinator_published") is not None}
    assert views == {tuple(survivors)}, views
    sc.fact("set_operations", {"at_commit": sets_at_commit, "checked_after": set_operations(cut)})
    assert entry["alive_dp_ranks"] == survivors
    assert sc.inference(cut.baseline) == cut.baseline
    return entry


def scale_down_matched(
    cut: ClusterUnderTest, sc: Any, *, rank: int, via: str, source: str, serving: list[int], code: str | None = None
) -> None:
    """A11 on ``rank``: the fault through ``via`` (its default code, or ``code``), the window, the rank's worker
    killed, a matched scale-down."""
    dead = sorted(set(range(4)) - set(serving))
    with traffic(cut.state):
        said = sc.fault(
            "hardware", "--rank", str(rank), "--via", via, *(("--code", code) if code else ()), target=[rank]
        )
        assert f"from {source}: inst-1 MAPPED [{rank}]" in said, said
        key = key_in(said)  # the controller has the fault: kill at once, the window is running

        def kill_rank() -> str:
            with cut.client() as client:
                return kill(client, cut.inst, rank, mode=KillMode.WORKER)

        sc.inject(f"heteroflow fault kill --rank {rank} (in-process)", kill_rank, target=[rank])
        entry = cut.serving(serving, dead=dead, within=60)
    [timeline] = scale_down_rounds(sc.new_rounds())
    assert (timeline["request_id"], timeline["outcome"]) == (entry["request_id"], "committed")
    [decided] = events(timeline, "decided")
    assert (decided["hardware_matched"], decided["hardware_keys"], decided["candidates"]) == (True, [key], [rank])
    window = cut.controller_events("controller.decision", since=sc.started_wall, decision="wait:CORRELATION_WINDOW")
    assert window, "no correlation window opened"
    assert timestamp(window[0]["timestamp"]) <= timestamp(decided["at"])  # it opened before the decision
    [seen] = [e for e in cut.controller_events("controller.hardware_fault", since=sc.started_wall) if e["key"] == key]
    assert (seen["source"], seen["mapping"], seen["ranks"]) == (source, "MAPPED", [rank])
    waited = timestamp(decided["at"]) - timestamp(seen["timestamp"])
    assert sc.fact("hardware_to_decision_sec", round(waited, 3)) < WINDOW_SEC  # matched inside the window
    assert all(a["body"]["params"]["removed_dp_ranks"] == dead for a in events(timeline, "apply"))
    assert sc.inference(cut.baseline) == cut.baseline
