"""The whole local cluster as real processes: ``LocalCluster``, ``heteroflow fault``,
``heteroflow status`` and ``heteroflow up``.

One cluster (DP 4 over 2 pods, simulated engines with torch workers) walks the scenario in turn to stay
within the budget of a 2-core machine: serve, kill rank 2's worker under traffic (a committed scale-down
round, the Coordinator publishes [0, 1, 3]), kill rank 0 — the store master — under traffic (survivors
[1, 3], cumulative removal [0, 2], the master moves to rank 1), outputs identical to the baseline, then stop
with no process of the cluster left. A second has a card reported gone (XID 79 through the platform's feed): the
rebuild leaves its rank out. A third runs ``heteroflow up`` itself and stops it with SIGTERM; a fourth does the
same with ``--netns`` (root only: each pod in a network namespace of its own, all deleted at stop).
Nothing sleeps for synchronisation: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from heteroflow.http.tls import client_tls
from heteroflow.local import ClusterOptions, ClusterState, LocalCluster, netns, read_state
from heteroflow.local.client import ClusterAuth, ClusterClient, ClusterUnreachableError
from heteroflow.local.cluster import NETWORK_RECORD
from heteroflow.local.processes import kill_marked, marked_processes, session_members
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PROMPTS = ["the quick brown fox", "hello world"]
T = TypeVar("T")
NETNS_UNAVAILABLE = netns.unavailable_reason(euid=os.geteuid(), ip=netns.find_ip())


def heteroflow(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "heteroflow", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@dataclass
class Traffic:
    """Completions through the Coordinator in a background thread, as a user would send them."""

    state: ClusterState
    results: list[tuple[float, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with ClusterClient(self.state, timeout_sec=30) as client:
            while not self.stop.is_set():
                try:
                    client.completion("traffic keeps the ranks in their collectives")
                    self.results.append((time.monotonic(), True))
                except ClusterUnreachableError:
                    self.results.append((time.monotonic(), False))

    def answered_since(self, since: float) -> int:
        return sum(1 for at, ok in self.results if ok and at > since)


@contextmanager
def traffic(state: ClusterState) -> Iterator[Traffic]:
    load = Traffic(state)
    thread = threading.Thread(target=load.run, name="traffic", daemon=True)
    thread.start()
    try:
        until(lambda: load.answered_since(0), within=30, what="the first completion under traffic")
        yield load
    finally:
        load.stop.set()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the traffic thread did not stop"


def status_of(client: ClusterClient, instance_id: str = "inst-1") -> dict[str, Any] | None:
    try:
        return client.instance_status(instance_id)
    except ClusterUnreachableError:
        return None


def committed(client: ClusterClient, dead: list[int]) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        entry = status_of(client)
        if entry and entry["phase"] == "SCALED_DOWN_RUNNING" and entry["dead_committed"] == dead:
            return entry if entry["can_serve"] else None
        return None

    return check


def fault(state_file: Path, *args: str) -> str:
    result = heteroflow("fault", *args, "--state-file", str(state_file), "--instance", "inst-1")
    assert result.returncode == 0, result.stderr
    return result.stdout


def no_process_left(state: ClusterState) -> None:
    assert session_members(p.pid for p in state.processes) == {}
    assert marked_processes(state.cluster_id) == []


def test_local_cluster_scales_down_twice_under_traffic_and_stops_clean(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    config = tmp_path / "operator.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "fault_tolerance_config": {
                    "serving_view_refresh_sec": 2.0,
                    "dp_scale_down_config": {"poll_interval_sec": 0.5},
                }
            }
        )
    )
    options = ClusterOptions(
        data_dir=tmp_path / "local",
        server_port=0,
        controller_port=0,
        coordinator_port=0,
        controller_config=config,
    )
    cluster = LocalCluster(options)
    state = cluster.start()
    state_file = options.state_path
    try:
        # -- the state file and the merged controller configuration ------------------------------------
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        assert read_state(state_file) == state
        inst = state.instance("inst-1")
        assert [e.id for e in inst.endpoints] == [0, 1, 2, 3]
        assert [(p.pod_id, p.endpoint_ids, p.node_name) for p in inst.pods] == [
            ("inst-1-pod-a", [0, 1], "sim-local-01"),
            ("inst-1-pod-b", [2, 3], "sim-local-02"),
        ]
        assert all(e.device_infos and e.device_infos[0].device_id.startswith("GPU-") for e in inst.endpoints)
        cluster.wait_ready(timeout_sec=180)
        with httpx.Client(auth=ClusterAuth(state), timeout=10, verify=client_tls()) as http:
            effective = http.get(f"{state.controller_url}/controller/config").json()["fault_tolerance_config"]
        assert effective["enable_dp_scale_down"] is True  # generated
        assert effective["poll_interval_sec"] == 0.5  # the operator's file wins
        assert effective["serving_view_refresh_sec"] == 2.0

        client = cluster.client(timeout_sec=30)
        baseline = [client.completion(p) for p in PROMPTS]
        assert client.published("inst-1") == [0, 1, 2, 3]

        # -- round 1: rank 2's worker dies under traffic ------------------------------------------------
        with traffic(state) as load:
            said = fault(state_file, "kill", "--rank", "2")
            assert "rank 2" in said
            entry = until(committed(client, [2]), within=60, what="rank 2 removed and committed")
            assert entry["published_endpoints"] == [0, 1, 3]
            assert client.published("inst-1") == [0, 1, 3]
            after = time.monotonic()
            until(lambda: load.answered_since(after) >= 3, within=30, what="completions answer after round 1")
        round_1 = entry["request_id"]

        listed = heteroflow("status", "--state-file", str(state_file), "--json")
        assert listed.returncode == 0, listed.stderr
        assert [(e["instance_id"], e["phase"]) for e in json.loads(listed.stdout)] == [
            ("inst-1", "SCALED_DOWN_RUNNING")
        ]
        table = heteroflow("status", "--state-file", str(state_file))
        assert table.returncode == 0, table.stderr
        assert "SCALED_DOWN_RUNNING" in table.stdout

        # -- round 2: rank 0 (the store master) dies under traffic --------------------------------------
        with traffic(state) as load:
            fault(state_file, "kill", "--rank", "0")
            entry = until(committed(client, [0, 2]), within=60, what="ranks 0 and 2 removed and committed")
            assert entry["request_id"] != round_1
            assert client.published("inst-1") == [1, 3]
            after = time.monotonic()
            until(lambda: load.answered_since(after) >= 3, within=30, what="completions answer after round 2")
        timeline = client.round(entry["request_id"])
        assert timeline["outcome"] == "committed"
        decided = next(e for e in timeline["events"] if e["kind"] == "decided")
        assert decided["survivors"] == [1, 3]
        applies = [e for e in timeline["events"] if e["kind"] == "apply"]
        assert len(applies) == 2, applies  # one per pod, never twice
        for apply in applies:
            assert apply["http_status"] == 202
            assert apply["body"]["params"]["removed_dp_ranks"] == [0, 2]  # cumulative
            assert apply["body"]["params"]["dp_master_ip"] == inst.endpoint(1).ip  # min(survivors) = rank 1
        assert [client.completion(p) for p in PROMPTS] == baseline  # the same greedy outputs on 2 ranks
        client.close()
    finally:
        report = cluster.stop()
    assert report.left == ()
    no_process_left(state)
    assert (Path(state.log_dir) / "controller.log").stat().st_size > 0  # logs stay
    assert sorted(p.name for p in (Path(state.log_dir) / "inst-1").iterdir()) == [f"engine-{r}.log" for r in range(4)]


def run_up(tmp_path: Path, *extra: str) -> tuple[ClusterState, str]:
    """``heteroflow up <extra>`` as a subprocess (DP 2): wait for its state file and one completion, SIGTERM it,
    check it exited 0 and left no process; its state and output. Whatever happens, nothing of it is left."""
    state_file = tmp_path / "state.json"
    log = (tmp_path / "up.out").open("wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "heteroflow", "up",
            "--data-dir", str(tmp_path / "local"), "--state-file", str(state_file),
            "--port", "0", "--controller-port", "0", "--coordinator-port", "0",
            "--dp", "2", "--sim-nodes", "1", "--no-browser", *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    state: ClusterState | None = None
    try:

        def alive_and(check: Callable[[], T | None]) -> Callable[[], T | None]:
            def wrapped() -> T | None:
                if process.poll() is not None:
                    output = (tmp_path / "up.out").read_text(errors="replace")
                    raise AssertionError(f"heteroflow up exited with {process.returncode}:\n{output}")
                return check()

            return wrapped

        state = until(
            alive_and(lambda: read_state(state_file) if state_file.exists() else None),
            within=60,
            what="the state file",
        )
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        assert {p.name.split(":")[0] for p in state.processes} == {
            "server", "controller", "coordinator", "node-manager", "agent",
        }  # fmt: skip

        def one_completion() -> str | None:
            with ClusterClient(state, timeout_sec=30) as client:
                try:
                    return client.completion("hello world")
                except ClusterUnreachableError:
                    return None

        assert until(alive_and(one_completion), within=180, what="a completion through the Coordinator", period=0.5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90) == 0
    finally:
        if process.poll() is None:
            process.kill()  # its processes get SIGTERM from the kernel (parent death) and the sweep below
            process.wait(timeout=30)
        leftovers = marked_processes(state.cluster_id) if state is not None else []
        if state is not None:
            kill_marked(state.cluster_id)  # never leave a cluster behind for the next test, even on failure
        record = netns.read_record(tmp_path / "local" / NETWORK_RECORD)
        ip = netns.find_ip()
        if record is not None and ip is not None:  # nor its network (an `up` that was killed could not delete it)
            netns.close_network(record, record_path=tmp_path / "local" / NETWORK_RECORD, run=netns.ip_runner(ip))
    output = (tmp_path / "up.out").read_text(errors="replace")
    assert state is not None
    assert leftovers == []
    no_process_left(state)
    assert record is None, "the network was still recorded after `up` exited"
    return state, output


def test_a_rebuild_comes_back_without_the_rank_whose_card_the_platform_reported_gone(tmp_path: Path) -> None:
    """An XID 79 on rank 3's card through the platform's hardware-event feed, and no engine confirms it within the
    correlation window: the whole instance is rebuilt with real engine processes, and rank 3 is left out (its
    card has a standing fault), so the instance serves on [0, 1, 2] and says why."""
    pytest.importorskip("torch")
    options = ClusterOptions(data_dir=tmp_path / "local", server_port=0, controller_port=0, coordinator_port=0)
    cluster = LocalCluster(options)
    state = cluster.start()
    try:
        cluster.wait_ready(timeout_sec=180)
        with ClusterClient(state, timeout_sec=30) as client:
            said = fault(options.state_path, "hardware", "--rank", "3", "--via", "gpu-health")
            assert "MAPPED [3]" in said, said
            entry = until(committed(client, [3]), within=120, what="rebuilt without rank 3")
            assert entry["published_endpoints"] == [0, 1, 2]
            assert entry["relaunch"]["kind"] == "WITHOUT_RANKS"
            assert entry["relaunch"]["ranks"] == [3]
            assert entry["standing_hardware_faults"] == entry["relaunch"]["faults"]
            assert entry["last_error"] is None
            assert all(client.completion(f"served without rank 3, {i}") for i in range(3))
    finally:
        report = cluster.stop()
    assert report.left == ()
    no_process_left(state)


def test_up_command_writes_state_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    state, output = run_up(tmp_path, "--pods", "1")
    assert "stopped; logs are in" in output
    assert state.network is None
    assert all(e.ip == "127.0.0.1" for e in state.instances[0].endpoints)


@pytest.mark.skipif(NETNS_UNAVAILABLE is not None, reason=f"pods in network namespaces: {NETNS_UNAVAILABLE}")
def test_up_with_netns_serves_from_a_namespace_per_pod_and_deletes_them_on_sigterm(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    state, output = run_up(tmp_path, "--pods", "2", "--netns")
    assert "stopped; logs are in" in output
    network = state.network
    assert network is not None
    assert [(p.pod_id, p.ip) for p in network.pods] == [
        (pod.pod_id, urlsplit(pod.node_manager_url).hostname) for pod in state.instances[0].pods
    ]
    assert len({p.ip for p in network.pods} | {network.gateway, "127.0.0.1"}) == 4
    for pod in network.pods:
        assert f"{pod.ip} in namespace {pod.namespace}" in output  # announced
    assert urlsplit(state.controller_url).hostname == network.gateway
    ip = netns.find_ip()
    assert ip is not None
    listed = subprocess.run([ip, "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not {p.namespace for p in network.pods} & {ns["name"] for ns in json.loads(listed or "[]")}
    links = subprocess.run([ip, "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    assert not {network.bridge, *(p.veth for p in network.pods)} & {link["ifname"] for link in json.loads(links)}
