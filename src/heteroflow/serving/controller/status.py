"""What ``GET /controller/fault_tolerance/status`` answers: one frozen entry per instance, RFC §7's keys (the
core's :func:`~heteroflow.serving.controller.core.runtime.status_entry`) plus what an operator needs beside them.

:class:`InstanceStatus` is an assembled instance's entry, :class:`WaitingInstanceStatus` a restored one's that
waits for its NodeManagers to register again. The field order is the order of the JSON keys on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from heteroflow.contracts.serving import EndpointInfo, EngineRank
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.decision import RunningStrategy
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import StatusPorts
from heteroflow.serving.controller.restore import refusal

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class GateStatus(BaseModel):
    model_config = _FROZEN

    allowed: bool
    reason_codes: list[str]


class GateStatusWithWarnings(GateStatus):
    warnings: list[str]


class RuntimeStatus(BaseModel):
    """RFC §7's keys, as :func:`~heteroflow.serving.controller.core.runtime.status_entry` computes them."""

    model_config = _FROZEN

    instance_id: str
    phase: str
    original_dp_ranks: list[int]
    request_id: str | None
    dead_committed: list[int]
    pending_removed_ranks: list[int]
    alive_dp_ranks: list[int]
    fallback_strategy: str | None
    gate: GateStatus
    engine_statuses: dict[int, str]
    serving_published: bool
    last_error: str | None
    can_serve: bool


class WaitingInstanceStatus(RuntimeStatus):
    """A runtime restored from the store whose NodeManagers have not all registered again."""

    running_strategy: RunningStrategy | None = None
    last_decision: str = "waiting for every NodeManager to register"
    intervention_required: str | None = None


class EngineCapabilityStatus(BaseModel):
    """What the engines can do: why the gate may refuse a scale-down."""

    model_config = _FROZEN

    protocol_profile: str | None
    scale_down_supported: bool
    retry_supported: bool
    elastic_ep_supported: bool = False
    """The engines serve vLLM 0.34's elastic EP routes (registered by discovery)."""


class DeviceStatus(BaseModel):
    model_config = _FROZEN

    device_id: str
    index: int | None


class RankStatus(BaseModel):
    """One DP rank of a pod and the cards behind it (as registered): where the dashboard links a rank to."""

    model_config = _FROZEN

    rank: int
    devices: list[DeviceStatus]
    engine_rank: int | None = None
    """The FT id its engine was launched with (``--data-parallel-rank``): the rank itself unless a relaunch without
    some ranks renumbered the survivors into a smaller world; ``None`` until its NodeManager says."""
    engine_dp_size: int | None = None
    """That launch's ``--data-parallel-size``."""
    elastic_ep_resized: bool = False
    """vLLM's elastic EP resized that world since the launch, outside HeteroFlow: the instance is not scaled down
    (gate ``ELASTIC_EP_RESIZED``) until its engines are relaunched."""
    elastic_ep_requested_dp_size: int | None = None
    """The DP size that resize asked for, when the engine said."""


class UnknownPodStatus(BaseModel):
    """A pod of the topology the controller holds no registration of."""

    model_config = _FROZEN

    pod_id: str
    state: str = "unknown"
    ranks: list[RankStatus]


class PodStatus(BaseModel):
    model_config = _FROZEN

    pod_id: str
    pod_ip: str
    node_name: str
    state: str
    """``up``, or ``lost`` when silent longer than ``pod_lost_after_sec``."""
    silent_sec: float
    heartbeat_complete: bool
    heartbeats: int
    ranks: list[RankStatus]


class HardwareFaultStatus(BaseModel):
    """One hardware fault taken for the instance (``hardware_faults.py``); ``pending``: not handled yet."""

    model_config = _FROZEN

    key: str
    level: int
    source: str
    mapping: str
    ranks: list[int]
    reason: str
    reason_code: str | None
    reason_subject: str | None
    pending: bool


class RelaunchStatus(BaseModel):
    """Why the last fallback did not relaunch every rank where it ran (``core/relaunch.py``): ``kind``
    ``REPLACE_PODS``, ``WITHOUT_RANKS`` or ``REFUSED``; ``reason`` is an English sentence, ``reason_code`` the
    key the dashboard words it by."""

    model_config = _FROZEN

    kind: str
    reason_code: str | None
    reason: str
    ranks: list[int]
    faults: list[str]
    pods: list[str]
    gate_reasons: list[str]


class RestoreStatus(BaseModel):
    """The instance's last restore to its configured size (``restore.py``)."""

    model_config = _FROZEN

    state: str
    """``running``, ``succeeded`` or ``failed`` (the degraded instance relaunched as it ran)."""
    request_id: str
    requested_by: str
    ranks: list[int]
    started_at: str
    finished_at: str | None
    seconds: float | None
    error: str | None
    degraded_phase: str | None


class InstanceStatus(RuntimeStatus):
    """An assembled instance."""

    gate: GateStatusWithWarnings
    engine_capability: EngineCapabilityStatus
    generation: int
    intervention_required: str | None
    relaunch: RelaunchStatus | None
    standing_hardware_faults: list[str]
    """Keys of the L5-L6 hardware faults on the instance's cards not cleared since: no rank is relaunched there."""
    running_strategy: RunningStrategy | None
    last_decision: str | None
    published_endpoints: list[int]
    hardware_faults: list[HardwareFaultStatus]
    rounds: list[str]
    pods: list[PodStatus | UnknownPodStatus]
    persist_pending: bool
    store_error: str | None
    restore: RestoreStatus | None = None
    restorable: str | None = None
    """``ready`` when a restore may start now, else why not (``None``: the instance is not scaled down)."""


