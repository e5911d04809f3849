"""Acceptance rows on a cluster whose pods each run in a network namespace of their own (``heteroflow up --netns``):
pod IPs, the DP master IP and the hardware mapping by (node, pod ip) on distinct addresses, as on several hosts.

One default cluster (DP 4 over 2 pods) with ``network_namespaces=True``; the rows share it in this order: the
addresses (each pod's IP its own, the DP master pod a's, every process in the namespace it belongs to), A11
through the MindCluster directory on rank 1 (pod a's node), then A3 + A4: rank 0 dies with rank 1 committed, so
the survivors are pod b's ranks and the DP master moves to pod b's address.

Root only (namespaces, a bridge and veth pairs need CAP_NET_ADMIN) with iproute2's ``ip``: elsewhere the rows are
skipped with the reason.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from heteroflow.contracts.serving import COORDINATOR_INSTANCES_PATH
from heteroflow.local import netns
from heteroflow.local.state import NetworkState
from tests.acceptance.evidence import scenario
from tests.acceptance.harness import INSTANCE, ClusterUnderTest, running_cluster
from tests.acceptance.rows import MINDCLUSTER, rank_0_dead_moves_the_master, scale_down_matched

UNAVAILABLE = netns.unavailable_reason(euid=os.geteuid(), ip=netns.find_ip())

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(420),
    pytest.mark.skipif(UNAVAILABLE is not None, reason=f"pods in network namespaces: {UNAVAILABLE}"),
]

POD_A, POD_B = "inst-1-pod-a", "inst-1-pod-b"


def network_left(network: NetworkState) -> list[str]:
    """What of the cluster's bridge, veths and namespaces ``ip`` still lists."""
    ip = netns.find_ip()
    assert ip is not None
    run = netns.ip_runner(ip)
    links = {link["ifname"] for link in json.loads(run(["-j", "link", "show"]) or "[]")}
    namespaces = {ns["name"] for ns in json.loads(run(["-j", "netns", "list"]) or "[]")}
    wanted = [network.bridge, *(pod.veth for pod in network.pods)]
    return [name for name in wanted if name in links] + [p.namespace for p in network.pods if p.namespace in namespaces]


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory, evidence_root: Path) -> Iterator[ClusterUnderTest]:
    networks: list[NetworkState] = []
    for running in running_cluster("netns", tmp_path_factory, evidence_root, ft={}, network_namespaces=True):
        if running.state.network is not None:
            networks.append(running.state.network)
        yield running
    for network in networks:  # the stop above deleted every process first, then the network
        assert network_left(network) == []


