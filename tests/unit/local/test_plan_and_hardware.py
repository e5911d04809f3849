"""The local cluster's plan (card placement, the controller's hardware sources) and the document and XID side of
``heteroflow fault hardware`` (the acceptance rows drive the same paths against real processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.agent.simulated import CARD_FAULT_PROFILES, SimulatedCollector
from heteroflow.contracts.serving import DeviceInfo
from heteroflow.core.clock import SystemClock
from heteroflow.local import hardware
from heteroflow.local.client import ClusterAuth, ClusterClient
from heteroflow.local.faults import FaultError
from heteroflow.local.hardware import HardwareFaultError, HardwareVia, write_configmap
from heteroflow.local.plan import (
    CARDS_PER_NODE,
    NUM_LOGICAL_EXPERTS,
    InstancePorts,
    Layout,
    PlanError,
    even_redundant_experts,
    plan_instances,
    process_plans,
    quiet_cards,
)
from heteroflow.local.state import ClusterState, EndpointState, InstanceState, PodState
from heteroflow.serving.controller.monitor.mindcluster import parse_document


def plan(dp_size: int, pods: int, sim_nodes: int = 2) -> Layout:
    ports = [InstancePorts(tuple(range(100, 100 + pods)), tuple(range(200, 200 + dp_size)), 300, 301)]
    instances = plan_instances(
        instances=1, dp_size=dp_size, pods=pods, sim_nodes=sim_nodes, ports=ports, python="python"
    )
    return Layout("127.0.0.1", 8080, 8500, 8400, tuple(instances), sim_nodes)


@given(dp_size=st.integers(1, 24), pods=st.integers(1, 4))
def test_ranks_sit_on_distinct_cards_that_never_grow_a_fault(dp_size: int, pods: int) -> None:
    if pods > dp_size:
        pods = dp_size
    layout = plan(dp_size, pods)
    taken: set[tuple[str, int]] = set()
    for pod in layout.instances[0].pods:
        agent = SimulatedCollector(clock=SystemClock(), count=0, seed=pod.node_name)
        for rank in pod.ranks:
            card = rank.device.index
            assert card is not None
            assert (pod.node_name, card) not in taken
            taken.add((pod.node_name, card))
            assert rank.device.device_id == agent.uuid_of(card)  # what the node's agent reports for it
            if card < CARDS_PER_NODE:
                assert agent.profile_of(card) not in CARD_FAULT_PROFILES


@pytest.mark.parametrize(
    ("asked", "dp_size", "used"), [(4, 4, 4), (4, 2, 4), (4, 3, 5), (4, 24, 20), (0, 4, 0), (0, 2, 0), (4, 1, 4)]
)
def test_redundant_experts_are_rounded_up_to_an_even_layout(asked: int, dp_size: int, used: int) -> None:
    assert even_redundant_experts(asked, dp_size) == used
    assert (NUM_LOGICAL_EXPERTS + used) % dp_size == 0  # as vLLM's EPLB requires
    (inst,) = plan_instances(
        instances=1,
        dp_size=dp_size,
        pods=1,
        sim_nodes=1,
        ports=[InstancePorts((100,), tuple(range(200, 200 + dp_size)), 300, 301)],
        python="python",
        num_redundant_experts=asked,
    )
    assert inst.pods[0].spec.num_redundant_experts == used


def test_no_redundancy_where_the_logical_experts_do_not_divide_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="4 logical experts and no redundant one do not divide evenly over 3"):
        even_redundant_experts(0, 3)


def test_quiet_cards_skip_the_profiles_that_fail_and_go_on_past_the_agent() -> None:
    quiet = quiet_cards("sim-local-01")
    assert quiet[:5] == [0, 1, 3, 5, 6]  # 2 and 7 develop an uncorrectable error, 4 a remap failure
    assert quiet[5] == CARDS_PER_NODE


def test_the_controller_follows_both_hardware_sources_with_secrets_in_the_environment(tmp_path: Path) -> None:
    layout = plan(4, 2)
    plans = process_plans(
        layout,
        database_url="sqlite:///x.db",
        controller={"store_url": "sqlite:///s.db"},
        controller_config_path=tmp_path / "c.yaml",
        spec_paths={p.pod_id: tmp_path / f"{p.pod_id}.json" for p in layout.instances[0].pods},
        engine_log_dir=tmp_path,
        admin_token="hf_admin",
        cluster_token="hf_cluster",
        agent_token="hf_agent",
        monitor_token="hf_monitor",
        hardware_directory=tmp_path / "mindcluster",
    )
    [controller] = [p for p in plans if p.name == "controller"]
    env = dict(controller.env)
    assert env["HETEROFLOW_MONITOR_DIRECTORY"] == str(tmp_path / "mindcluster")
    assert env["HETEROFLOW_MONITOR_PLATFORM_URL"] == layout.server_url
    assert env["HETEROFLOW_MONITOR_PLATFORM_TOKEN"] == "hf_monitor"
    assert env["HETEROFLOW_MONITOR_PLATFORM_SOURCE"] == "simulated"
    assert not any("hf_" in arg for p in plans for arg in p.args)
    # the internal routes have their own secret: the admin token opens none of them
    internal = [dict(p.env) for p in plans if p.name == "controller" or p.name.startswith(("node-manager", "coord"))]
    assert internal
    assert {e.get("HETEROFLOW_CLUSTER_TOKEN") for e in internal} == {"hf_cluster"}
    assert not any("hf_admin" in value for p in plans for _, value in p.env)


def test_each_destination_gets_its_own_credential(tmp_path: Path) -> None:
    found = state(tmp_path).model_copy(
        update={
            "server_url": "http://127.0.0.1:1",
            "controller_url": "http://127.0.0.1:2",
            "coordinator_url": "http://127.0.0.1:3",
            "cluster_token": "hf_cluster",
            "api_key": "hf_key",
        }
    )
    auth = ClusterAuth(found)
    assert auth.token_for("http://127.0.0.1:1/api/v1/nodes") == "hf_admin"
    assert auth.token_for("http://127.0.0.1:2/controller/config") == "hf_cluster"
    assert auth.token_for("http://127.0.0.1:3/coordinator/instances") == "hf_cluster"
    assert auth.token_for("http://127.0.0.1:3/v1/completions") == "hf_key"


def test_the_server_reaches_the_controller_for_the_serving_dashboard(tmp_path: Path) -> None:
    layout = plan(4, 2)
    plans = process_plans(
        layout,
        database_url="sqlite:///x.db",
        controller={"store_url": "sqlite:///s.db"},
        controller_config_path=tmp_path / "c.yaml",
        spec_paths={p.pod_id: tmp_path / f"{p.pod_id}.json" for p in layout.instances[0].pods},
        engine_log_dir=tmp_path,
        admin_token="hf_admin",
        cluster_token="hf_cluster",
        agent_token="hf_agent",
        monitor_token="hf_monitor",
        hardware_directory=tmp_path / "mindcluster",
    )
    [server] = [p for p in plans if p.name == "server"]
    [controller] = [p for p in plans if p.name == "controller"]
    env = dict(server.env)
    assert env["HETEROFLOW_SERVER_CONTROLLER_URL"] == layout.controller_url
    # the token the controller requires, so that the proxy is not refused (the cluster's own, not the admin's)
    assert env["HETEROFLOW_CLUSTER_TOKEN"] == dict(controller.env)["HETEROFLOW_CLUSTER_TOKEN"] == "hf_cluster"
    assert f"--port {layout.controller_port}" in " ".join(controller.args)


def state(tmp_path: Path, *, agent_token: str | None = "hf_agent", folder: bool = True) -> ClusterState:
    return ClusterState(
        cluster_id="c",
        launcher_pid=1,
        data_dir=str(tmp_path),
        log_dir=str(tmp_path),
        server_url="http://127.0.0.1:1",
        controller_url="http://127.0.0.1:1",
        coordinator_url="http://127.0.0.1:1",
        admin_token="hf_admin",
        agent_token=agent_token,
        hardware_directory=str(tmp_path / "mindcluster") if folder else None,
        database_url="sqlite:///x.db",
        controller_config="c.yaml",
        instances=[
            InstanceState(
                instance_id="inst-1",
                model="m",
                dp_size=2,
                endpoints=[
                    EndpointState(
                        id=r, ip="127.0.0.1", port=2, pod="p", device_infos=[DeviceInfo(device_id=f"GPU-{r}", index=r)]
                    )
                    for r in range(2)
                ],
                pods=[PodState(pod_id="p", node_manager_url="http://127.0.0.1:3", endpoint_ids=[0, 1], node_name="n1")],
            )
        ],
        processes=[],
    )


def read_back(path: Path) -> list[tuple[str, str, int]]:
    kind, parsed = parse_document(json.loads(path.read_text()), source="dir", hosts_instance=lambda _: True)
    assert (kind, parsed.node_name) == ("configmap", "n1")
    assert parsed.faults is not None, parsed.problems
    assert parsed.problems == ()
    return sorted((f.card, f.fault_code, f.level) for f in parsed.faults)


def test_configmap_documents_round_trip_through_the_directory_sources_parser(tmp_path: Path) -> None:
    cluster = state(tmp_path)
    path, key = write_configmap(cluster, "n1", card="Ascend910-1", code="a8028801, 80e18402", level=5, cleared=False)
    assert key == "80E18402,A8028801|Ascend910-1|n1"  # the controller's key for it
    assert path.name == "mindx-dl-deviceinfo-n1.json"
    write_configmap(cluster, "n1", card="Ascend910-0", code="80E18402", level=6, cleared=False)
    assert read_back(path) == [("Ascend910-0", "80E18402", 6), ("Ascend910-1", "80E18402,A8028801", 5)]
    write_configmap(cluster, "n1", card="Ascend910-1", code="80E18402,A8028801", level=5, cleared=True)
    assert read_back(path) == [("Ascend910-0", "80E18402", 6)]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # written whole, renamed into place


def test_an_unreadable_document_is_replaced_not_merged(tmp_path: Path) -> None:
    cluster = state(tmp_path)
    path = Path(cluster.hardware_directory or "") / "mindx-dl-deviceinfo-n1.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"data": {"DeviceInfoCfg": "{not json')
    write_configmap(cluster, "n1", card="Ascend910-0", code="80E18402", level=4, cleared=False)
    assert read_back(path) == [("Ascend910-0", "80E18402", 4)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"via": HardwareVia.GPU_HEALTH, "level": 5}, "level follows from the XID"),
        ({"via": HardwareVia.GPU_HEALTH, "card": "3"}, "--card does not apply"),
        ({"via": HardwareVia.GPU_HEALTH, "cleared": True}, "clears by itself"),
        ({"via": HardwareVia.GPU_HEALTH, "code": "13"}, "XID 13 is informational"),
        ({"via": HardwareVia.GPU_HEALTH, "code": "fell off"}, "is not an XID"),
        ({"via": HardwareVia.MINDCLUSTER, "code": " , "}, "is not a fault code"),
    ],
)
def test_options_a_source_cannot_carry_are_refused_before_anything_is_sent(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    cluster = state(tmp_path)
    with ClusterClient(cluster) as client, pytest.raises(HardwareFaultError, match=message):
        hardware.inject(client, cluster.instance(None), 1, **options)  # type: ignore[arg-type]
    assert not (tmp_path / "mindcluster").exists()


def test_a_state_file_without_the_new_fields_says_to_restart(tmp_path: Path) -> None:
    cluster = state(tmp_path, agent_token=None, folder=False)
    with ClusterClient(cluster) as client:
        with pytest.raises(HardwareFaultError, match="no hardware folder"):
            hardware.inject(client, cluster.instance(None), 0, via=HardwareVia.MINDCLUSTER)
        with pytest.raises(HardwareFaultError, match="no agent token"):
            hardware.inject(client, cluster.instance(None), 0, via=HardwareVia.GPU_HEALTH)
        with pytest.raises(FaultError, match="has no rank 5"):
            hardware.inject(client, cluster.instance(None), 5)