ControllerInstanceStatus = InstanceStatus | WaitingInstanceStatus


def statuses(ctrl: StatusPorts) -> list[ControllerInstanceStatus]:
    """Every assembled instance, then every restored one still waiting for its NodeManagers."""
    entries: list[ControllerInstanceStatus] = [_assembled(ctrl, inst) for inst in ctrl.instances.values()]
    entries += [WaitingInstanceStatus.model_validate(rt.status_entry(r.runtime)) for r in ctrl.restored.values()]
    return entries


def instance_statuses(ctrl: StatusPorts) -> list[dict[str, object]]:
    """The route's JSON body: :func:`statuses` dumped in their field order."""
    return [entry.model_dump(mode="json") for entry in statuses(ctrl)]


def _assembled(ctrl: StatusPorts, inst: Instance) -> InstanceStatus:
    entry = rt.status_entry(inst.runtime, engine_statuses=dict(inst.evidence.engine_statuses))
    gate = inst.runtime.gate
    capability = inst.topology.capability
    pending = {e.fault.key for e in inst.evidence.hardware}
    return InstanceStatus.model_validate(
        {
            **entry,
            "gate": {**entry["gate"], "warnings": list(gate.warnings) if gate else []},  # type: ignore[dict-item]
            "engine_capability": EngineCapabilityStatus(
                protocol_profile=capability.protocol_profile,
                scale_down_supported=capability.scale_down_supported,
                retry_supported=capability.retry_supported,
                elastic_ep_supported=capability.elastic_ep_supported,
            ),
            "generation": inst.runtime.generation,
            "intervention_required": inst.relaunches.intervention_required,
            "relaunch": _relaunch(inst),
            "standing_hardware_faults": sorted(inst.standing.faults),
            "running_strategy": inst.strategy.running,
            "last_decision": inst.strategy.last_decision,
            "published_endpoints": sorted(inst.publication.published),
            "hardware_faults": [
                {**seen, "pending": key in pending} for key, seen in inst.evidence.hardware_seen.items()
            ],
            "rounds": list(inst.runtime.history),
            "pods": [_pod(ctrl, pod.pod_id, pod.endpoints) for pod in inst.topology.pods],
            "persist_pending": inst.persistence.pending,
            "store_error": ctrl.store_error,
            "restore": _restore(inst),
            "restorable": _restorable(ctrl, inst),
        }
    )


def _restore(inst: Instance) -> RestoreStatus | None:
    last = inst.restores.last
    if last is None:
        return None
    return RestoreStatus(
        state=last.state,
        request_id=last.request_id,
        requested_by=last.requested_by,
        ranks=list(last.ranks),
        started_at=last.started_at.isoformat(),
        finished_at=last.finished_at.isoformat() if last.finished_at else None,
        seconds=last.seconds,
        error=last.error,
        degraded_phase=last.degraded_phase,
    )


def _restorable(ctrl: StatusPorts, inst: Instance) -> str | None:
    if inst.runtime.phase != FtPhase.SCALED_DOWN_RUNNING:
        return None
    why = refusal(ctrl, inst, pod_lost_after_sec=ctrl.config.settings.pod_lost_after_sec)
    return "ready" if why is None else why


def _relaunch(inst: Instance) -> RelaunchStatus | None:
    plan = inst.relaunches.plan
    if plan is None:
        return None
    return RelaunchStatus(
        kind=plan.kind.value,
        reason_code=plan.reason_code.value if plan.reason_code else None,
        reason=plan.reason,
        ranks=sorted(plan.faulty),
        faults=list(plan.faults),
        pods=list(plan.pods),
        gate_reasons=list(plan.gate_reasons),
    )


def _ranks(endpoints: Sequence[EndpointInfo], engine_ranks: Mapping[int, EngineRank]) -> list[RankStatus]:
    return [_rank(e, engine_ranks.get(e.id)) for e in sorted(endpoints, key=lambda e: e.id)]


def _rank(endpoint: EndpointInfo, engine: EngineRank | None) -> RankStatus:
    return RankStatus(
        rank=endpoint.id,
        devices=[DeviceStatus(device_id=d.device_id, index=d.index) for d in endpoint.device_infos],
        engine_rank=None if engine is None else engine.engine_rank,
        engine_dp_size=None if engine is None else engine.dp_size,
        elastic_ep_resized=engine is not None and engine.elastic_ep_resized,
        elastic_ep_requested_dp_size=None if engine is None else engine.elastic_ep_requested_dp_size,
    )


def _pod(ctrl: StatusPorts, pod_id: str, endpoints: Sequence[EndpointInfo]) -> PodStatus | UnknownPodStatus:
    state = ctrl.pods.get(pod_id)
    if state is None:
        return UnknownPodStatus(pod_id=pod_id, ranks=_ranks(endpoints, {}))
    ranks = _ranks(endpoints, state.engine_ranks)
    silent = ctrl.clock.monotonic() - state.last_seen
    return PodStatus(
        pod_id=pod_id,
        pod_ip=state.registration.pod_ip,
        node_name=state.registration.node_name,
        state="lost" if silent > ctrl.config.settings.pod_lost_after_sec else "up",
        silent_sec=round(silent, 3),
        heartbeat_complete=state.heartbeat_complete,
        heartbeats=state.heartbeats,
        ranks=ranks,
    )