def namespace_of(pid: int | str) -> int:
    """The inode of the network namespace ``pid`` runs in (``self`` for this process)."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def named_namespace(name: str) -> int:
    """The inode of the namespace ``ip netns add <name>`` created (bind-mounted under /run/netns)."""
    return os.stat(f"/run/netns/{name}").st_ino


def argument(pid: int, flag: str) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index(flag) + 1]


def pod_ips(cut: ClusterUnderTest) -> dict[str, str]:
    network = cut.state.network
    assert network is not None, "the cluster runs without network namespaces"
    return {pod.pod_id: pod.ip for pod in network.pods}


def test_netns_each_pod_serves_from_an_address_and_a_namespace_of_its_own(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    state, network = cut.state, cut.state.network
    assert network is not None
    ips = pod_ips(cut)
    with scenario(cut, "NETNS-distinct-addresses") as sc:
        sc.fact("network", network.model_dump())
        subnet = ipaddress.ip_network(network.subnet)
        assert sorted(ips) == [POD_A, POD_B]
        assert len(set(ips.values())) == 2  # distinct pod IPs …
        for ip in ips.values():  # … of the cluster's own /24, neither loopback nor the bridge
            assert ipaddress.ip_address(ip) in subnet, ip
            assert not ipaddress.ip_address(ip).is_loopback, ip
            assert ip != network.gateway
        for url in (state.server_url, state.controller_url, state.coordinator_url):
            assert httpx.URL(url).host == network.gateway  # the root namespace's services, on the bridge
        assert {e.id: e.ip for e in cut.inst.endpoints} == {e.id: ips[e.pod] for e in cut.inst.endpoints}
        assert {p.pod_id: httpx.URL(p.node_manager_url).host for p in cut.inst.pods} == ips

        # the DP master is pod 0's IP: in the pods' specs and on the engines' command lines
        specs = {
            pod.pod_id: json.loads((Path(state.data_dir) / "specs" / f"{pod.pod_id}.json").read_text())
            for pod in cut.inst.pods
        }
        assert {pod: spec["dp_master_ip"] for pod, spec in specs.items()} == {POD_A: ips[POD_A], POD_B: ips[POD_A]}

        # what the controller took from the NodeManagers' registrations: it publishes each rank at its pod's IP
        with cut.http() as http:
            answer = http.get(state.coordinator_url + COORDINATOR_INSTANCES_PATH)
        answer.raise_for_status()
        [view] = [i for i in answer.json()["instances"] if i["instance_id"] == INSTANCE]
        published = sc.fact("coordinator_endpoints", {e["id"]: e["ip"] for e in view["endpoints"]})
        assert published == {e.id: ips[e.pod] for e in cut.inst.endpoints}
        entry = cut.status()
        assert entry is not None
        registered = sc.fact("controller_pods", {p["pod_id"]: p["pod_ip"] for p in entry["pods"]})
        assert registered == ips

        # each NodeManager and the engines it launched run inside their pod's namespace; the rest in the root one
        root = namespace_of("self")
        pods = {pod.pod_id: named_namespace(pod.namespace) for pod in network.pods}
        assert len({root, *pods.values()}) == 3
        for process in cut.cluster.processes:
            role, _, pod_id = process.name.partition(":")
            expected = pods[pod_id] if role == "node-manager" else root
            assert namespace_of(process.pid) == expected, process.name
        engines = sc.fact("engines", cut.engines())
        for rank, engine in engines.items():
            pod_id = cut.inst.endpoint(rank).pod
            assert namespace_of(engine["pid"]) == pods[pod_id], rank
            assert argument(engine["pid"], "--host") == ips[pod_id]
            assert argument(engine["pid"], "--master-addr") == ips[POD_A]
        assert sc.inference(cut.baseline) == cut.baseline


def test_a11_netns_via_mindcluster_hardware_first_then_rank_1_dead(cut: ClusterUnderTest) -> None:
    cut.serving([0, 1, 2, 3])
    with scenario(cut, "NETNS-A11-mindcluster-rank-1") as sc:
        # rank 1's card on pod a's node: the controller maps it through pod a, registered at its own IP
        scale_down_matched(cut, sc, rank=1, via="mindcluster", source=MINDCLUSTER, serving=[0, 2, 3])
        said = sc.fault("hardware", "--rank", "1", "--via", "mindcluster", "--cleared", target=[1])
        assert "no longer lists" in said, said
        cut.standing_faults_cleared()


def test_a3_a4_netns_rank_0_dead_moves_the_master_to_the_other_pods_address(cut: ClusterUnderTest) -> None:
    cut.serving([0, 2, 3], dead=[1])
    ips = pod_ips(cut)
    with scenario(cut, "NETNS-A03-A04-rank-0-dead-master-to-pod-b") as sc:
        entry = rank_0_dead_moves_the_master(cut, sc, dead_before=[1])
        # survivors [2, 3] are pod b's: the applies named pod b's address as the DP master, not pod a's
        [timeline] = [r for r in cut.rounds() if r["request_id"] == entry["request_id"]]
        applies = [e for e in cut.round(timeline["request_id"])["events"] if e["kind"] == "apply"]
        assert [(a["pod_id"], a["body"]["params"]["dp_master_ip"]) for a in applies] == [(POD_B, ips[POD_B])]
        assert ips[POD_B] != ips[POD_A]
