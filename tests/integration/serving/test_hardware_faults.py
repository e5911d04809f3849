"""The controller end to end with hardware evidence (F-3, F-12; acceptance rows A11-A14).

The real controller, two real NodeManagers and the simulator's fake engines (``controller_harness``), with
pods on Kubernetes nodes ``node-a`` (ranks 0, 1) and ``node-b`` (ranks 2, 3) whose endpoints register their
cards. Hardware faults arrive three ways: MindCluster ConfigMap files the test writes into a folder the
ResourceMonitor's directory source polls, ``POST /controller/report_hardware_fault``, and the HeteroFlow
platform server's hardware-event feed (XIDs posted by an agent's heartbeat) polled by the GPU-health source.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine

from heteroflow.core.clock import SystemClock
from heteroflow.serving.controller.config import InstanceConfig
from heteroflow.serving.controller.core.runtime import FallbackStrategy
from heteroflow.serving.controller.monitor import (
    DirectorySource,
    GpuHealthSource,
    HardwareSource,
    ResourceMonitor,
    hosting_nodes,
)
from heteroflow.storage.db import create_db_engine, upgrade_database
from tests.integration.serving.controller_harness import Plane, loop_now, run_plane
from tests.support.harness import Harness, running_server
from tests.support.polling import eventually

NODES = {"a": "node-a", "b": "node-b"}
NPU_DEVICES = {rank: [{"device_id": f"Ascend910-{rank % 2}", "index": rank % 2}] for rank in range(4)}
"""Each node numbers its cards from 0: rank 1 runs on node-a's Ascend910-1, rank 2 on node-b's Ascend910-0."""
GPU_UUIDS = {rank: f"GPU-{rank:08d}-aaaa-bbbb-cccc-{rank:012d}" for rank in range(4)}
GPU_NODES = {"a": "gpu-node-a", "b": "gpu-node-b"}
GPU_DEVICES = {rank: [{"device_id": GPU_UUIDS[rank], "index": rank % 2}] for rank in range(4)}
SHORT_WINDOW = {"hardware_ft_correlation_window_sec": 1.0}

Check = Callable[[dict[str, Any]], bool]


def scaled_down(expected: list[int]) -> Check:
    return lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["dead_committed"] == expected and s["can_serve"]


def reconfiguring(s: dict[str, Any]) -> bool:
    return bool(s["phase"] == "RECONFIGURING")


def original_fallback(plane: Plane, fallback: FallbackStrategy) -> None:
    """The deployment's original fallback for the instance (the harness configures none: reconfiguration)."""
    ctrl = plane.controller
    ctrl.config = replace(ctrl.config, instances={"inst-1": InstanceConfig(fallback=fallback)})


def events(timeline: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in timeline["events"] if e["kind"] == kind]


def hardware(plane: Plane) -> list[tuple[str, frozenset[int], str]]:
    """The controller's hardware events of the instance: (key, mapped ranks, mapping kind)."""
    inst = plane.controller.instances.get("inst-1")  # type: ignore[call-overload]
    return (
        [] if inst is None else [(e.fault.key, e.mapping.ranks, e.mapping.kind.value) for e in inst.evidence.hardware]
    )


@contextlib.asynccontextmanager
async def monitoring(plane: Plane, sources: Sequence[HardwareSource]) -> AsyncIterator[ResourceMonitor]:
    """The ResourceMonitor wired as ``heteroflow controller`` wires it."""
    ctrl = plane.controller
    monitor = ResourceMonitor(sources=sources, sink=ctrl.hardware_fault, clock=SystemClock(), restart_delay_sec=0.05)
    await monitor.start()
    try:
        yield monitor
    finally:
        await monitor.close()


def directory_source(plane: Plane, folder: Path) -> DirectorySource:
    folder.mkdir(exist_ok=True)
    topologies = lambda: [inst.topology for inst in plane.controller.instances.values()]  # noqa: E731
    return DirectorySource(folder, poll_sec=0.05, hosts_instance=hosting_nodes(topologies))


