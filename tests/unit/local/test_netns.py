"""Pods in network namespaces of their own: the address plan, the names, the subnet choice, the command lines, and
the create/delete sequence against a recording ``ip`` (no root needed: the real one runs in the acceptance suite).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from heteroflow.cli.main import app
from heteroflow.local import ClusterError, ClusterOptions, LocalCluster, netns
from heteroflow.local.netns import (
    IFNAME_MAX,
    MAX_PODS,
    NetworkError,
    NetworkRecord,
    choose_subnet,
    close_network,
    open_network,
    plan_network,
    unavailable_reason,
    used_networks,
)
from heteroflow.local.plan import InstancePorts, Layout, PlanError, command_line, plan_instances, process_plans

CLUSTER_ID = "4f0c9a1e77d94c2d8e5b1a0f3c6d2e9b"
SUBNET = ipaddress.IPv4Network("10.51.29.0/24")


# == the plan ====================================================================================================
def test_pods_get_consecutive_addresses_after_the_bridge_and_names_of_their_own() -> None:
    plan = plan_network(CLUSTER_ID, 3, SUBNET)
    assert (plan.bridge, plan.subnet, plan.gateway) == ("hf4f0c9a1e-br", "10.51.29.0/24", "10.51.29.1")
    assert [(p.namespace, p.veth, p.ip) for p in plan.pods] == [
        ("hf-4f0c9a1e-0", "hf4f0c9a1e-0", "10.51.29.2"),
        ("hf-4f0c9a1e-1", "hf4f0c9a1e-1", "10.51.29.3"),
        ("hf-4f0c9a1e-2", "hf4f0c9a1e-2", "10.51.29.4"),
    ]


def test_interface_names_fit_the_kernel_limit_up_to_the_last_pod_a_24_holds() -> None:
    plan = plan_network("f" * 32, MAX_PODS, SUBNET)
    names = [plan.bridge, *(p.veth for p in plan.pods)]
    assert max(len(name) for name in names) <= IFNAME_MAX
    assert len(set(names)) == len(names)
    assert plan.pods[-1].ip == "10.51.29.254"
    assert len({p.ip for p in plan.pods} | {plan.gateway}) == MAX_PODS + 1


def test_more_pods_than_a_24_holds_or_another_prefix_is_refused() -> None:
    with pytest.raises(NetworkError, match="do not fit"):
        plan_network(CLUSTER_ID, MAX_PODS + 1, SUBNET)
    with pytest.raises(NetworkError, match="/24"):
        plan_network(CLUSTER_ID, 2, ipaddress.IPv4Network("10.51.0.0/16"))


ADDRESSES = json.dumps(
    [
        {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8},
                                       {"family": "inet6", "local": "::1", "prefixlen": 128}]},
        {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "192.0.2.2", "prefixlen": 24}]},
        {"ifname": "docker0", "addr_info": [{"family": "inet", "local": "172.17.0.1", "prefixlen": 16}]},
        {"ifname": "ifb0", "addr_info": []},
    ]
)  # fmt: skip
ROUTES = json.dumps(
    [
        {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
        {"dst": "10.8.0.0/16", "dev": "tun0"},
        {"dst": "203.0.113.7", "dev": "eth0"},
    ]
)


def test_used_networks_are_every_ipv4_address_network_and_every_route_but_the_default() -> None:
    assert sorted(map(str, used_networks(ADDRESSES, ROUTES))) == sorted(
        ["127.0.0.0/8", "192.0.2.0/24", "172.17.0.0/16", "10.8.0.0/16", "203.0.113.7/32"]
    )
    assert used_networks("", "") == []  # an older `ip` prints nothing for nothing


@given(
    cluster_id=st.text("0123456789abcdef", min_size=32, max_size=32),
    used=st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255), st.sampled_from([16, 20, 24])), max_size=30),
)
def test_the_chosen_subnet_is_a_private_24_that_overlaps_nothing_the_host_has(
    cluster_id: str, used: list[tuple[int, int, int]]
) -> None:
    taken = [ipaddress.IPv4Network(f"10.{a}.{b}.0/{prefix}", strict=False) for a, b, prefix in used]
    chosen = choose_subnet(cluster_id, taken)
    assert chosen.prefixlen == 24
    assert chosen.is_private
    assert not any(chosen.overlaps(net) for net in taken)
    assert choose_subnet(cluster_id, taken) == chosen  # derived from the cluster id, not random


def test_the_subnet_comes_from_the_next_private_range_when_10_8_is_taken_and_an_error_when_all_are() -> None:
    ten = ipaddress.IPv4Network("10.0.0.0/8")
    assert choose_subnet(CLUSTER_ID, [ten]).subnet_of(ipaddress.IPv4Network("172.16.0.0/12"))
    with pytest.raises(NetworkError, match="no free /24"):
        choose_subnet(CLUSTER_ID, [*netns.CANDIDATE_RANGES])


def test_namespaces_need_linux_root_and_ip() -> None:
    assert unavailable_reason(euid=0, ip="/usr/sbin/ip", platform="linux") is None
    assert "root" in (unavailable_reason(euid=1000, ip="/usr/sbin/ip", platform="linux") or "")
    assert "iproute2" in (unavailable_reason(euid=0, ip=None, platform="linux") or "")
    assert "Linux only" in (unavailable_reason(euid=0, ip="/sbin/ip", platform="darwin") or "")


# == the cluster plan with namespaces ============================================================================
def layout(*, instances: int = 1, pods: int = 2, dp_size: int = 4, namespaces: bool) -> Layout:
    network = plan_network(CLUSTER_ID, instances * pods, SUBNET)
    ports = [
        InstancePorts(
            tuple(range(100 + 10 * k, 100 + 10 * k + pods)),
            tuple(range(200 + 10 * k, 200 + 10 * k + dp_size)),
            300 + k,
            400 + k,
        )
        for k in range(instances)
    ]
    host = network.gateway if namespaces else "127.0.0.1"
    plans = plan_instances(
        instances=instances,
        dp_size=dp_size,
        pods=pods,
        sim_nodes=2,
        ports=ports,
        host=host,
        python="python",
        pod_networks=network.pods if namespaces else (),
    )
    return Layout(host, 8080, 8500, 8400, tuple(plans), 2)


def processes(lay: Layout, tmp_path: Path) -> list[tuple[str, list[str]]]:
    plans = process_plans(
        lay,
        database_url="sqlite:///x.db",
        controller={"store_url": "sqlite:///s.db"},
        controller_config_path=tmp_path / "c.yaml",
        spec_paths={p.pod_id: tmp_path / f"{p.pod_id}.json" for inst in lay.instances for p in inst.pods},
        engine_log_dir=tmp_path,
        admin_token="hf_admin",
        cluster_token="hf_cluster",
        agent_token="hf_agent",
        monitor_token="hf_monitor",
        hardware_directory=tmp_path / "mindcluster",
    )
    return [(p.name, command_line(p, python="python", ip="/usr/sbin/ip")) for p in plans]


def test_each_pod_has_its_own_ip_and_each_instance_its_first_pods_ip_as_dp_master() -> None:
    lay = layout(instances=2, pods=2, namespaces=True)
    ips = [[(p.pod_id, p.ip, p.netns) for p in inst.pods] for inst in lay.instances]
    assert ips == [
        [("inst-1-pod-a", "10.51.29.2", "hf-4f0c9a1e-0"), ("inst-1-pod-b", "10.51.29.3", "hf-4f0c9a1e-1")],
        [("inst-2-pod-a", "10.51.29.4", "hf-4f0c9a1e-2"), ("inst-2-pod-b", "10.51.29.5", "hf-4f0c9a1e-3")],
    ]
    assert [[p.spec.dp_master_ip for p in inst.pods] for inst in lay.instances] == [
        ["10.51.29.2", "10.51.29.2"],
        ["10.51.29.4", "10.51.29.4"],
    ]


def test_node_managers_start_inside_their_namespace_on_their_pod_ip_and_the_rest_on_the_bridge(
    tmp_path: Path,
) -> None:
    found = dict(processes(layout(namespaces=True), tmp_path))
    node_manager = found["node-manager:inst-1-pod-b"]
    assert node_manager[:6] == ["/usr/sbin/ip", "netns", "exec", "hf-4f0c9a1e-1", "python", "-m"]
    args = node_manager[node_manager.index("node-manager") :]
    assert args[args.index("--pod-ip") + 1] == args[args.index("--host") + 1] == "10.51.29.3"
    assert args[args.index("--controller") + 1] == "http://10.51.29.1:8500"
    for name in ("server", "controller", "coordinator", "agent:sim-local-01"):
        assert found[name][:3] == ["python", "-m", "heteroflow"], name  # root namespace
    assert found["server"][found["server"].index("--host") + 1] == "10.51.29.1"
    coordinator = found["coordinator"]
    assert coordinator[coordinator.index("--platform-url") + 1] == "http://10.51.29.1:8080"


def test_without_namespaces_every_command_line_is_the_plain_interpreter_on_loopback(tmp_path: Path) -> None:
    lay = layout(namespaces=False)
    for name, argv in processes(lay, tmp_path):
        assert argv[:3] == ["python", "-m", "heteroflow"], name
        assert "10.51.29.1" not in argv
    assert {p.ip for inst in lay.instances for p in inst.pods} == {"127.0.0.1"}
    assert all(p.netns is None for inst in lay.instances for p in inst.pods)
    assert lay.instances[0].pods[1].spec.dp_master_ip == "127.0.0.1"


def test_a_pod_count_that_does_not_match_the_pod_networks_is_a_plan_error() -> None:
    network = plan_network(CLUSTER_ID, 3, SUBNET)
    with pytest.raises(PlanError, match="4 pod networks"):
        plan_instances(
            instances=2,
            dp_size=2,
            pods=2,
            sim_nodes=1,
            ports=[InstancePorts((1, 2), (3, 4), 5, 6), InstancePorts((7, 8), (9, 10), 11, 12)],
            python="python",
            pod_networks=network.pods,
        )


# == create and delete, against a recording `ip` ================================================================
class RecordingIp:
    """Keeps the links and namespaces a real ``ip`` would have; records every command; fails on request."""

    def __init__(self, *, fail_on: str | None = None) -> None:
        self.commands: list[list[str]] = []
        self.links: set[str] = {"lo", "eth0"}
        self.namespaces: set[str] = set()
        self.fail_on = fail_on

    def __call__(self, args: Sequence[str]) -> str:
        args = list(args)
        self.commands.append(args)
        if self.fail_on is not None and self.fail_on in args:
            raise NetworkError(f"`ip {' '.join(args)}` failed: RTNETLINK answers: Operation not permitted")
        match args:
            case ["-j", "addr", "show"]:
                return ADDRESSES
            case ["-j", "route", "show"]:
                return ROUTES
            case ["-j", "link", "show"]:
                return json.dumps([{"ifname": name} for name in sorted(self.links)])
            case ["-j", "netns", "list"]:
                return json.dumps([{"name": name} for name in sorted(self.namespaces)])
            case ["link", "add", name, *_]:
                self.links.add(name)
            case ["link", "del", name]:
                self.links.discard(name)
            case ["netns", "add", name]:
                self.namespaces.add(name)
            case ["netns", "del", name]:
                self.namespaces.discard(name)
        return ""


def open_with(ip: RecordingIp, record: Path, *, cluster_id: str = CLUSTER_ID, alive: bool = False) -> netns.NetworkPlan:
    return open_network(
        cluster_id=cluster_id,
        pods=2,
        record_path=record,
        run=ip,
        owner_pid=4242,
        owner_start_ticks=99,
        owner_alive=lambda _: alive,
    )


def test_open_records_then_creates_the_bridge_and_each_pods_namespace_and_close_deletes_all(tmp_path: Path) -> None:
    ip = RecordingIp()
    record_path = tmp_path / "network.json"
    plan = open_with(ip, record_path)
    record = NetworkRecord.model_validate_json(record_path.read_text())
    assert (record.bridge, record.namespaces, record.veths, record.owner_pid) == (
        plan.bridge,
        ["hf-4f0c9a1e-0", "hf-4f0c9a1e-1"],
        ["hf4f0c9a1e-0", "hf4f0c9a1e-1"],
        4242,
    )
    assert not ipaddress.IPv4Network(plan.subnet).overlaps(ipaddress.IPv4Network("10.8.0.0/16"))
    pod = plan.pods[1]
    created = ip.commands[2:]
    assert created[0][:4] == ["link", "add", plan.bridge, "type"]
    assert ["netns", "add", pod.namespace] in created
    assert ["link", "add", pod.veth, "type", "veth", "peer", "name", "eth0", "netns", pod.namespace] in created
    assert ["link", "set", pod.veth, "master", plan.bridge] in created
    assert ["-n", pod.namespace, "addr", "add", f"{pod.ip}/24", "dev", "eth0"] in created
    assert ["-n", pod.namespace, "link", "set", "lo", "up"] in created
    assert ["-n", pod.namespace, "route", "add", "default", "via", plan.gateway] in created

    ip.commands.clear()
    assert close_network(record, record_path=record_path, run=ip) == []
    deleted = [c for c in ip.commands if "del" in c]
    # veths first: a deleted namespace frees its veth only when the kernel gets round to destroying it
    assert deleted == [
        ["link", "del", "hf4f0c9a1e-0"],
        ["link", "del", "hf4f0c9a1e-1"],
        ["netns", "del", "hf-4f0c9a1e-0"],
        ["netns", "del", "hf-4f0c9a1e-1"],
        ["link", "del", plan.bridge],
    ]
    assert (ip.links, ip.namespaces, record_path.exists()) == ({"lo", "eth0"}, set(), False)
    ip.commands.clear()
    assert close_network(record, record_path=record_path, run=ip) == []  # idempotent: nothing left to delete
    assert [c for c in ip.commands if "del" in c] == []


def test_a_crashed_runs_leftovers_are_deleted_before_a_new_network_is_made(tmp_path: Path) -> None:
    ip = RecordingIp()
    record_path = tmp_path / "network.json"
    crashed = open_with(ip, record_path, cluster_id="a" * 32)
    fresh = open_with(ip, record_path, cluster_id="b" * 32)
    assert crashed.bridge not in ip.links
    assert not {p.namespace for p in crashed.pods} & ip.namespaces
    assert fresh.bridge in ip.links
    assert NetworkRecord.model_validate_json(record_path.read_text()).cluster_id == "b" * 32


def test_a_network_whose_launcher_still_runs_is_never_deleted(tmp_path: Path) -> None:
    ip = RecordingIp()
    record_path = tmp_path / "network.json"
    running = open_with(ip, record_path)
    with pytest.raises(NetworkError, match=r"pid 4242 .* still owns"):
        open_with(ip, record_path, cluster_id="b" * 32, alive=True)
    assert running.bridge in ip.links


def test_a_failed_creation_deletes_what_it_had_created(tmp_path: Path) -> None:
    ip = RecordingIp(fail_on="route")
    record_path = tmp_path / "network.json"
    with pytest.raises(NetworkError, match="Operation not permitted"):
        open_with(ip, record_path)
    assert (ip.links, ip.namespaces, record_path.exists()) == ({"lo", "eth0"}, set(), False)


# == refusing before anything is created =========================================================================
@contextlib.contextmanager
def process_globals_restored() -> Iterator[None]:
    """`up` installs signal handlers and points the root logger at the runner's stderr, which is closed after
    the call: give the test process its own back."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def test_without_ip_the_cluster_refuses_before_creating_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netns, "find_ip", lambda: None)
    cluster = LocalCluster(ClusterOptions(data_dir=tmp_path / "local", network_namespaces=True))
    with pytest.raises(ClusterError, match="iproute2"):
        cluster.start()
    assert not (tmp_path / "local").exists()
    assert cluster.processes == []


def test_up_with_netns_where_it_cannot_work_exits_2_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netns, "unavailable_reason", lambda **_: "network namespaces need root")
    with process_globals_restored():
        result = CliRunner().invoke(app, ["up", "--netns", "--data-dir", str(tmp_path / "local"), "--no-browser"])
    assert result.exit_code == 2, result.output
    assert "network namespaces need root" in result.output
    assert not (tmp_path / "local").exists()
