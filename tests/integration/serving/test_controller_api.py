"""The controller's HTTP API on its own: authentication, input validation, registration and the status shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.contracts.serving import MAX_DP_SIZE
from heteroflow.core.clock import SystemClock
from heteroflow.serving.controller.assembly import create_app
from heteroflow.serving.controller.clients import NodeManagerClient
from heteroflow.serving.controller.config import ControllerConfig, ControllerSettings, FaultToleranceConfig
from heteroflow.serving.controller.monitor import DirectorySource, ResourceMonitor
from heteroflow.serving.controller.service import Controller
from heteroflow.serving.controller.store import SqliteFtRuntimeStore

TOKEN = "controller-api-test-token"
RFC_KEYS = {
    "instance_id",
    "phase",
    "original_dp_ranks",
    "request_id",
    "dead_committed",
    "pending_removed_ranks",
    "alive_dp_ranks",
    "fallback_strategy",
    "gate",
    "engine_statuses",
    "serving_published",
    "last_error",
    "can_serve",
}
CAPABILITY = {
    "engine_ft_enabled": True,
    "scale_down_supported": True,
    "external_lb": True,
    "auto_recovery_enabled": False,
    "eplb_enabled": True,
    "num_redundant_experts": 4,
    "num_logical_experts": 4,
    "slots_per_rank": 2,
    "tp_size": 1,
}


def registration(pod: str, ids: list[int], **changes: Any) -> dict[str, Any]:
    body = {
        "pod_id": pod,
        "pod_ip": "127.0.0.1",
        "node_manager_url": f"http://nm-{pod}",
        "instance_id": "inst-1",
        "dp_size": 4,
        "endpoints": [{"id": i, "ip": "127.0.0.1", "port": 8100 + i} for i in ids],
        "ft_capability": CAPABILITY,
    }
    body.update(changes)
    return body


def with_api(
    tmp_path: Path,
    scenario: Callable[[httpx.AsyncClient, Controller], Awaitable[None]],
    *,
    hardware_folder: Path | None = None,
    **ft: Any,
) -> None:
    async def main() -> None:
        config = ControllerConfig(
            settings=ControllerSettings.load(cluster_token=TOKEN),
            ft=FaultToleranceConfig.load(enable_dp_scale_down=True, **ft),
        )
        controller = Controller(
            config=config,
            store=SqliteFtRuntimeStore(tmp_path / "ft.db"),
            node_managers=NodeManagerClient(cluster_token=TOKEN),
            coordinator=None,
            clock=SystemClock(),
        )
        await controller.start(loops=False)
        monitor = None
        if hardware_folder is not None:
            source = DirectorySource(hardware_folder, poll_sec=0.05, hosts_instance=lambda _: False)
            monitor = ResourceMonitor(sources=[source], sink=controller.hardware_fault, clock=controller.clock)
            await monitor.start()
        transport = httpx.ASGITransport(app=create_app(controller, cluster_token=TOKEN, monitor=monitor))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://controller", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as client:
            try:
                await scenario(client, controller)
            finally:
                if monitor is not None:
                    await monitor.close()
                await controller.close()

    asyncio.run(main())


ROUTES = [
    ("GET", "/controller/fault_tolerance/status"),
    ("GET", "/controller/fault_tolerance/rounds"),
    ("GET", "/controller/fault_tolerance/rounds/x"),
    ("GET", "/controller/config"),
    ("GET", "/controller/resource_monitor"),
    ("GET", "/metrics"),
    ("GET", "/controller/leadership"),
    ("POST", "/controller/node_manager/register"),
    ("POST", "/controller/node_manager/heartbeat"),
    ("POST", "/controller/report_software_fault"),
]


def test_every_route_but_health_needs_the_cluster_token(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, _: Controller) -> None:
        for method, path in ROUTES:
            for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
                response = await client.request(method, path, headers=headers, json={})
                assert response.status_code == 401, (method, path, headers)
                assert response.json()["error"] == "unauthorized"
        assert (await client.get("/health", headers={"Authorization": ""})).status_code == 200
        assert (await client.get("/ready", headers={"Authorization": ""})).status_code == 200

    with_api(tmp_path, scenario)


def test_until_it_acts_the_controller_answers_not_leader_and_is_not_ready(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, controller: Controller) -> None:
        await controller.stop()  # as before start, or a standby: nothing loaded, nothing may act
        ready = await client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["ready"] is False
        for method, path in ROUTES:
            response = await client.request(method, path, json={})
            if path in ("/metrics", "/controller/config", "/controller/leadership"):
                assert response.status_code == 200, path
            else:
                assert response.status_code == 503, path
                assert response.json()["error"] == "not_leader"
        assert (await client.get("/controller/leadership")).json()["role"] == "single"
        assert "heteroflow_controller_acting 0.0" in (await client.get("/metrics")).text
        await controller.start(loops=False)
        assert (await client.get("/ready")).json() == {
            "ready": True,
            "role": "single",
            "leader_id": None,
            "leader_url": None,
        }
        assert (await client.get("/controller/fault_tolerance/status")).status_code == 200
        assert "heteroflow_controller_acting 1.0" in (await client.get("/metrics")).text

    with_api(tmp_path, scenario)


@pytest.mark.parametrize(
    ("path", "content", "fragment"),
    [
        ("/controller/node_manager/register", b"{not json", "not JSON"),
        ("/controller/node_manager/register", b"[1, 2]", "JSON object"),
        ("/controller/node_manager/register", b"\xff\xfe", "not JSON"),
        ("/controller/node_manager/register", b'{"pod_id": "a"}', "pod_ip"),
        ("/controller/node_manager/heartbeat", b'{"pod_id": "a", "instance_id": "i", "endpoint_ids": [1, 1]}', ""),
        ("/controller/report_software_fault", b'{"instance_id": "i"}', "pod_id"),
        ("/controller/report_software_fault", b"[" * 5000 + b"]" * 5000, ""),
        ("/controller/node_manager/register", b'{"a":' * 40 + b"1" + b"}" * 40, "nested deeper"),
        ("/controller/node_manager/register", b" " * (1 << 20) + b"{}", "larger than"),
    ],
)
def test_malformed_bodies_are_400_with_a_message(tmp_path: Path, path: str, content: bytes, fragment: str) -> None:
    async def scenario(client: httpx.AsyncClient, _: Controller) -> None:
        response = await client.post(path, content=content, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert fragment in response.json()["detail"]

    with_api(tmp_path, scenario)


def test_a_registration_declaring_absurd_ranks_is_400_and_the_instance_still_assembles(tmp_path: Path) -> None:
    """One pod's dp_size or rank out of bounds is refused at the door; it never reaches the topology, which would
    otherwise hold a set of every declared rank (2**40 of them exhausted the controller's memory)."""

    async def scenario(client: httpx.AsyncClient, _: Controller) -> None:
        for body, fragment in (
            (registration("a", [0, 1], dp_size=2**40), f"dp_size: Input should be less than or equal to {MAX_DP_SIZE}"),
            (registration("a", [0, MAX_DP_SIZE]), f"endpoints.1.id: Input should be less than {MAX_DP_SIZE}"),
            (registration("a", [0, -1]), "endpoints.1.id: Input should be greater than or equal to 0"),
        ):
            refused = await client.post("/controller/node_manager/register", json=body)
            assert refused.status_code == 400, refused.text
            assert fragment in refused.json()["detail"]
        for pod, ids in (("a", [0, 1]), ("b", [2, 3])):
            assert (await client.post("/controller/node_manager/register", json=registration(pod, ids))).is_success
        [entry] = (await client.get("/controller/fault_tolerance/status")).json()
        assert entry["original_dp_ranks"] == [0, 1, 2, 3]

    with_api(tmp_path, scenario)


def test_registration_assembles_the_instance_and_the_status_has_the_rfc_keys(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, controller: Controller) -> None:
        first = await client.post("/controller/node_manager/register", json=registration("a", [0, 1]))
        assert first.status_code == 200
        assert first.json()["flags"]["enable_dp_scale_down_proxy"] is True
        assert first.json()["retired_endpoint_ids"] is None  # the instance is not assembled yet
        assert (await client.get("/controller/fault_tolerance/status")).json() == []
        second = await client.post("/controller/node_manager/register", json=registration("b", [2, 3]))
        assert second.json()["retired_endpoint_ids"] == []
        [entry] = (await client.get("/controller/fault_tolerance/status")).json()
        assert set(entry) >= RFC_KEYS
        assert entry["phase"] == "NORMAL"
        assert entry["original_dp_ranks"] == [0, 1, 2, 3]
        assert entry["can_serve"] is False  # nothing published before the pods' engines are ready
        beat = await client.post(
            "/controller/node_manager/heartbeat",
            json={
                "pod_id": "ghost",
                "instance_id": "inst-1",
                "endpoint_ids": [],
                "expected_endpoint_ids": [],
                "sent_at": datetime.now(UTC).isoformat(),
            },
        )
        assert beat.json()["register_again"] is True
        report = {
            "instance_id": "nope",
            "pod_id": "a",
            "endpoint_id": 0,
            "status": "dead",
            "evidence": "ENGINE_DEAD",
            "observed_at": datetime.now(UTC).isoformat(),
        }
        assert (await client.post("/controller/report_software_fault", json=report)).status_code == 404
        assert (await client.get("/controller/fault_tolerance/rounds/none")).status_code == 404
        metrics = (await client.get("/metrics")).text
        assert 'heteroflow_controller_ft_phase{instance_id="inst-1",phase="NORMAL"} 1.0' in metrics

    with_api(tmp_path, scenario)


def test_each_pod_in_the_status_names_its_ranks_and_their_cards(tmp_path: Path) -> None:
    """Where the dashboard links a rank to: its pod's node, and the card behind it when the pod registered one."""

    async def scenario(client: httpx.AsyncClient, _: Controller) -> None:
        endpoints = [
            {"id": 1, "ip": "127.0.0.1", "port": 8101, "device_infos": [{"device_id": "GPU-b", "index": 3}]},
            {"id": 0, "ip": "127.0.0.1", "port": 8100, "device_infos": [{"device_id": "GPU-a", "index": 2}]},
        ]
        await client.post(
            "/controller/node_manager/register", json=registration("a", [0, 1], endpoints=endpoints, node_name="k-1")
        )
        await client.post("/controller/node_manager/register", json=registration("b", [2, 3]))
        [entry] = (await client.get("/controller/fault_tolerance/status")).json()
        pods = {pod["pod_id"]: pod for pod in entry["pods"]}
        assert pods["a"]["node_name"] == "k-1"
        unknown = {  # no heartbeat has said how the engines run
            "engine_rank": None,
            "engine_dp_size": None,
            "elastic_ep_resized": False,
            "elastic_ep_requested_dp_size": None,
        }
        assert pods["a"]["ranks"] == [
            {"rank": 0, "devices": [{"device_id": "GPU-a", "index": 2}], **unknown},
            {"rank": 1, "devices": [{"device_id": "GPU-b", "index": 3}], **unknown},
        ]
        assert pods["b"]["ranks"] == [{"rank": 2, "devices": [], **unknown}, {"rank": 3, "devices": [], **unknown}]
        # pod b's engines run renumbered, as a relaunch without rank 0 or 1 starts them: its heartbeat says so
        beat = {
            "pod_id": "b",
            "instance_id": "inst-1",
            "endpoint_ids": [2, 3],
            "expected_endpoint_ids": [2, 3],
            "sent_at": "2026-01-01T00:00:00Z",
            "engine_ranks": [
                {"endpoint_id": 2, "engine_rank": 1, "dp_size": 3},
                {"endpoint_id": 3, "engine_rank": 2, "dp_size": 3},
            ],
        }
        answer = await client.post("/controller/node_manager/heartbeat", json=beat)
        assert answer.status_code == 200, answer.text
        [entry] = (await client.get("/controller/fault_tolerance/status")).json()
        pods = {pod["pod_id"]: pod for pod in entry["pods"]}
        assert [(r["rank"], r["engine_rank"], r["engine_dp_size"]) for r in pods["b"]["ranks"]] == [
            (2, 1, 3),
            (3, 2, 3),
        ]
        # then an operator's elastic EP resize asked that world for 4 ranks: the next heartbeat marks both ranks
        resized = {"elastic_ep_resized": True, "elastic_ep_requested_dp_size": 4}
        beat = {**beat, "engine_ranks": [{**r, **resized} for r in beat["engine_ranks"]]}  # type: ignore[dict-item]
        answer = await client.post("/controller/node_manager/heartbeat", json=beat)
        assert answer.status_code == 200, answer.text
        [entry] = (await client.get("/controller/fault_tolerance/status")).json()
        ranks = {pod["pod_id"]: pod["ranks"] for pod in entry["pods"]}["b"]
        assert [(r["rank"], r["elastic_ep_resized"], r["elastic_ep_requested_dp_size"]) for r in ranks] == [
            (2, True, 4),
            (3, True, 4),
        ]
        bad = await client.post(
            "/controller/node_manager/heartbeat",
            json={**beat, "engine_ranks": [{"endpoint_id": 2, "engine_rank": -1, "dp_size": 0}]},
        )
        assert bad.status_code == 400, bad.text  # a malformed rank is refused, never stored

    with_api(tmp_path, scenario)


def test_disagreeing_capabilities_fail_closed(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, _: Controller) -> None:
        await client.post("/controller/node_manager/register", json=registration("a", [0, 1]))
        other = {**CAPABILITY, "num_redundant_experts": 0}
        await client.post("/controller/node_manager/register", json=registration("b", [2, 3], ft_capability=other))
        assert (await client.get("/controller/fault_tolerance/status")).json() == []  # never assembled

    with_api(tmp_path, scenario)


def test_a_pod_registering_again_moves_its_address_but_never_its_ranks(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, controller: Controller) -> None:
        await client.post("/controller/node_manager/register", json=registration("a", [0, 1]))
        await client.post("/controller/node_manager/register", json=registration("b", [2, 3]))
        moved = registration("a", [0, 1], node_manager_url="http://nm-a-restarted:9000")
        assert (await client.post("/controller/node_manager/register", json=moved)).status_code == 200
        [inst] = controller.instances.values()
        urls = {pod.pod_id: pod.node_manager_url for pod in inst.topology.pods}
        assert urls == {"a": "http://nm-a-restarted:9000", "b": "http://nm-b"}
        grabbed = registration("a", [0, 1, 2])  # other ranks: refused, the topology stays
        refused = await client.post("/controller/node_manager/register", json=grabbed)
        assert refused.status_code == 409
        assert "never change" in refused.json()["detail"]
        stranger = await client.post("/controller/node_manager/register", json=registration("c", [3]))
        assert stranger.status_code == 409
        assert sorted(inst.topology.original_dp_ranks) == [0, 1, 2, 3]
        ranks: dict[str, frozenset[int]] = {pod.pod_id: pod.dp_ranks for pod in inst.topology.pods}
        assert ranks["a"] == {0, 1}

    with_api(tmp_path, scenario)


def test_the_status_lists_each_hardware_fault_taken_and_a_monitor_less_controller_says_so(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, _: Controller) -> None:
        for pod, ranks in (("a", [0, 1]), ("b", [2, 3])):
            assert (await client.post("/controller/node_manager/register", json=registration(pod, ranks))).is_success
        fault = {"node_name": "node-x", "card": "Ascend910-1", "fault_code": "80E18402", "level": 5, "source": "t"}
        answer = (await client.post("/controller/report_hardware_fault", json=fault)).json()
        assert answer["key"] == "80E18402|Ascend910-1|node-x"
        [entry] = (await client.get("/controller/fault_tolerance/status")).json()
        [taken] = entry["hardware_faults"]
        assert taken["key"] == answer["key"]
        assert (taken["source"], taken["level"], taken["mapping"], taken["pending"]) == ("t", 5, "UNMAPPABLE", True)
        assert "node name" in taken["reason"]  # these pods registered none: no guess (A14)
        await client.post("/controller/report_hardware_fault", json={**fault, "cleared": True})
        [entry] = (await client.get("/controller/fault_tolerance/status")).json()
        assert entry["hardware_faults"] == []
        monitor = (await client.get("/controller/resource_monitor")).json()
        assert monitor == {"sources": [], "standing": [], "reports": 0, "sink_errors": 0}

    with_api(tmp_path, scenario)


def test_the_resource_monitor_route_shows_each_source_and_the_standing_faults(tmp_path: Path) -> None:
    folder = tmp_path / "mindcluster"
    folder.mkdir()

    async def scenario(client: httpx.AsyncClient, _: Controller) -> None:
        (folder / "broken.json").write_bytes(b"{not json")
        node = {
            "kind": "Node",
            "metadata": {"name": "node-x"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        }
        (folder / "node-x.json").write_text(json.dumps(node))

        async def both_read() -> dict[str, Any]:
            while True:
                found: dict[str, Any] = (await client.get("/controller/resource_monitor")).json()
                if found["standing"] and found["sources"][0]["problems"]:
                    return found
                await asyncio.sleep(0.05)  # the source polls every 50 ms; the wait_for below bounds this

        found = await asyncio.wait_for(both_read(), timeout=10)
        [source] = found["sources"]
        assert (source["name"], source["state"]) == ("mindcluster-dir", "running")
        assert "not JSON" in source["last_problem"]
        assert found["standing"] == ["NodeNotReady||node-x"]

    with_api(tmp_path, scenario, hardware_folder=folder)


def test_two_controllers_in_one_process_each_answer_through_their_own_app(tmp_path: Path) -> None:
    """The routers are built once per process: each app must still reach the controller it was made for."""

    async def main() -> None:
        controllers, clients = [], []
        for name, interval in (("one", 0.5), ("two", 0.25)):
            config = ControllerConfig(
                settings=ControllerSettings.load(cluster_token=TOKEN),
                ft=FaultToleranceConfig.load(enable_dp_scale_down=True, poll_interval_sec=interval),
            )
            controller = Controller(
                config=config,
                store=SqliteFtRuntimeStore(tmp_path / f"{name}.db"),
                node_managers=NodeManagerClient(cluster_token=TOKEN),
                coordinator=None,
                clock=SystemClock(),
            )
            await controller.start(loops=False)
            controllers.append(controller)
            transport = httpx.ASGITransport(app=create_app(controller, cluster_token=TOKEN))
            clients.append(
                httpx.AsyncClient(
                    transport=transport, base_url="http://controller", headers={"Authorization": f"Bearer {TOKEN}"}
                )
            )
        try:
            first, second = clients
            assert (await first.post("/controller/node_manager/register", json=registration("a", [0, 1]))).is_success
            assert set(controllers[0].pods) == {"a"}
            assert controllers[1].pods == {}
            intervals = [(await c.get("/controller/config")).json()["fault_tolerance_config"] for c in clients]
            assert [found["poll_interval_sec"] for found in intervals] == [0.5, 0.25]
            assert (await second.get("/controller/fault_tolerance/status")).json() == []
        finally:
            for client in clients:
                await client.aclose()
            for controller in controllers:
                await controller.close()

    asyncio.run(main())