def write_configmap(folder: Path, node: str, faults: list[dict[str, Any]]) -> None:
    """A ``mindx-dl-deviceinfo-<node>`` ConfigMap as the Kubernetes API stores it (string values), written
    whole and then renamed into place, as a mirroring sidecar would."""
    device_info = {
        "DeviceInfo": {
            "DeviceList": {
                "huawei.com/Ascend910": "Ascend910-0,Ascend910-1",
                "huawei.com/Ascend910-Fault": json.dumps(faults),
                "huawei.com/Ascend910-Unhealthy": ",".join(f["npu_name"] for f in faults if f["npu_name"]),
            },
            "UpdateTime": 1744182144,
        },
        "SuperPodID": -2,
        "ServerIndex": -2,
    }
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"mindx-dl-deviceinfo-{node}", "namespace": "kube-system"},
        "data": {"DeviceInfoCfg": json.dumps(device_info)},
    }
    temporary = folder / f".{node}.tmp"
    temporary.write_text(json.dumps(doc))
    temporary.rename(folder / f"{node}.json")


def fault(card: str, level: str, code: str = "80E18402", fault_type: str = "CardUnhealthy") -> dict[str, Any]:
    return {
        "fault_type": fault_type,
        "npu_name": card,
        "fault_level": level,
        "fault_handling": level,
        "fault_code": code,
    }


