"""Capacity back on real processes: a local cluster (DP 4 over 2 pods, simulated engines speaking vLLM 0.34).

Rank 2's worker is killed under traffic (a committed scale-down to [0, 1, 3]); ``heteroflow restore`` brings the
instance back to 4 serving ranks. The cluster has one instance, so while it is relaunched the Coordinator holds
the model's requests (up to its client deadline): not one of them fails. Then rank 2 is killed again, and pod b's
NodeManager stops answering (SIGSTOP) before the next restore: the full-size start cannot be made, the restore
fails, and once the NodeManager answers again the instance is relaunched scaled down as it ran and serves on
[0, 1, 3]: as a new world of 3 ranks (0, 1, 2), since no released engine starts with ranks already dead. Rank 3
(engine rank 2 there) is then killed, and the scale-down names it by the engines' own number.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from heteroflow.local import ClusterOptions, LocalCluster
from heteroflow.local.client import ClusterClient
from heteroflow.local.faults import KillMode, endpoint_of, kill
from heteroflow.local.state import InstanceState
from heteroflow.serving.node_manager.spec import endpoint_url
from tests.e2e.test_local_cluster import committed, heteroflow, no_process_left, status_of, traffic
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def engine_url(inst: InstanceState, rank: int) -> str:
    endpoint = endpoint_of(inst, rank)
    return endpoint_url(endpoint.ip, endpoint.port)


def published(client: ClusterClient, ranks: list[int]) -> Callable[[], dict[str, Any] | None]:
    """The instance's status once it serves with exactly ``ranks`` published."""

    def check() -> dict[str, Any] | None:
        entry = status_of(client)
        if entry is not None and entry["can_serve"] and entry["published_endpoints"] == ranks:
            return entry
        return None

    return check


def test_restore_brings_the_instance_back_to_four_ranks_and_a_failed_one_leaves_it_serving(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    options = ClusterOptions(data_dir=tmp_path / "local", server_port=0, controller_port=0, coordinator_port=0)
    cluster = LocalCluster(options)
    state = cluster.start()
    state_file = options.state_path
    try:
        cluster.wait_ready(timeout_sec=180)
        inst = state.instance("inst-1")
        with ClusterClient(state, timeout_sec=30) as client:
            # -- nothing to restore at full size ---------------------------------------------------------------
            refused = heteroflow("restore", "--state-file", str(state_file))
            assert refused.returncode != 0
            assert "nothing to restore" in refused.stderr
            # -- scale down, then restore under traffic (the model's requests held meanwhile) -----------------
            with traffic(state) as load:
                kill(client, inst, 2, mode=KillMode.WORKER)
                entry = until(committed(client, [2]), within=120, what="rank 2 removed")
                assert entry["restorable"] == "ready"
                asked = time.monotonic()
                done = heteroflow("restore", "--state-file", str(state_file), "--wait", "240", timeout=300)
                assert done.returncode == 0, done.stderr
                assert "restored" in done.stdout
                entry = until(published(client, [0, 1, 2, 3]), within=60, what="four ranks published")
                until(lambda: load.answered_since(asked) > 0, within=60, what="completions after the restore")
            assert [ok for _, ok in load.results].count(False) == 0, "a request failed during the restore"
            assert entry["phase"] == "NORMAL"
            assert entry["dead_committed"] == []
            assert entry["restore"]["state"] == "succeeded"
            assert entry["restore"]["ranks"] == [2]
            assert client.published("inst-1") == [0, 1, 2, 3]
            timeline = client.round(entry["restore"]["request_id"])
            assert timeline["kind"] == "restore"
            assert timeline["outcome"] == "succeeded"
            assert [e["kind"] for e in timeline["events"]].count("engines_restart") == 2
            # -- a restore whose rank 2 cannot start: the degraded instance keeps serving ----------------------
            with traffic(state):
                kill(client, inst, 2, mode=KillMode.WORKER)
                until(committed(client, [2]), within=120, what="rank 2 removed again")
            # pod b's NodeManager stops answering (SIGSTOP): the full-size start cannot reach it, the restore
            # fails; it answers again once the failure is recorded, and the degraded relaunch's retry goes through
            node_manager = next(p.pid for p in state.processes if p.name == "node-manager:inst-1-pod-b")
            os.kill(node_manager, signal.SIGSTOP)
            try:
                started = client.restore("inst-1")
                until(
                    lambda: any(e["kind"] == "restore_failed" for e in client.round(started["request_id"])["events"]),
                    within=180,
                    what="the restore failed",
                    period=0.5,
                )
            finally:
                os.kill(node_manager, signal.SIGCONT)
            entry = until(published(client, [0, 1, 3]), within=180, what="the degraded instance serving again")
            last = until(
                lambda: (e := status_of(client)) is not None and e["restore"]["state"] != "running" and e["restore"],
                within=120,
                what="the restore's outcome",
            )
            assert entry["phase"] == "SCALED_DOWN_RUNNING"
            assert entry["dead_committed"] == [2]
            assert last["state"] == "failed"
            assert last["degraded_phase"] == "SCALED_DOWN_RUNNING"
            assert last["error"]
            assert client.completion("served scaled down after a failed restore")
            # -- the degraded relaunch started [0, 1, 3] as a world of 3 (no release starts with ranks dead) --
            world = {rank: client.engine_info(engine_url(inst, rank)) for rank in (0, 1, 3)}
            assert {rank: (info["dp_rank"], info["dp_size"]) for rank, info in world.items()} == {
                0: (0, 3),
                1: (1, 3),
                3: (2, 3),
            }
            # a fault in that world is scaled down in the engines' own numbering: original 3 is engine rank 2
            with traffic(state) as load:
                kill(client, inst, 3, mode=KillMode.WORKER)
                entry = until(committed(client, [2, 3]), within=120, what="rank 3 removed from the relaunched world")
                entry = until(published(client, [0, 1]), within=60, what="ranks 0 and 1 published")
            assert [ok for _, ok in load.results].count(False) == 0, "a request failed in the renumbered scale-down"
            assert client.engine_info(engine_url(inst, 0))["dead_ranks"] == [2]
            assert client.completion("served by ranks 0 and 1 of the relaunched world")
    finally:
        report = cluster.stop()
    assert report.left == ()
    no_process_left(state)
