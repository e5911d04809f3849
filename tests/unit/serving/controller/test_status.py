"""What ``GET /controller/fault_tolerance/status`` answers, byte for byte: an assembled instance (with a pod
that never registered and a hardware fault taken) and a restored one still waiting for its NodeManagers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi.responses import JSONResponse

from heteroflow.contracts.serving import (
    EngineRank,
    FaultEvidence,
    HardwareFaultReport,
    HeartbeatRequest,
    RegisterRequest,
    SoftwareFaultReport,
)
from heteroflow.core.testing import FakeClock
from heteroflow.serving.controller.clients import NodeManagerClient
from heteroflow.serving.controller.config import ControllerConfig, ControllerSettings, FaultToleranceConfig
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import DpRank, InstanceId
from heteroflow.serving.controller.service import Controller
from heteroflow.serving.controller.status import instance_statuses
from heteroflow.serving.controller.store import SqliteFtRuntimeStore

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

EXPECTED = (
    b'[{"instance_id":"inst-1","phase":"NORMAL","original_dp_ranks":[0,1,2,3],"request_id":null,"dead_comm'
    b'itted":[],"pending_removed_ranks":[],"alive_dp_ranks":[0,1,2,3],"fallback_strategy":null,"gate":{"al'
    b'lowed":true,"reason_codes":[],"warnings":[]},"engine_statuses":{"1":"unhealthy"},"serving_published"'
    b':false,"last_error":null,"can_serve":false,"engine_capability":{"protocol_profile":null,"scale_down_'
    b'supported":true,"retry_supported":true,"elastic_ep_supported":false},"generation":0,"intervention_re'
    b'quired":null,"relaunch":null,"standing_hardware_faults":[],"running_strategy":null,"last_decision":n'
    b'ull,"published_endpoints":[],"hardware_faults":[{"key":"80E18402|GPU-a|k-1","level":5,"source":"t","'
    b'mapping":"UNMAPPABLE","ranks":[],"reason":"a pod of the instance registered no node name","reason_co'
    b'de":"no_node_name","reason_subject":null,"pending":true}],"rounds":[],"pods":[{"pod_id":"a","pod_ip"'
    b':"127.0.0.1","node_name":"k-1","state":"up","silent_sec":2.5,"heartbeat_complete":true,"heartbeats":'
    b'1,"ranks":[{"rank":0,"devices":[{"device_id":"GPU-a","index":2}],"engine_rank":0,"engine_dp_size":3,'
    b'"elastic_ep_resized":false,"elastic_ep_requested_dp_size":null},{"rank":1,"devices":[],"engine_rank"'
    b':1,"engine_dp_size":3,"elastic_ep_resized":true,"elastic_ep_requested_dp_size":4}]},{"pod_id":"b","p'
    b'od_ip":"127.0.0.2","node_name":"","state":"lost","silent_sec":100.0,"heartbeat_complete":false,"hear'
    b'tbeats":0,"ranks":[{"rank":2,"devices":[],"engine_rank":null,"engine_dp_size":null,"elastic_ep_resiz'
    b'ed":false,"elastic_ep_requested_dp_size":null},{"rank":3,"devices":[],"engine_rank":null,"engine_dp_'
    b'size":null,"elastic_ep_resized":false,"elastic_ep_requested_dp_size":null}]}],"persist_pending":fals'
    b'e,"store_error":null,"restore":null,"restorable":null},{"instance_id":"inst-2","phase":"SCALED_DOWN_'
    b'RUNNING","original_dp_ranks":[0,1],"request_id":null,"dead_committed":[1],"pending_removed_ranks":[]'
    b',"alive_dp_ranks":[0],"fallback_strategy":null,"gate":{"allowed":true,"reason_codes":[]},"engine_sta'
    b'tuses":{},"serving_published":false,"last_error":null,"can_serve":false,"running_strategy":null,"las'
    b't_decision":"waiting for every NodeManager to register","intervention_required":null}]'
)

EXPECTED_PODS = (
    b'[{"pod_id":"a","pod_ip":"127.0.0.1","node_name":"k-1","state":"up","silent_sec":2.5,"heartbeat_compl'
    b'ete":true,"heartbeats":1,"ranks":[{"rank":0,"devices":[{"device_id":"GPU-a","index":2}],"engine_rank'
    b'":0,"engine_dp_size":3,"elastic_ep_resized":false,"elastic_ep_requested_dp_size":null},{"rank":1,"de'
    b'vices":[],"engine_rank":1,"engine_dp_size":3,"elastic_ep_resized":true,"elastic_ep_requested_dp_size'
    b'":4}]},{"pod_id":"b","state":"unknown","ranks":[{"rank":2,"devices":[],"engine_rank":null,"engine_dp'
    b'_size":null,"elastic_ep_resized":false,"elastic_ep_requested_dp_size":null},{"rank":3,"devices":[],"'
    b'engine_rank":null,"engine_dp_size":null,"elastic_ep_resized":false,"elastic_ep_requested_dp_size":nu'
    b"ll}]}]"
)


def registration(pod: str, ip: str, ids: list[int], **changes: object) -> RegisterRequest:
    endpoints = [{"id": i, "ip": ip, "port": 8100 + i} for i in ids]
    return RegisterRequest.model_validate(
        {
            "pod_id": pod,
            "pod_ip": ip,
            "node_manager_url": f"http://nm-{pod}",
            "instance_id": "inst-1",
            "dp_size": 4,
            "endpoints": endpoints,
            "ft_capability": CAPABILITY,
            **changes,
        }
    )


def test_the_status_answer_is_byte_for_byte_the_same(tmp_path: Path) -> None:
    async def main() -> tuple[bytes, bytes]:
        clock = FakeClock()
        store = SqliteFtRuntimeStore(tmp_path / "ft.db")
        scaled = rt.new_runtime(InstanceId("inst-2"), [0, 1], enabled=True)
        scaled = rt.FtRuntime(
            instance_id=scaled.instance_id,
            original_dp_ranks=scaled.original_dp_ranks,
            phase=FtPhase.SCALED_DOWN_RUNNING,
            dead_committed=frozenset({DpRank(1)}),
        )
        await store.put(rt.persisted(scaled), expected_revision=None)
        controller = Controller(
            config=ControllerConfig(
                settings=ControllerSettings.load(cluster_token="t", pod_lost_after_sec=30.0),
                ft=FaultToleranceConfig.load(enable_dp_scale_down=True),
            ),
            store=store,
            node_managers=NodeManagerClient(cluster_token="t"),
            coordinator=None,
            clock=clock,
        )
        await controller.start(loops=False)
        await controller.register(registration("b", "127.0.0.2", [2, 3]))
        clock.advance(97.5)
        devices = {"device_infos": [{"device_id": "GPU-a", "index": 2}]}
        endpoints = [{"id": 0, "ip": "127.0.0.1", "port": 8100, **devices}, {"id": 1, "ip": "127.0.0.1", "port": 8101}]
        await controller.register(registration("a", "127.0.0.1", [0, 1], endpoints=endpoints, node_name="k-1"))
        controller.hardware_fault(
            HardwareFaultReport(node_name="k-1", card="GPU-a", fault_code="80E18402", level=5, source="t")
        )
        # pod a's engines run renumbered (a relaunch without rank 2 would start 0, 1, 3 as 0, 1, 2 of 3), and an
        # operator's elastic EP resize asked that world for 4 ranks again (rank 1's engine said so)
        controller.heartbeat(
            HeartbeatRequest(
                pod_id="a",
                instance_id="inst-1",
                endpoint_ids=[0, 1],
                expected_endpoint_ids=[0, 1],
                sent_at=clock.now(),
                engine_ranks=[
                    EngineRank(endpoint_id=0, engine_rank=0, dp_size=3),
                    EngineRank(
                        endpoint_id=1, engine_rank=1, dp_size=3, elastic_ep_resized=True, elastic_ep_requested_dp_size=4
                    ),
                ],
            )
        )
        clock.advance(2.5)
        controller.report(
            SoftwareFaultReport(
                instance_id="inst-1",
                pod_id="a",
                endpoint_id=1,
                status="unhealthy",
                evidence=FaultEvidence.FT_STATUS,
                observed_at=clock.now(),
            )
        )
        body = JSONResponse(instance_statuses(controller)).body
        del controller.pods["b"]  # a pod of the topology the controller no longer knows
        unknown = JSONResponse(instance_statuses(controller)[0]["pods"]).body
        await controller.close()
        return bytes(body), bytes(unknown)

    body, pods = asyncio.run(main())
    assert body == EXPECTED
    assert pods == EXPECTED_PODS
