"""What ``GET /controller/fault_tolerance/status`` answers: one entry per instance, RFC §7's keys (the core's
:func:`~heteroflow.serving.controller.core.runtime.status_entry`) plus what an operator needs beside them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import StatusPorts

if TYPE_CHECKING:
    from heteroflow.serving.wire import EndpointInfo


def instance_statuses(ctrl: StatusPorts) -> list[dict[str, object]]:
    """Every assembled instance, then every restored one still waiting for its NodeManagers."""
    entries = [_assembled(ctrl, inst) for inst in ctrl.instances.values()]
    for restored in ctrl.restored.values():
        entry = rt.status_entry(restored.runtime)
        entry["running_strategy"] = None
        entry["last_decision"] = "waiting for every NodeManager to register"
        entry["intervention_required"] = None
        entries.append(entry)
    return entries


def _assembled(ctrl: StatusPorts, inst: Instance) -> dict[str, object]:
    entry = rt.status_entry(inst.runtime, engine_statuses=dict(inst.engine_statuses))
    gate = inst.runtime.gate
    entry["gate"] = {**entry["gate"], "warnings": list(gate.warnings) if gate else []}  # type: ignore[dict-item]
    capability = inst.topology.capability
    entry["engine_capability"] = {  # what the engines can do: why the gate may refuse a scale-down
        "protocol_profile": capability.protocol_profile,
        "scale_down_supported": capability.scale_down_supported,
        "retry_supported": capability.retry_supported,
    }
    entry["generation"] = inst.runtime.generation
    entry["intervention_required"] = inst.intervention_required
    entry["running_strategy"] = inst.running
    entry["last_decision"] = inst.last_decision
    entry["published_endpoints"] = sorted(inst.published)
    pending = {e.fault.key for e in inst.hardware}
    entry["hardware_faults"] = [{**seen, "pending": key in pending} for key, seen in inst.hardware_seen.items()]
    entry["rounds"] = list(inst.runtime.history)
    entry["pods"] = [{**_pod(ctrl, pod.pod_id), "ranks": _ranks(pod.endpoints)} for pod in inst.topology.pods]
    entry["persist_pending"] = inst.persist_pending
    entry["store_error"] = ctrl.store_error
    return entry


def _ranks(endpoints: Sequence[EndpointInfo]) -> list[dict[str, object]]:
    """The pod's DP ranks and the cards behind each (as registered): where the dashboard links a rank to."""
    return [
        {"rank": e.id, "devices": [{"device_id": d.device_id, "index": d.index} for d in e.device_infos]}
        for e in sorted(endpoints, key=lambda e: e.id)
    ]


def _pod(ctrl: StatusPorts, pod_id: str) -> dict[str, object]:
    state = ctrl.pods.get(pod_id)
    if state is None:
        return {"pod_id": pod_id, "state": "unknown"}
    silent = ctrl.clock.monotonic() - state.last_seen
    lost = silent > ctrl.config.settings.pod_lost_after_sec
    return {
        "pod_id": pod_id,
        "pod_ip": state.registration.pod_ip,
        "node_name": state.registration.node_name,
        "state": "lost" if lost else "up",
        "silent_sec": round(silent, 3),
        "heartbeat_complete": state.heartbeat_complete,
        "heartbeats": state.heartbeats,
    }
