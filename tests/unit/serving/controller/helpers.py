"""Builders shared by the controller-core tests: a 2-pod x 2-rank instance and its evidence."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from heteroflow.contracts.engine_protocol import EngineStatusEntry
from heteroflow.contracts.serving import (
    DeviceInfo,
    EndpointFtStatus,
    EndpointInfo,
    FaultEvidence,
    FtCapability,
    RegisterRequest,
    SoftwareFaultReport,
)
from heteroflow.serving.controller.core.normalizer import FtSnapshot, observe
from heteroflow.serving.controller.core.ranks import DpRank, InstanceId, RequestId, ranks
from heteroflow.serving.controller.core.runtime import FallbackStrategy, FtRuntime, ScaleDownContext, new_runtime
from heteroflow.serving.controller.core.topology import InstanceTopology, resolve_instance

INSTANCE = InstanceId("decode-0")
AT = datetime(2026, 1, 1, tzinfo=UTC)


def capability(**changes: Any) -> FtCapability:
    values: dict[str, Any] = {
        "engine_ft_enabled": True,
        "scale_down_supported": True,
        "external_lb": True,
        "auto_recovery_enabled": False,
        "eplb_enabled": True,
        "num_redundant_experts": 32,
        "num_logical_experts": 256,
        "slots_per_rank": 96,
        "tp_size": 1,
    }
    values.update(changes)
    return FtCapability(**values)


def registration(
    pod: str, ids: tuple[int, ...], *, node: str = "n1", ip: str = "", cap: FtCapability | None = None, dp_size: int = 4
) -> RegisterRequest:
    pod_ip = ip or f"10.0.0.{ids[0] + 1}"
    return RegisterRequest(
        pod_id=pod,
        pod_ip=pod_ip,
        node_name=node,
        node_manager_url=f"http://{pod}:8300",
        instance_id=INSTANCE,
        dp_size=dp_size,
        endpoints=[
            EndpointInfo(
                id=i,
                ip=pod_ip,
                port=8000 + i,
                device_infos=[DeviceInfo(device_id=f"Ascend910-{i % 2}", index=i % 2)],
            )
            for i in ids
        ],
        ft_capability=cap or capability(),
    )


def topology() -> InstanceTopology:
    """Pod a on node n1 holds ranks 0, 1; pod b on node n2 holds ranks 2, 3."""
    return resolve_instance([registration("pod-a", (0, 1), node="n1"), registration("pod-b", (2, 3), node="n2")])


def runtime(original: tuple[int, ...] = (0, 1, 2, 3)) -> FtRuntime:
    return new_runtime(INSTANCE, original, enabled=True, serving_published=True)


def report(rank: int, status: str, evidence: FaultEvidence = FaultEvidence.FT_STATUS) -> SoftwareFaultReport:
    return SoftwareFaultReport(
        instance_id=INSTANCE, pod_id="pod-a", endpoint_id=rank, status=status, evidence=evidence, observed_at=AT
    )


def snapshot(
    statuses: dict[int, str], *, at: float = 0.0, dead_committed: frozenset[DpRank] = frozenset()
) -> FtSnapshot:
    snap = FtSnapshot()
    for rank, status in statuses.items():
        snap = observe(snap, report(rank, status), now=at, dead_committed=dead_committed)
    return snap


def context(
    rt: FtRuntime,
    *,
    dead: tuple[int, ...],
    request_id: str = "r1",
    fallback: FallbackStrategy = FallbackStrategy.INSTANCE_RECONFIGURATION,
    hardware_matched: bool = False,
) -> ScaleDownContext:
    candidates = ranks(dead)
    return ScaleDownContext(
        request_id=RequestId(request_id),
        instance_id=rt.instance_id,
        generation=rt.generation,
        candidates=candidates,
        survivors=rt.active_dp_ranks - candidates,
        dead_committed_at_start=rt.dead_committed,
        fallback=fallback,
        decided_at=0.0,
        hardware_matched=hardware_matched,
    )


def entry(rank: int, status: str | None, *, ft_state: str | None = None, **extra: Any) -> EndpointFtStatus:
    if status is None:
        return EndpointFtStatus(endpoint_id=rank, error=extra.pop("error", "unreachable"), **extra)
    engine: dict[str, Any] = {"id": extra.pop("engine_id", rank), "status": status, "ft_state": ft_state, **extra}
    return EndpointFtStatus(endpoint_id=rank, status=EngineStatusEntry(**engine))
