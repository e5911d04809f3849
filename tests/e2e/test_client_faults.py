"""What a client sees of faults: the official ``openai`` client (``max_retries=0``) through a local cluster.

One cluster (real processes: controller, Coordinator, NodeManagers, simulated engines with torch workers), six
client threads (three streaming, one of them chat) sending one request after the other, and the faults in turn:

1. rank 2's engine session is SIGSTOPped for 7 s (API server and worker: its status polls time out, DEAD
   evidence by unreachability) and resumed: the same engine answers again, so the evidence is withdrawn, the
   rank is published again, and nothing is rebuilt;
2. rank 2's worker is killed: a scale-down round removes it;
3. rank 0's worker (the DP store host) is killed: a second round.

Across all three not one request fails: no error status, no stream ending in an error or ``abort``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from heteroflow.local import ClusterOptions, LocalCluster
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.faults import KillMode, kill
from heteroflow.local.processes import marked_processes
from tests.support.openai_load import Tally, lanes
from tests.support.polling import until

pytest.importorskip("torch")
pytest.importorskip("openai")
pytestmark = pytest.mark.timeout(900)

STALL_SEC = 7.0
"""How long the engine stays stopped: past the status timeout, short of the collective timeout (10 s)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = tmp_path_factory.mktemp("client-faults")
    config = base / "controller.yaml"
    config.write_text(yaml.safe_dump({"fault_tolerance_config": {"enable_dp_scale_down": True}}))
    options = ClusterOptions(
        data_dir=base / "local",
        server_port=0,
        controller_port=0,
        coordinator_port=0,
        controller_config=config,
        sim_nodes=0,
    )
    local = LocalCluster(options)
    with pytest.MonkeyPatch.context() as env:
        for variable in list(os.environ):  # the processes inherit this environment: nothing from the shell
            if variable.startswith("HETEROFLOW_"):
                env.delenv(variable)
        local.start()
    try:
        local.wait_ready(timeout_sec=300)
        yield local
    finally:
        report = local.stop()
    assert report.left == ()
    assert marked_processes(local.cluster_id) == []


def status(local: LocalCluster) -> dict[str, Any] | None:
    with ClusterClient(local.state, timeout_sec=5) as client:
        try:
            return client.instance_status(local.state.instances[0].instance_id)
        except ClusterUnreachableError:
            return None


def settled(local: LocalCluster, ranks: list[int]) -> dict[str, Any] | None:
    entry = status(local)
    if entry is None or entry.get("running_strategy") or not entry.get("can_serve"):
        return None
    # the round committed (the survivors are the alive ranks), not only the first report's withdrawal
    return entry if entry.get("published_endpoints") == entry.get("alive_dp_ranks") == ranks else None


def engine_pid(local: LocalCluster, rank: int) -> int:
    inst = local.state.instances[0]
    pod = inst.pod(inst.endpoint(rank).pod)
    with ClusterClient(local.state, timeout_sec=5) as client:
        answer = client.node_manager_status(pod.node_manager_url)
    [pid] = [e["pid"] for e in answer["endpoints"] if e.get("endpoint_id") == rank]
    assert isinstance(pid, int)
    return pid


def test_no_request_fails_through_a_stall_and_two_kills(cluster: LocalCluster) -> None:
    state = cluster.state
    inst = state.instances[0]
    tally, stop = Tally(), threading.Event()
    threads = lanes(state, tally, stop, threads=6, max_tokens=16)
    try:
        until(lambda: tally.outcomes["ok"] >= 12, within=60, what="traffic served before the faults")

        # 1. a stall, not a death: the evidence is withdrawn and nothing is rebuilt
        before = status(cluster)
        assert before is not None
        # the engines speak vLLM 0.34 (the default profile), discovered by the NodeManagers
        capability = before["engine_capability"]
        assert (capability["protocol_profile"], capability["scale_down_supported"]) == ("vllm-0.34", True)
        pid = engine_pid(cluster, 2)
        os.killpg(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            until(
                lambda: (e := status(cluster)) is not None and 2 not in e["published_endpoints"],
                within=STALL_SEC,
                what="rank 2 withdrawn while it does not answer",
            )
            time.sleep(max(0.0, STALL_SEC - (time.monotonic() - stopped_at)))  # the fault lasts STALL_SEC
        finally:
            os.killpg(pid, signal.SIGCONT)
        entry = until(lambda: settled(cluster, [0, 1, 2, 3]), within=30, what="rank 2 published again")
        assert entry["phase"] == before["phase"] == "NORMAL"
        assert entry["rounds"] == before["rounds"]  # no scale-down round
        assert entry["generation"] > before["generation"]  # republished over the DEL's hold
        assert engine_pid(cluster, 2) == pid  # the same engine, never relaunched
        served = tally.outcomes["ok"]
        until(lambda: tally.outcomes["ok"] >= served + 6, within=60, what="traffic after the stall")

        # 2. and 3. two deaths, the second of the DP store host
        with ClusterClient(state, timeout_sec=5) as client:
            kill(client, inst, 2, mode=KillMode.WORKER)
        until(lambda: settled(cluster, [0, 1, 3]), within=120, what="rank 2 removed")
        with ClusterClient(state, timeout_sec=5) as client:
            kill(client, inst, 0, mode=KillMode.WORKER)
        until(lambda: settled(cluster, [1, 3]), within=120, what="rank 0 removed")
        served = tally.outcomes["ok"]
        until(lambda: tally.outcomes["ok"] >= served + 6, within=60, what="traffic on the survivors")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=180)
    failed = {k: v for k, v in tally.outcomes.items() if k != "ok"}
    assert failed == {}, tally.failures[:10]
    assert tally.outcomes["ok"] > 0
    assert Path(cluster.state.log_dir).is_dir()