async def report(plane: Plane, **body: Any) -> dict[str, Any]:
    response = await plane.http.post("/controller/report_hardware_fault", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


# == A11: hardware first, the engines confirm inside the window ==================================================
def test_a11_hardware_first_then_software_dead_scales_down_matched(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        original_fallback(plane, FallbackStrategy.ENGINE_RELAUNCH)
        folder = tmp_path / "faults"
        async with monitoring(plane, [directory_source(plane, folder)]) as monitor:
            write_configmap(folder, "node-a", [fault("Ascend910-1", "SeparateNPU", "A8028801,80E18402")])
            await eventually(lambda: bool(hardware(plane)), within=5, what="the ConfigMap fault reaches the controller")
            assert hardware(plane) == [("80E18402,A8028801|Ascend910-1|node-a", frozenset({1}), "MAPPED")]
            # the strategy center decides on its own task, after the fault was taken
            await plane.until(lambda s: s["last_decision"] == "wait:CORRELATION_WINDOW", within=5, what="the window")
            await plane.kill_and_traffic(1)
            status = await plane.until(scaled_down([1]), within=20, what="rank 1 removed on software DEAD")
            timeline = await plane.round(status["request_id"])
            (decided,) = events(timeline, "decided")
            assert decided["hardware_matched"] is True
            assert decided["fallback"] == "InstanceReconfiguration"  # a matched hardware U+D never falls back softer
            assert decided["candidates"] == [1]
            assert timeline["outcome"] == "committed"
            applies = events(timeline, "apply")
            assert all(e["body"]["params"]["removed_dp_ranks"] == [1] for e in applies)
            # the ConfigMap is rewritten with the fault still listed: read again, handed over never again
            snapshots = monitor.status().source("mindcluster-dir").snapshots
            write_configmap(folder, "node-a", [fault("Ascend910-1", "SeparateNPU", "80E18402,A8028801")])
            await eventually(
                lambda: monitor.status().source("mindcluster-dir").snapshots > snapshots, within=5, what="re-read"
            )
            assert monitor.status().reports == 1
            assert (await plane.status())["rounds"] == [status["request_id"]]

    run_plane(scenario, tmp_path, node_names=NODES, device_infos=NPU_DEVICES)


# == A12: hardware first, no confirmation ==========================================================================
def test_a12_no_confirmation_within_the_window_reconfigures(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        ops_before = len(plane.coordinator.ops)
        sent = loop_now()
        answer = await report(
            plane, node_name="node-b", card="Ascend910-0", fault_code="80E18402", level=5, source="operator"
        )
        assert answer["mappings"] == {"inst-1": "MAPPED [2]"}
        status = await plane.until(reconfiguring, within=10, what="the window expires")
        assert loop_now() - sent >= SHORT_WINDOW["hardware_ft_correlation_window_sec"]
        assert status["last_error"] == "CORRELATION_EXPIRED"
        assert status["fallback_strategy"] == "InstanceReconfiguration"
        assert status["rounds"] == []  # never a scale-down round: hardware ranks never enter removed_dp_ranks
        assert all(op[0] != "ADD" for op in plane.coordinator.ops[ops_before:])

    run_plane(scenario, tmp_path, node_names=NODES, device_infos=NPU_DEVICES, ft=SHORT_WINDOW)


# == A13: a fault on a committed rank ================================================================================
def test_a13_a_fault_on_a_committed_rank_is_handled_without_a_new_round(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.kill_and_traffic(1)
        committed = await plane.until(scaled_down([1]), within=20, what="rank 1 committed")
        folder = tmp_path / "faults"
        async with monitoring(plane, [directory_source(plane, folder)]) as monitor:
            write_configmap(folder, "node-a", [fault("Ascend910-1", "SeparateNPU")])
            inst = plane.controller.instances["inst-1"]  # type: ignore[index]
            key = "80E18402|Ascend910-1|node-a"
            await eventually(
                lambda: key in inst.evidence.hardware_seen and not inst.evidence.hardware,
                within=5,
                what="the fault is taken and marked handled",
            )
            assert monitor.status().reports == 1
            # no window opened: well past it, nothing has moved
            watch_until = loop_now() + SHORT_WINDOW["hardware_ft_correlation_window_sec"] + 0.5
            while loop_now() < watch_until:
                status = await plane.status()
                assert status["phase"] == "SCALED_DOWN_RUNNING", status
                assert status["rounds"] == committed["rounds"]
                assert status["dead_committed"] == [1]
                await asyncio.sleep(0.05)
            assert status["can_serve"]

    run_plane(scenario, tmp_path, node_names=NODES, device_infos=NPU_DEVICES, ft=SHORT_WINDOW)


# == A14: what cannot be mapped ======================================================================================
def test_a14_unknown_card_format_takes_the_original_fallback_without_a_window(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        original_fallback(plane, FallbackStrategy.ENGINE_RELAUNCH)
        sent = loop_now()
        answer = await report(plane, node_name="node-a", card="slot 4 / left", fault_code="X1", level=6)
        assert answer["mappings"]["inst-1"].startswith("UNMAPPABLE unknown card-name format")
        status = await plane.until(reconfiguring, within=10, what="the original strategy")
        assert loop_now() - sent < 5.0  # the default 5 s window was never waited for
        assert status["last_error"] == "HARDWARE_UNMAPPABLE"
        assert status["fallback_strategy"] == "EngineRelaunch"  # the deployment's own, not the hardware rule's
        assert status["rounds"] == []

    run_plane(scenario, tmp_path, node_names=NODES, device_infos=NPU_DEVICES)


def test_a14_missing_topology_is_unmappable(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:  # the default harness: pods register no node name
        answer = await report(plane, node_name="node-a", card="Ascend910-1", fault_code="X1", level=6)
        assert answer["mappings"] == {"inst-1": "UNMAPPABLE a pod of the instance registered no node name"}
        status = await plane.until(reconfiguring, within=10, what="the original strategy")
        assert status["last_error"] == "HARDWARE_UNMAPPABLE"

    run_plane(scenario, tmp_path)


def test_a14_an_empty_card_name_hits_every_rank_of_the_instance_on_that_node(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        folder = tmp_path / "faults"
        async with monitoring(plane, [directory_source(plane, folder)]):
            node_fault = fault("", "SeparateNPU", "heartbeatTimeOut", fault_type="NodeUnhealthy")
            write_configmap(folder, "node-b", [node_fault])
            await eventually(lambda: bool(hardware(plane)), within=5, what="the node fault reaches the controller")
            assert hardware(plane) == [("HEARTBEATTIMEOUT||node-b", frozenset({2, 3}), "MAPPED")]
            await plane.kill_and_traffic(2, 3)
            status = await plane.until(scaled_down([2, 3]), within=20, what="node-b's ranks removed")
            (decided,) = events(await plane.round(status["request_id"]), "decided")
            assert decided["hardware_matched"] is True
            assert decided["candidates"] == [2, 3]

    run_plane(scenario, tmp_path, node_names=NODES, device_infos=NPU_DEVICES)


# == HeteroFlow GPU health: the platform's XID feed =================================================================
def xid(index: int, code: int) -> dict[str, Any]:
    return {"index": index, "uuid": GPU_UUIDS[2 + index], "xid": code, "occurred_at": "2026-03-01T11:59:00Z"}


def test_gpu_health_xid_from_the_platform_drives_a_matched_scale_down(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'platform.db'}")
    upgrade_database(engine)
    try:
        with running_server(engine) as platform:
            agent = platform.token("agent")
            node_b = platform.register(agent, GPU_NODES["b"])
            # the node reports its cards first: an XID for a card it never reported is no evidence
            cards = [{"index": i, "uuid": GPU_UUIDS[2 + i], "ecc_uncorrected_total": 0} for i in range(2)]
            assert platform.beat(agent, node_b, cards).status_code == 200
            platform.drain()
            monitor_token = platform.token("nodes:read")

            async def scenario(plane: Plane) -> None:
                source = GpuHealthSource(
                    base_url="http://platform",
                    token=monitor_token,
                    poll_sec=0.05,
                    hold_sec=300.0,
                    clock=SystemClock(),
                    transport=httpx.ASGITransport(app=platform.client.app),
                )
                async with monitoring(plane, [source]) as monitor:
                    await eventually(
                        lambda: monitor.status().source("gpu-health").snapshots > 0, within=5, what="first poll"
                    )
                    beat = await asyncio.to_thread(
                        platform.beat, agent, node_b, [], xid_events=[xid(1, 79), xid(0, 13)]
                    )
                    assert beat.json()["xid_events"]["stored"] == 2
                    await eventually(lambda: bool(hardware(plane)), within=5, what="XID 79 reaches the controller")
                    assert hardware(plane) == [(f"XID79|{GPU_UUIDS[3]}|gpu-node-b", frozenset({3}), "MAPPED")]
                    assert monitor.status().source("gpu-health").problems == 0
                    await plane.kill_and_traffic(3)
                    status = await plane.until(scaled_down([3]), within=20, what="rank 3 removed")
                    (decided,) = events(await plane.round(status["request_id"]), "decided")
                    assert decided["hardware_matched"] is True
                    assert monitor.status().reports == 1  # XID 13 is informational

            # real time: the platform's own routes run in its framework's worker threads, which the virtual-time
            # loop does not see
            run_plane(scenario, tmp_path, node_names=GPU_NODES, device_infos=GPU_DEVICES, virtual_time=False)
    finally:
        engine.dispose()


# == the platform route the GPU-health source reads =================================================================
HEALTHY = {
    "ecc_uncorrected_total": 0,
    "ecc_corrected_total": 10,
    "retired_pages": 0,
    "remapped_rows_pending": 0,
    "remapped_rows_failure": 0,
}


def stat(index: int, uuid: str | None, **counters: Any) -> dict[str, Any]:
    return {"index": index, "uuid": uuid, "temperature_c": 40, "utilization_pct": 3, **HEALTHY, **counters}


@pytest.fixture
def platform(engine: Engine) -> Any:
    with running_server(engine, start=datetime(2026, 3, 1, 12, 0, tzinfo=UTC)) as harness:
        yield harness


def read_all(platform: Harness, token: str, cursor: str, **params: Any) -> tuple[list[dict[str, Any]], str, int]:
    """Every event from ``cursor`` on, page by page; (events, last cursor, pages read)."""
    got: list[dict[str, Any]] = []
    pages = 0
    while True:
        response = platform.get(token, "/api/v1/hardware-events", cursor=cursor, **params)
        assert response.status_code == 200, response.text
        body = response.json()
        got.extend(body["events"])
        cursor, pages = body["next_cursor"], pages + 1
        if not body["more"]:
            return got, cursor, pages


def test_hardware_events_route_scoped_paged_and_increases_only(platform: Harness) -> None:
    agent_a = platform.token("agent", tenant="team-a")
    agent_b = platform.token("agent", tenant="team-b")
    node_a = platform.register(agent_a, "gpu-a-1")
    node_b = platform.register(agent_b, "gpu-b-1")
    reader_a = platform.token("nodes:read", tenant="team-a")
    everyone = platform.token("nodes:read")

    start = platform.get(reader_a, "/api/v1/hardware-events").json()
    assert start["events"] == []
    assert start["more"] is False
    cursor_a, cursor_all = start["next_cursor"], platform.get(everyone, "/api/v1/hardware-events").json()["next_cursor"]

    platform.beat(agent_a, node_a, [stat(0, "GPU-a0"), stat(1, "GPU-a1"), stat(2, None)])
    platform.drain()
    platform.clock.advance(30)
    platform.beat(
        agent_a,
        node_a,
        [
            stat(0, "GPU-a0", ecc_uncorrected_total=2, ecc_corrected_total=11),  # +2 uncorrectable
            stat(1, "GPU-a9", ecc_uncorrected_total=7),  # another card in the slot: not an increase
            stat(2, None, remapped_rows_failure=1),  # no uuid either time: the same unnamed card
        ],
        xid_events=[{"index": 1, "uuid": "GPU-a9", "xid": 79, "occurred_at": "2026-03-01T12:00:20Z"}],
    )
    platform.beat(
        agent_b,
        node_b,
        [],
        xid_events=[{"index": 0, "uuid": "GPU-b0", "xid": 48, "occurred_at": "2026-03-01T12:00:25Z"}],
    )
    platform.drain()
    platform.clock.advance(30)
    platform.beat(agent_a, node_a, [stat(0, "GPU-a0", ecc_uncorrected_total=1, ecc_corrected_total=12)])  # a decrease
    platform.drain()

    mine, _, pages = read_all(platform, reader_a, cursor_a, limit=1)
    assert pages > 1  # one row of each kind per page: the cursor carried the rest
    assert sorted((e["node_name"], e["gpu_index"], e["uuid"], e["kind"], e["value"], e["previous"]) for e in mine) == [
        ("gpu-a-1", 0, "GPU-a0", "ecc_uncorrected", 2, 0),
        ("gpu-a-1", 1, "GPU-a9", "xid", 79, None),
        ("gpu-a-1", 2, None, "remap_failure", 1, 0),
    ]
    assert {e["node_id"] for e in mine} == {node_a}
    everything, cursor_end, _ = read_all(platform, everyone, cursor_all)
    assert sorted(e["node_name"] for e in everything) == ["gpu-a-1", "gpu-a-1", "gpu-a-1", "gpu-b-1"]
    again, _, _ = read_all(platform, everyone, cursor_end)
    assert again == []  # read once, never twice

    since = platform.get(everyone, "/api/v1/hardware-events", since="2026-03-01T12:00:00Z").json()
    assert len(since["events"]) == 4


# '²' is a digit to str.isdigit() but not to int(): it was a 500
MADE_UP_CURSORS = ["x", "1", "1.2.3", "-1.2", "1. 2", "9" * 30, "\u00b2.1", "1.\u00b2"]


def test_hardware_events_route_refuses_a_made_up_cursor(platform: Harness) -> None:
    token = platform.token("nodes:read")  # one platform for every cursor: a refused read changes nothing
    for cursor in MADE_UP_CURSORS:
        response = platform.get(token, "/api/v1/hardware-events", cursor=cursor)
        assert response.status_code in (400, 422), (cursor, response.text)


def test_hardware_events_route_needs_a_reading_token(platform: Harness) -> None:
    assert platform.client.get("/api/v1/hardware-events").status_code == 401
    assert platform.get(platform.token("agent"), "/api/v1/hardware-events").status_code == 403
    assert platform.get(platform.token("nodes:read"), "/api/v1/hardware-events", source="all").status_code == 400
