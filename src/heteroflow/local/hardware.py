"""Hardware faults into a running local cluster, through the path a real cluster's fault would take
(``heteroflow fault hardware --via``):

- ``controller`` — ``POST /controller/report_hardware_fault``, what a source outside the controller does. The
  answer carries the mapping.
- ``mindcluster`` — the node's ``mindx-dl-deviceinfo-<node>`` ConfigMap document, as MindCluster's device plugin
  writes it, in the folder the controller's directory source follows; the card is named ``Ascend910-<index>``
  (the format that source reads; the index is the rank's card on its node). ``--cleared`` removes the entry.
- ``gpu-health`` — an XID event in a heartbeat of the node's simulated agent (sent with the admin token), which the
  platform stores and serves on ``GET /api/v1/hardware-events``, where the controller's GPU-health source reads
  it. The level follows from the XID; such a fault clears by itself once it stops being reported.

The two source paths are asynchronous, so the command waits until the controller's status lists the fault's key
and says how long that took and how the controller mapped it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.faults import FaultError, endpoint_of
from heteroflow.local.state import ClusterState, InstanceState
from heteroflow.serving.controller.monitor.gpu_health import XID_LEVELS
from heteroflow.serving.controller.monitor.mindcluster import DEFAULT_NAME_PREFIX, DEVICE_INFO_KEY, normalize_codes

DEFAULT_LEVEL = 5
MINDCLUSTER_LEVELS = {
    1: "NotHandleFault",
    2: "RestartRequest",
    3: "RestartBusiness",
    4: "FreeRestartNPU",
    5: "RestartNPU",
    6: "SeparateNPU",
}
"""L1…L6 → the MindCluster level name the directory source reads back as that level."""
DEVICE_TYPE = "huawei.com/Ascend910"
CARDS_ON_A_NODE = 8


class HardwareVia(StrEnum):
    CONTROLLER = "controller"
    MINDCLUSTER = "mindcluster"
    GPU_HEALTH = "gpu-health"


DEFAULT_CODES = {HardwareVia.CONTROLLER: "XID79", HardwareVia.MINDCLUSTER: "80E18402", HardwareVia.GPU_HEALTH: "79"}
"""'GPU has fallen off the bus' for the controller and GPU-health paths; an HBM multi-bit ECC error, a common
Ascend card fault code, for MindCluster."""


class HardwareFaultError(FaultError):
    """The hardware fault could not be injected, or the controller did not take it in time; the text says why."""


@dataclass(frozen=True, slots=True)
class Card:
    node: str
    uuid: str
    index: int | None


def card_of(inst: InstanceState, rank: int) -> Card:
    """The node and first card of ``rank`` (from the state file)."""
    endpoint = endpoint_of(inst, rank)
    if not endpoint.device_infos:
        raise HardwareFaultError(f"{inst.instance_id} rank {rank} lists no device in the state file")
    device = endpoint.device_infos[0]
    return Card(node=inst.pod(endpoint.pod).node_name, uuid=device.device_id, index=device.index)


def inject(
    client: ClusterClient,
    inst: InstanceState,
    rank: int,
    *,
    via: HardwareVia = HardwareVia.CONTROLLER,
    level: int | None = None,
    code: str | None = None,
    card: str | None = None,
    cleared: bool = False,
    wait_sec: float = 30.0,
) -> str:
    """Inject one hardware fault on ``rank``'s card (or on ``card`` of its node) through ``via``; one sentence
    saying what was done and what the controller made of it."""
    target = card_of(inst, rank)
    code = code or DEFAULT_CODES[via]
    if via == HardwareVia.CONTROLLER:
        return _report(
            client,
            inst,
            target,
            card=target.uuid if card is None else card,  # "" is a node-level fault
            level=level or DEFAULT_LEVEL,
            code=code,
            cleared=cleared,
        )
    if via == HardwareVia.MINDCLUSTER:
        if card is None and target.index is None:
            raise HardwareFaultError(f"{inst.instance_id} rank {rank}'s card has no index to name it by; pass --card")
        name = card if card is not None else f"Ascend910-{target.index}"
        level = level or DEFAULT_LEVEL
        if level not in MINDCLUSTER_LEVELS:
            raise HardwareFaultError(f"level L{level} has no MindCluster name (L1-L6)")
        path, key = write_configmap(client.state, target.node, card=name, code=code, level=level, cleared=cleared)
        codes = normalize_codes(code)
        did = f"removed {codes} on {name!r}" if cleared else f"wrote {codes} {MINDCLUSTER_LEVELS[level]} on {name!r}"
        return f"{did} in {path}; " + _await(client, inst, key, gone=cleared, wait_sec=wait_sec)
    if level is not None:
        raise HardwareFaultError("--level does not apply to gpu-health: the level follows from the XID")
    if card is not None:
        raise HardwareFaultError("--card does not apply to gpu-health: the agent names the card by its uuid")
    if cleared:
        raise HardwareFaultError(
            "a gpu-health fault clears by itself once it stops being reported "
            "(HETEROFLOW_MONITOR_PLATFORM_FAULT_HOLD_SEC after its last event)"
        )
    xid = _xid(code)
    node_id = _send_xid(client, target, xid)
    key = f"XID{xid}|{target.uuid}|{target.node}"
    return (
        f"sent XID {xid} (L{XID_LEVELS[xid]}) for {target.node} card {target.uuid} in a heartbeat of node "
        f"{node_id}; " + _await(client, inst, key, gone=False, wait_sec=wait_sec)
    )


def _report(
    client: ClusterClient, inst: InstanceState, target: Card, *, card: str, level: int, code: str, cleared: bool
) -> str:
    answer = client.report_hardware_fault(
        {
            "node_name": target.node,
            "card": card,
            "fault_code": code,
            "level": level,
            "source": "heteroflow-fault",
            "detail": f"injected for {inst.instance_id}",
            "cleared": cleared,
        }
    )
    mapping = answer.get("mappings", {}).get(inst.instance_id, "not affected")
    verb = "cleared" if cleared else "reported"
    return f"{verb} hardware fault {code} L{level} on {target.node} card {card}: {inst.instance_id} {mapping}"


# == MindCluster =================================================================================================
def configmap_path(state: ClusterState, node: str) -> Path:
    if not state.hardware_directory:
        raise HardwareFaultError("the state file names no hardware folder (the cluster predates it: restart `up`)")
    return Path(state.hardware_directory) / f"{DEFAULT_NAME_PREFIX}{node}.json"


def _faults_in(path: Path) -> list[dict[str, Any]]:
    """The ``-Fault`` entries of the document at ``path`` (none when it is missing or unreadable)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        device_list = json.loads(doc["data"][DEVICE_INFO_KEY])["DeviceInfo"]["DeviceList"]
        found = json.loads(device_list[f"{DEVICE_TYPE}-Fault"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [entry for entry in found if isinstance(entry, dict)] if isinstance(found, list) else []


def write_configmap(
    state: ClusterState, node: str, *, card: str, code: str, level: int, cleared: bool
) -> tuple[Path, str]:
    """Add (or remove) one card fault in the node's ConfigMap document, written whole and renamed into place as
    a mirroring sidecar would; the path and the fault's key as the controller spells it."""
    path = configmap_path(state, node)
    codes = normalize_codes(code)
    if codes is None:
        raise HardwareFaultError(f"{code!r} is not a fault code")
    faults = [
        entry
        for entry in _faults_in(path)
        if not (entry.get("npu_name") == card and normalize_codes(entry.get("fault_code")) == codes)
    ]
    if not cleared:
        name = MINDCLUSTER_LEVELS[level]
        faults.append(
            {
                "fault_type": "CardUnhealthy",
                "npu_name": card,
                "fault_level": name,
                "fault_handling": name,
                "large_model_fault_level": name,
                "fault_code": codes,
            }
        )
    device_info = {
        "DeviceInfo": {
            "DeviceList": {
                DEVICE_TYPE: ",".join(f"Ascend910-{i}" for i in range(CARDS_ON_A_NODE)),
                f"{DEVICE_TYPE}-Fault": json.dumps(faults),
                f"{DEVICE_TYPE}-Unhealthy": ",".join(sorted({str(f.get("npu_name")) for f in faults})),
            },
            "UpdateTime": int(time.time()),
        },
        "SuperPodID": -2,
        "ServerIndex": -2,
    }
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{DEFAULT_NAME_PREFIX}{node}", "namespace": "kube-system"},
        "data": {DEVICE_INFO_KEY: json.dumps(device_info)},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path, f"{codes}|{card}|{node}"


# == GPU health ==================================================================================================
def _xid(code: str) -> int:
    text = code.strip().upper().removeprefix("XID").strip()
    if not text.isdigit():
        raise HardwareFaultError(f"{code!r} is not an XID (a number such as 79, or XID79)")
    xid = int(text)
    if xid not in XID_LEVELS:
        known = ", ".join(str(x) for x in sorted(XID_LEVELS))
        raise HardwareFaultError(f"XID {xid} is informational: the controller takes only XIDs {known} as card faults")
    return xid


def _send_xid(client: ClusterClient, target: Card, xid: int) -> str:
    """One XID event in a heartbeat of ``target.node``'s simulated agent; the node's platform id."""
    if not client.state.agent_token:  # a state file from before the gpu-health source
        raise HardwareFaultError("the state file holds no agent token (the cluster predates it: restart `up`)")
    nodes = client.platform_nodes()
    node_id = next((n["id"] for n in nodes if n.get("name") == target.node and n.get("source") == "simulated"), None)
    if node_id is None:
        raise HardwareFaultError(f"the platform knows no simulated node {target.node!r} (has its agent registered?)")
    event = {"index": target.index, "uuid": target.uuid, "xid": xid, "occurred_at": datetime.now(UTC).isoformat()}
    answer = client.agent_heartbeat(str(node_id), {"xid_events": [event]})
    result = answer.get("xid_events", {})
    if result.get("stored") != 1:
        raise HardwareFaultError(f"the platform did not store the XID event: {result}")
    return str(node_id)


# == the controller's answer =====================================================================================
def _await(client: ClusterClient, inst: InstanceState, key: str, *, gone: bool, wait_sec: float) -> str:
    """Wait until the controller lists the fault ``key`` for the instance (or no longer lists it)."""
    started = time.monotonic()
    deadline = started + wait_sec
    while True:
        try:
            entry = client.instance_status(inst.instance_id) or {}
        except ClusterUnreachableError:
            entry = {}
        seen = {f.get("key"): f for f in entry.get("hardware_faults", [])}
        took = time.monotonic() - started
        if gone and key not in seen:
            return f"the controller no longer lists {key} (after {took:.1f} s)"
        if not gone and key in seen:
            fault = seen[key]
            ranks = fault.get("ranks") or []
            mapping = (
                f"{fault.get('mapping')} {ranks}" if ranks else f"{fault.get('mapping')} {fault.get('reason', '')}"
            )
            source = fault.get("source")
            return f"the controller took {key} after {took:.1f} s from {source}: {inst.instance_id} {mapping.strip()}"
        if time.monotonic() > deadline:
            raise HardwareFaultError(
                f"the controller did not {'drop' if gone else 'take'} {key} within {wait_sec:.0f} s "
                "(is its ResourceMonitor following this source? GET /controller/resource_monitor)"
            )
        time.sleep(0.2)  # the polling period of this wait, bounded by the deadline above
