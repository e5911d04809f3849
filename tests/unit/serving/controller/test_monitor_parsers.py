"""The ResourceMonitor's parsers, level mappings and edge detection (F-3; engine-protocol.md's two sources).

There are no MindCluster captures in ``../shared/fixtures``; the documents below are shaped after
engine-protocol.md's example and MindCluster's published field tables: ``data`` values are strings, as the
Kubernetes API returns them, and ``DeviceInfoCfg`` nests the ``-Fault`` array as a JSON string in a JSON string.
"""

from __future__ import annotations

import asyncio
import http.server
import itertools
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.contracts.serving import HardwareFaultReport
from heteroflow.core.testing import FakeClock, LoopClock, run_virtual
from heteroflow.serving.controller.monitor import ResourceMonitorSettings, hosting_nodes
from heteroflow.serving.controller.monitor.base import (
    EdgeDetector,
    Problem,
    ResourceMonitor,
    Snapshot,
    SourceUpdate,
    fault_key,
)
from heteroflow.serving.controller.monitor.gpu_health import GpuHealthSource, map_event
from heteroflow.serving.controller.monitor.kube import KubernetesApi, KubernetesSource, WatchGoneError, WatchHandler
from heteroflow.serving.controller.monitor.mindcluster import (
    DirectorySource,
    normalize_codes,
    parse_configmap,
    parse_document,
    parse_node,
)
from heteroflow.serving.controller.monitor.testing import FakeKubeApi
from tests.support.polling import IN_PROCESS_SEC, eventually

from .helpers import topology


def nobody(_: str) -> bool:
    return False


def everybody(_: str) -> bool:
    return True


def fault_entry(card: str, level: str, code: str = "80E18402", fault_type: str = "CardUnhealthy") -> dict[str, Any]:
    return {
        "fault_type": fault_type,
        "npu_name": card,
        "fault_level": level,
        "fault_handling": level,
        "fault_code": code,
        "fault_time_and_level_map": {code.split(",")[0]: {"fault_time": 1744167455784, "fault_level": level}},
    }


def configmap(
    node: str = "node-1",
    *,
    faults: list[dict[str, Any]] | None = None,
    as_string: bool = True,
    switch: dict[str, Any] | str | None = None,
    manually: str | None = None,
) -> dict[str, Any]:
    """A ``mindx-dl-deviceinfo-<node>`` ConfigMap as ``kubectl get -o json`` shows it."""
    fault_list = faults or []
    device_list: dict[str, Any] = {
        "huawei.com/Ascend910": "Ascend910-0,Ascend910-1,Ascend910-2,Ascend910-3",
        "huawei.com/Ascend910-Fault": json.dumps(fault_list) if as_string else fault_list,
        "huawei.com/Ascend910-NetworkUnhealthy": "Ascend910-0",
        "huawei.com/Ascend910-Unhealthy": ",".join(
            f["npu_name"] for f in fault_list if isinstance(f, dict) and isinstance(f.get("npu_name"), str)
        ),
    }
    data: dict[str, str] = {
        "DeviceInfoCfg": json.dumps(
            {
                "DeviceInfo": {"DeviceList": device_list, "UpdateTime": 1744182144},
                "SuperPodID": -2,
                "ServerIndex": -2,
                "CheckCode": "0" * 64,
            }
        )
    }
    if switch is not None:
        data["SwitchInfoCfg"] = switch if isinstance(switch, str) else json.dumps(switch)
    if manually is not None:
        data["ManuallySeparateNPU"] = manually
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"mindx-dl-deviceinfo-{node}", "namespace": "kube-system", "resourceVersion": "1"},
        "data": data,
    }


def node_doc(name: str, ready: str | None) -> dict[str, Any]:
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready, "reason": "KubeletNotReady", "message": "PLEG"})
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": {"conditions": conditions}}


def faults_of(doc: object, hosts: Callable[[str], bool] = nobody) -> list[tuple[str, str, int]]:
    parsed = parse_configmap(doc, source="test", hosts_instance=hosts)
    assert parsed.faults is not None, parsed.problems
    return [(f.card, f.fault_code, f.level) for f in parsed.faults]


def report(card: str, level: int, *, node: str = "node-1", code: str = "C1") -> HardwareFaultReport:
    return HardwareFaultReport(node_name=node, card=card, fault_code=code, level=level, source="test")


# == MindCluster ConfigMaps =======================================================================================
def test_the_spec_example_document_gives_one_card_fault_at_l6() -> None:
    doc = configmap(faults=[fault_entry("Ascend910-4", "SeparateNPU", "A8028801,80E18402")])
    parsed = parse_configmap(doc, source="mindcluster-kube", hosts_instance=nobody)
    assert parsed.node_name == "node-1"
    assert parsed.problems == ()
    assert parsed.faults is not None
    (fault,) = parsed.faults
    assert (fault.node_name, fault.card, fault.fault_code, fault.level) == (
        "node-1",
        "Ascend910-4",
        "80E18402,A8028801",
        6,
    )
    assert fault.source == "mindcluster-kube"
    assert not fault.cleared


def test_fault_value_as_string_or_native_array_reads_the_same() -> None:
    entries = [fault_entry("Ascend910-1", "RestartNPU"), fault_entry("Ascend910-2", "FreeRestartNPU", "81078607")]
    assert faults_of(configmap(faults=entries, as_string=True)) == faults_of(configmap(faults=entries, as_string=False))
    assert faults_of(configmap(faults=entries)) == [("Ascend910-1", "80E18402", 5), ("Ascend910-2", "81078607", 4)]


def test_data_values_may_be_decoded_objects_in_hand_written_files() -> None:
    doc = configmap(faults=[fault_entry("Ascend910-3", "RestartBusiness")])
    doc["data"]["DeviceInfoCfg"] = json.loads(doc["data"]["DeviceInfoCfg"])
    assert faults_of(doc) == [("Ascend910-3", "80E18402", 3)]


@pytest.mark.parametrize(
    ("origin", "level"),
    [
        ("NotHandleFault", 1),
        ("SubHealthFault", 1),
        ("RestartRequest", 2),
        ("RestartBusiness", 3),
        ("FreeRestartNPU", 4),
        ("RestartNPU", 5),
        ("SeparateNPU", 6),
        ("ManuallySeparateNPU", 6),
        ("PreSeparateNPU", 6),
    ],
)
def test_level_table(origin: str, level: int) -> None:
    assert faults_of(configmap(faults=[fault_entry("Ascend910-0", origin)])) == [("Ascend910-0", "80E18402", level)]


def test_pre_separate_is_l2_while_the_node_hosts_a_running_instance() -> None:
    doc = configmap(node="node-7", faults=[fault_entry("Ascend910-2", "PreSeparateNPU")])
    asked: list[str] = []

    def hosts(node: str) -> bool:
        asked.append(node)
        return node == "node-7"

    assert faults_of(doc, hosts) == [("Ascend910-2", "80E18402", 2)]
    assert asked == ["node-7"]
    assert faults_of(doc, nobody) == [("Ascend910-2", "80E18402", 6)]


def test_manual_separation_is_never_downgraded() -> None:
    doc = configmap(faults=[fault_entry("Ascend910-2", "ManuallySeparateNPU")])
    assert faults_of(doc, everybody) == [("Ascend910-2", "80E18402", 6)]


def test_hosting_nodes_answers_from_the_assembled_instances() -> None:
    hosts = hosting_nodes(lambda: [topology()])  # pods on n1 and n2
    assert hosts("n1")
    assert hosts("n2")
    assert not hosts("n3")
    assert not hosting_nodes(list)("n1")


def test_empty_npu_name_is_a_node_level_fault() -> None:
    entry = fault_entry("", "SeparateNPU", "heartbeatTimeOut", fault_type="NodeUnhealthy")
    assert faults_of(configmap(faults=[entry])) == [("", "HEARTBEATTIMEOUT", 6)]


def test_fault_codes_are_normalized_so_the_same_set_is_the_same_key() -> None:
    assert normalize_codes(" a8028801 ,80E18402,,A8028801") == "80E18402,A8028801"
    assert normalize_codes(110001024) == "110001024"
    assert normalize_codes("0X1001,0xb001") == "0x1001,0xB001"
    assert normalize_codes("") is None
    assert normalize_codes(None) is None
    assert normalize_codes(True) is None


def test_npu_prefixed_keys_and_network_arrays_are_read() -> None:
    doc = configmap()
    cfg = json.loads(doc["data"]["DeviceInfoCfg"])
    cfg["DeviceInfo"]["DeviceList"] = {
        "huawei.com/npu": "",
        "huawei.com/npu-Fault": json.dumps([fault_entry("npu-1", "RestartNPU", "8F180E00,110001024")]),
        "huawei.com/npu-NetworkUnhealthy": [fault_entry("npu-5", "RestartRequest", "81078607", "CardNetworkUnhealthy")],
        "huawei.com/npu-Unhealthy": "npu-1",
    }
    doc["data"]["DeviceInfoCfg"] = json.dumps(cfg)
    assert faults_of(doc) == [("npu-1", "110001024,8F180E00", 5), ("npu-5", "81078607", 2)]


def test_switch_info_gives_node_level_faults_per_raised_code() -> None:
    switch = {
        "FaultCode": [
            {"EventType": 1, "AssembledFaultCode": "0x08520003", "SwitchChipId": 0, "SwitchPortId": 3,
             "Severity": 3, "Assertion": 1, "AlarmRaisedTime": 1744167455},
            {"EventType": 2, "AssembledFaultCode": "0x08520004", "SwitchChipId": 0, "SwitchPortId": 4,
             "Severity": 1, "Assertion": 1, "AlarmRaisedTime": 1744167456},
            {"EventType": 3, "AssembledFaultCode": "0x08520005", "SwitchChipId": 1, "SwitchPortId": 0,
             "Severity": 1, "Assertion": 0, "AlarmRaisedTime": 1744167457},
        ],
        "FaultLevel": "Separate",
        "UpdateTime": 1744167460,
        "NodeStatus": "UnHealthy",
        "FaultTimeAndLevelMap": {"0x08520004_0_4": {"fault_time": 1744167456, "fault_level": "SubHealthFault"}},
    }  # fmt: skip
    assert faults_of(configmap(switch=switch)) == [("", "0x08520003", 6), ("", "0x08520004", 1)]


def test_switch_info_with_only_a_level_map_or_only_a_level() -> None:
    by_map = {"FaultTimeAndLevelMap": {"[0x08520003,na,L2,na]_1_2": {"fault_time": 1, "fault_level": "RestartRequest"}}}
    assert faults_of(configmap(switch=by_map)) == [("", "0x08520003", 2)]
    assert faults_of(configmap(switch={"FaultLevel": "Separate", "NodeStatus": "UnHealthy"})) == [
        ("", "SwitchFault", 6)
    ]
    assert faults_of(configmap(switch={"FaultLevel": "NotHandle", "NodeStatus": "Healthy", "FaultCode": []})) == []
    assert faults_of(configmap(switch="")) == []


def test_manually_separated_cards_are_l6() -> None:
    assert faults_of(configmap(manually=" Ascend910-2 ,Ascend910-0,, ")) == [
        ("Ascend910-0", "ManuallySeparateNPU", 6),
        ("Ascend910-2", "ManuallySeparateNPU", 6),
    ]


def test_node_readiness() -> None:
    not_ready = parse_node(node_doc("node-3", "False"), source="k")
    assert not_ready.faults is not None
    assert [(f.node_name, f.card, f.fault_code, f.level) for f in not_ready.faults] == [
        ("node-3", "", "NodeNotReady", 6)
    ]
    unknown = parse_node(node_doc("node-3", "Unknown"), source="k")
    assert unknown.faults is not None
    assert unknown.faults[0].level == 6
    assert parse_node(node_doc("node-3", "True"), source="k").faults == ()
    assert parse_node(node_doc("node-3", None), source="k").faults == ()  # the kubelet has not spoken yet
    kind, parsed = parse_document(node_doc("node-3", "False"), source="k", hosts_instance=nobody)
    assert kind == "node"
    assert parsed.faults


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ([1, 2], "not a JSON object"),
        ({"metadata": {"name": "other-configmap"}, "data": {}}, "is not mindx-dl-deviceinfo-<node>"),
        ({"metadata": {"name": "mindx-dl-deviceinfo-"}, "data": {}}, "is not mindx-dl-deviceinfo-<node>"),
        ({"data": {}}, "is not mindx-dl-deviceinfo-<node>"),
        ({"metadata": {"name": "mindx-dl-deviceinfo-n1"}, "data": "x"}, "data is not an object"),
        ({"metadata": {"name": "mindx-dl-deviceinfo-n1"}, "data": {"DeviceInfoCfg": "{not json"}}, "is not JSON"),
        ({"metadata": {"name": "mindx-dl-deviceinfo-n1"}, "data": {"DeviceInfoCfg": "[1]"}}, "is not an object"),
        (
            {
                "metadata": {"name": "mindx-dl-deviceinfo-n1"},
                "data": {"DeviceInfoCfg": '{"DeviceInfo": {"DeviceList": 3}}'},
            },
            "DeviceList is not an object",
        ),
        ({"metadata": {"name": "mindx-dl-deviceinfo-n1"}, "data": {"SwitchInfoCfg": "7"}}, "is not an object"),
    ],
)
def test_an_unusable_document_keeps_no_fault_list(doc: object, problem: str) -> None:
    parsed = parse_configmap(doc, source="t", hosts_instance=nobody)
    assert parsed.faults is None
    assert any(problem in p for p in parsed.problems), parsed.problems


def test_odd_entries_are_skipped_with_a_problem_and_the_rest_is_kept() -> None:
    entries: list[Any] = [
        "not an object",
        {**fault_entry("Ascend910-1", "SeparateNPU"), "npu_name": 7},
        fault_entry("Ascend910-2", "SomethingNew"),
        {"npu_name": "Ascend910-4", "fault_code": "X1"},  # no level at all
        fault_entry("x" * 300, "SeparateNPU"),  # a card name longer than the wire allows
        fault_entry("Ascend910-3", "RestartNPU"),
    ]
    parsed = parse_configmap(configmap(faults=entries), source="t", hosts_instance=nobody)
    assert parsed.faults is not None
    assert [(f.card, f.level) for f in parsed.faults] == [("Ascend910-3", 5)]
    assert len(parsed.problems) == 5
    assert any("SomethingNew" in p for p in parsed.problems)


def test_an_unknown_level_is_never_guessed_at() -> None:
    parsed = parse_configmap(configmap(switch={"FaultLevel": "Catastrophic"}), source="t", hosts_instance=nobody)
    assert parsed.faults == ()
    assert parsed.problems


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=25,
)
KEYS = st.sampled_from(["DeviceInfoCfg", "SwitchInfoCfg", "ManuallySeparateNPU", "other"])
DEVICE_KEYS = st.sampled_from(["huawei.com/Ascend910-Fault", "huawei.com/npu-NetworkUnhealthy", "x"])


@given(JSON)
def test_fuzz_any_json_value_never_raises(doc: object) -> None:
    kind, parsed = parse_document(doc, source="fuzz", hosts_instance=everybody)
    assert kind in ("configmap", "node")
    assert parsed.faults is None or all(isinstance(f, HardwareFaultReport) for f in parsed.faults)


@given(st.dictionaries(KEYS, JSON | JSON.map(json.dumps) | st.text(max_size=30), max_size=3))
def test_fuzz_configmap_data_never_raises(data: dict[str, Any]) -> None:
    doc = {"metadata": {"name": "mindx-dl-deviceinfo-n1"}, "data": data}
    parse_configmap(doc, source="fuzz", hosts_instance=nobody)


@given(st.dictionaries(DEVICE_KEYS, JSON | JSON.map(json.dumps), max_size=3), st.lists(JSON, max_size=3))
def test_fuzz_device_lists_and_entries_never_raise(device_list: dict[str, Any], entries: list[Any]) -> None:
    device_list["huawei.com/Ascend910-Fault"] = entries
    cfg = {"DeviceInfo": {"DeviceList": device_list}}
    doc = {"metadata": {"name": "mindx-dl-deviceinfo-n1"}, "data": {"DeviceInfoCfg": json.dumps(cfg)}}
    parsed = parse_configmap(doc, source="fuzz", hosts_instance=nobody)
    assert parsed.faults is not None


@given(JSON)
def test_fuzz_node_documents_never_raise(status: object) -> None:
    parse_node({"kind": "Node", "metadata": {"name": "n"}, "status": status}, source="fuzz")


# == GPU health levels ============================================================================================
def gpu_event(kind: str, value: object, **extra: Any) -> dict[str, Any]:
    return {
        "node_id": "id-1",
        "node_name": "gpu-node-1",
        "gpu_index": 3,
        "uuid": "GPU-11111111-2222-3333-4444-555555555555",
        "kind": kind,
        "value": value,
        "previous": None,
        "at": "2026-01-01T00:00:00Z",
        **extra,
    }


@pytest.mark.parametrize(
    ("kind", "value", "code", "level"),
    [
        ("xid", 79, "XID79", 6),
        ("xid", 95, "XID95", 6),
        ("xid", 48, "XID48", 5),
        ("xid", 64, "XID64", 5),
        ("xid", 94, "XID94", 4),
        ("remap_failure", 2, "ROW_REMAP_FAILURE", 6),
        ("ecc_uncorrected", 9, "ECC_UNCORRECTABLE", 5),
    ],
)
def test_gpu_event_levels(kind: str, value: int, code: str, level: int) -> None:
    mapped = map_event(gpu_event(kind, value), source="gpu-health")
    assert mapped.problem is None
    assert mapped.report is not None
    got = mapped.report
    assert (got.node_name, got.card, got.fault_code, got.level) == (
        "gpu-node-1",
        "GPU-11111111-2222-3333-4444-555555555555",
        code,
        level,
    )


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 63, 92, 0, 999])
def test_other_xids_are_informational(xid: int) -> None:
    assert map_event(gpu_event("xid", xid), source="g") == map_event(gpu_event("xid", 13), source="g")
    assert map_event(gpu_event("xid", xid), source="g").report is None
    assert map_event(gpu_event("xid", xid), source="g").problem is None


def test_a_card_without_uuid_is_named_by_its_index() -> None:
    mapped = map_event(gpu_event("xid", 79, uuid=None), source="g")
    assert mapped.report is not None
    assert mapped.report.card == "3"


@pytest.mark.parametrize(
    "event",
    [
        "x",
        gpu_event("xid", 79, node_name=""),
        gpu_event("xid", 79, uuid=None, gpu_index=None),
        gpu_event("xid", "79"),
        gpu_event("xid", True),
        gpu_event("reboot", 1),
    ],
)
def test_unreadable_gpu_events_are_problems(event: object) -> None:
    mapped = map_event(event, source="g")
    assert mapped.report is None
    assert mapped.problem


@given(JSON)
def test_fuzz_gpu_events_never_raise(event: object) -> None:
    map_event(event, source="fuzz")


# == edge detection ===============================================================================================
def test_appear_repeat_disappear() -> None:
    detector = EdgeDetector()
    a = report("Ascend910-1", 6)
    (appeared,) = detector.update("s", Snapshot("configmap/n1", (a,)))
    assert appeared == a
    assert not appeared.cleared
    assert detector.update("s", Snapshot("configmap/n1", (a,))) == []  # repeated every poll: nothing new
    (gone,) = detector.update("s", Snapshot("configmap/n1", ()))
    assert gone.cleared
    assert fault_key(gone) == fault_key(a)
    assert gone.level == 6
    assert detector.update("s", Snapshot("configmap/n1", ())) == []
    assert detector.standing() == ()


def test_a_level_change_is_a_clear_then_the_new_report() -> None:
    detector = EdgeDetector()
    detector.update("s", Snapshot("n", (report("c", 2),)))
    edges = detector.update("s", Snapshot("n", (report("c", 6),)))
    assert [(e.level, e.cleared) for e in edges] == [(2, True), (6, False)]


def test_a_key_stands_while_any_scope_reports_it_at_the_highest_level() -> None:
    detector = EdgeDetector()
    assert len(detector.update("kube", Snapshot("configmap/n1", (report("c", 5),)))) == 1
    assert detector.update("dir", Snapshot("file/n1.json", (report("c", 5),))) == []
    assert detector.update("kube", Snapshot("configmap/n1", ())) == []  # the file still says it
    edges = detector.update("dir", Snapshot("file/n1.json", (report("c", 6),)))
    assert [(e.level, e.cleared) for e in edges] == [(5, True), (6, False)]
    (gone,) = detector.update("dir", Snapshot("file/n1.json", ()))
    assert gone.cleared


def test_several_cards_with_one_code_are_several_faults() -> None:
    detector = EdgeDetector()
    edges = detector.update("s", Snapshot("n", (report("Ascend910-1", 6), report("Ascend910-2", 6))))
    assert [e.card for e in edges] == ["Ascend910-1", "Ascend910-2"]
    assert len(detector.standing()) == 2


# == the monitor ==================================================================================================
class ScriptedSource:
    """Runs ``steps`` in order each time it is run: a snapshot list to emit, or an exception to raise."""

    def __init__(self, name: str, runs: list[list[SourceUpdate] | Exception]) -> None:
        self.name = name
        self._runs = runs
        self.started = 0

    async def run(self, emit: Callable[[SourceUpdate], None]) -> None:
        self.started += 1
        step = self._runs[min(self.started, len(self._runs)) - 1]
        if isinstance(step, Exception):
            raise step
        for update in step:
            emit(update)
        await asyncio.Event().wait()


def test_a_crashing_source_is_restarted_and_never_blocks_the_others() -> None:
    got: list[HardwareFaultReport] = []
    crashing = ScriptedSource("bad", [RuntimeError("boom"), [Snapshot("x", (report("c", 6, node="n2"),))]])
    steady = ScriptedSource("good", [[Problem("f", "not JSON"), Snapshot("y", (report("c", 6, node="n1"),))]])

    async def main() -> None:
        monitor = ResourceMonitor(
            sources=[crashing, steady], sink=got.append, clock=LoopClock(), restart_delay_sec=0.01
        )
        await monitor.start()
        try:
            await eventually(lambda: len(got) == 2, within=5, period=IN_PROCESS_SEC, what="both faults delivered")
            status = monitor.status()
            assert status.source("bad").crashes == 1
            assert status.source("bad").last_problem == "crashed: RuntimeError: boom (run again in 0.01 s)"
            assert status.source("bad").state == "running"
            assert status.source("good").problems == 1
            assert status.source("good").last_problem == "f: not JSON"
            assert status.standing == ("C1|c|n1", "C1|c|n2")
        finally:
            await monitor.close()
        assert {s.state for s in monitor.status().sources} == {"stopped"}

    run_virtual(main())  # the restart back-off passes on the loop's virtual clock
    assert sorted(r.node_name for r in got) == ["n1", "n2"]


def test_a_failing_sink_is_counted_and_the_monitor_goes_on() -> None:
    calls: list[str] = []

    def sink(r: HardwareFaultReport) -> None:
        calls.append(r.card)
        if r.card == "bad":
            raise ValueError("the controller refused")

    monitor = ResourceMonitor(sources=[ScriptedSource("s", [[]])], sink=sink, clock=FakeClock())
    emit = monitor.emitter("s")
    emit(Snapshot("n", (report("bad", 6), report("good", 6))))
    assert calls == ["bad", "good"]
    assert monitor.status().sink_errors == 1
    assert monitor.status().reports == 2


def test_source_names_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        ResourceMonitor(sources=[ScriptedSource("s", []), ScriptedSource("s", [])], sink=print, clock=FakeClock())


# == the directory source =========================================================================================
def collect() -> tuple[list[SourceUpdate], Callable[[SourceUpdate], None]]:
    updates: list[SourceUpdate] = []
    return updates, updates.append


def write(path: Path, content: str) -> None:
    path.write_text(content)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new mtime even on a coarse clock


def test_directory_source_reads_changes_keeps_state_on_garbage_and_clears_on_delete(tmp_path: Path) -> None:
    source = DirectorySource(tmp_path, poll_sec=1.0, hosts_instance=nobody)
    detector = EdgeDetector()
    edges: list[HardwareFaultReport] = []
    problems: list[Problem] = []

    def emit(update: SourceUpdate) -> None:
        if isinstance(update, Problem):
            problems.append(update)
        else:
            edges.extend(detector.update(source.name, update))

    async def poll() -> None:
        await source.poll_once(emit)

    file = tmp_path / "node-1.json"
    write(file, json.dumps(configmap(faults=[fault_entry("Ascend910-4", "SeparateNPU")])))
    (tmp_path / "notes.txt").write_text("not a document")
    asyncio.run(poll())
    assert [(e.card, e.level, e.cleared) for e in edges] == [("Ascend910-4", 6, False)]
    asyncio.run(poll())  # unchanged file: not even read again
    assert len(edges) == 1

    write(file, '{"metadata": {"name": "mindx-dl-deviceinfo-node-1"}, "data": {"DeviceInfoCfg": "{broken')
    asyncio.run(poll())
    assert len(edges) == 1, "a half-written file must not clear the fault"
    assert problems
    assert "not JSON" in problems[-1].detail

    write(file, "{ not json at all")
    asyncio.run(poll())
    assert len(edges) == 1
    assert "not JSON" in problems[-1].detail

    write(tmp_path / "node-2.json", json.dumps(node_doc("node-2", "False")))
    asyncio.run(poll())
    assert (edges[-1].node_name, edges[-1].fault_code, edges[-1].cleared) == ("node-2", "NodeNotReady", False)

    file.unlink()
    asyncio.run(poll())
    assert (edges[-1].card, edges[-1].cleared) == ("Ascend910-4", True)


def test_directory_source_survives_a_missing_folder(tmp_path: Path) -> None:
    updates, emit = collect()
    source = DirectorySource(tmp_path / "absent", poll_sec=1.0, hosts_instance=nobody)
    asyncio.run(source.poll_once(emit))
    assert len(updates) == 1
    assert isinstance(updates[0], Problem)


# == the Kubernetes watch =========================================================================================
def test_watch_handler_takes_the_dicts_the_watch_yields() -> None:
    handler = WatchHandler(source="mindcluster-kube", hosts_instance=nobody)
    bad = configmap("node-1", faults=[fault_entry("Ascend910-4", "SeparateNPU")])
    good = configmap("node-1")
    (added,) = handler.event("configmaps", {"type": "ADDED", "object": bad})
    assert isinstance(added, Snapshot)
    assert added.scope == "configmap/mindx-dl-deviceinfo-node-1"
    assert [f.card for f in added.faults] == ["Ascend910-4"]
    (modified,) = handler.event("configmaps", {"type": "MODIFIED", "raw_object": good, "object": object()})
    assert isinstance(modified, Snapshot)
    assert modified.faults == ()
    assert handler.event("configmaps", {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}) == []
    other = {"metadata": {"name": "coredns"}, "data": {"Corefile": "."}}
    assert handler.event("configmaps", {"type": "ADDED", "object": other}) == []
    (deleted,) = handler.event("configmaps", {"type": "DELETED", "object": bad})
    assert isinstance(deleted, Snapshot)
    assert deleted.faults == ()
    (node,) = handler.event("nodes", {"type": "MODIFIED", "object": node_doc("node-1", "False")})
    assert isinstance(node, Snapshot)
    assert node.scope == "node/node-1"
    assert node.faults[0].level == 6


@pytest.mark.parametrize(
    "event",
    [
        "garbage",
        {"type": "ERROR", "object": {"code": 500}},
        {"type": "ADDED", "object": {"data": {}}},
        {"type": "DELETED", "object": None},
    ],
)
def test_watch_handler_reports_garbage_as_problems(event: object) -> None:
    updates = WatchHandler(source="k", hosts_instance=nobody).event("configmaps", event)
    assert updates
    assert all(isinstance(u, Problem) for u in updates)


def test_a_malformed_configmap_in_the_watch_keeps_the_last_state() -> None:
    handler = WatchHandler(source="k", hosts_instance=nobody)
    broken = {"metadata": {"name": "mindx-dl-deviceinfo-n1"}, "data": {"DeviceInfoCfg": "{oops"}}
    updates = handler.event("configmaps", {"type": "MODIFIED", "object": broken})
    assert [type(u) for u in updates] == [Problem]


def test_a_relist_clears_what_was_deleted_while_the_watch_was_down() -> None:
    handler = WatchHandler(source="k", hosts_instance=nobody)
    handler.relisted("configmaps", [configmap("n1"), configmap("n2")])
    updates = handler.relisted("configmaps", [configmap("n2")])
    assert [(u.scope, isinstance(u, Snapshot) and u.faults) for u in updates] == [
        ("configmap/mindx-dl-deviceinfo-n2", ()),
        ("configmap/mindx-dl-deviceinfo-n1", ()),
    ]


def test_kubernetes_source_lists_watches_reconnects_and_relists() -> None:
    api = FakeKubeApi()
    api.list_failures = 2  # the API server is down when the controller starts
    api.put("configmaps", configmap("n1", faults=[fault_entry("Ascend910-1", "RestartNPU")]))
    api.put("configmaps", configmap("gone-while-away"))
    api.put("nodes", node_doc("n1", "True"))
    got: list[HardwareFaultReport] = []
    source = KubernetesSource(api_factory=lambda: api, hosts_instance=nobody, retry_sec=0.01, max_retry_sec=0.02)

    async def main() -> None:
        monitor = ResourceMonitor(sources=[source], sink=got.append, clock=FakeClock())
        await monitor.start()
        try:
            await eventually(lambda: len(got) == 1, within=5, period=IN_PROCESS_SEC, what="the listed fault")
            assert monitor.status().source("mindcluster-kube").problems >= 2  # the failed lists, logged
            api.put("nodes", node_doc("n1", "False"), event="MODIFIED")
            await eventually(lambda: len(got) == 2, within=5, period=IN_PROCESS_SEC, what="the NotReady node")
            assert (got[1].card, got[1].fault_code) == ("", "NodeNotReady")
            api.put("configmaps", configmap("n1", faults=[fault_entry("Ascend910-1", "RestartNPU")]), event="MODIFIED")
            api.push_raw("configmaps", {"type": "SURPRISE"})
            api.put("configmaps", configmap("n1"), event="MODIFIED")
            await eventually(lambda: len(got) == 3, within=5, period=IN_PROCESS_SEC, what="the card fault cleared")
            assert got[2].cleared
            assert got[2].card == "Ascend910-1"
            lists = api.lists["configmaps"]
            api.put("configmaps", configmap("n3", faults=[fault_entry("Ascend910-0", "SeparateNPU")]))  # missed
            api.expire_watch("configmaps")
            await eventually(lambda: len(got) == 4, within=5, period=IN_PROCESS_SEC, what="the relist after 410 Gone")
            assert api.lists["configmaps"] == lists + 1
            assert (got[3].node_name, got[3].level) == ("n3", 6)
        finally:
            await monitor.close()

    asyncio.run(main())


# == the GPU-health source ========================================================================================
class FakePlatform:
    """The platform's hardware-event route, in memory (the real route has its own integration test)."""

    def __init__(self) -> None:
        self.pages: list[httpx.Response] = []
        self.requests: list[httpx.Request] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.pages:
            return self.pages.pop(0)
        return httpx.Response(200, json={"source": "real", "events": [], "next_cursor": "9.9", "more": False})


def page(events: list[Any], cursor: str, *, more: bool = False) -> httpx.Response:
    return httpx.Response(200, json={"source": "real", "events": events, "next_cursor": cursor, "more": more})


def test_gpu_health_source_follows_the_cursor_and_holds_faults() -> None:
    platform, clock = FakePlatform(), FakeClock()
    platform.pages = [
        page([gpu_event("xid", 79), gpu_event("xid", 13)], "1.0", more=True),
        page(
            [gpu_event("remap_failure", 2, previous=1, gpu_index=1, uuid="GPU-aaaaaaaa-2222-3333-4444-555555555555")],
            "1.5",
        ),
    ]
    source = GpuHealthSource(
        base_url="http://platform",
        token="hf_monitor",
        poll_sec=1.0,
        hold_sec=60.0,
        clock=clock,
        transport=httpx.MockTransport(platform.handler),
    )
    detector = EdgeDetector()
    edges: list[HardwareFaultReport] = []
    problems: list[Problem] = []

    def emit(update: SourceUpdate) -> None:
        if isinstance(update, Problem):
            problems.append(update)
        else:
            edges.extend(detector.update(source.name, update))

    async def poll() -> None:
        await source.poll_once(emit)
        await source.aclose()

    asyncio.run(poll())
    assert sorted((e.fault_code, e.level, e.card[:12]) for e in edges) == [
        ("ROW_REMAP_FAILURE", 6, "GPU-aaaaaaaa"),
        ("XID79", 6, "GPU-11111111"),
    ]
    assert "cursor" not in platform.requests[0].url.params
    assert platform.requests[0].headers["authorization"] == "Bearer hf_monitor"  # the source's own token
    assert "since" not in platform.requests[0].url.params
    assert platform.requests[1].url.params["cursor"] == "1.0"
    clock.advance(30)
    platform.pages = [page([gpu_event("xid", 79)], "2.5")]  # the same card again: the hold restarts
    asyncio.run(poll())
    assert platform.requests[2].url.params["cursor"] == "1.5"
    assert len(edges) == 2
    clock.advance(45)
    asyncio.run(poll())
    assert [(e.fault_code, e.cleared) for e in edges[2:]] == [("ROW_REMAP_FAILURE", True)]
    clock.advance(20)
    asyncio.run(poll())
    assert [(e.fault_code, e.cleared) for e in edges[3:]] == [("XID79", True)]
    assert problems == []


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(401, json={"error": "unauthorized"}),
        httpx.Response(200, content=b"<html>"),
        httpx.Response(200, json=[1]),
        httpx.Response(200, json={"events": "x", "next_cursor": "1.1", "more": False}),
    ],
)
def test_a_bad_platform_answer_is_a_problem_and_the_cursor_stays(answer: httpx.Response) -> None:
    platform, clock = FakePlatform(), FakeClock()
    platform.pages = [page([], "5.5"), answer]
    source = GpuHealthSource(
        base_url="http://p", token=None, poll_sec=1.0, hold_sec=60.0, clock=clock,
        transport=httpx.MockTransport(platform.handler),
    )  # fmt: skip
    updates, emit = collect()

    async def poll() -> None:
        for _ in range(3):
            await source.poll_once(emit)
        await source.aclose()

    asyncio.run(poll())
    assert sum(isinstance(u, Problem) for u in updates) == 1
    assert [r.url.params.get("cursor") for r in platform.requests] == [None, "5.5", "5.5"]


def test_gpu_health_source_lookback_starts_in_the_past() -> None:
    platform, clock = FakePlatform(), FakeClock()
    source = GpuHealthSource(
        base_url="http://p", token="t", poll_sec=1.0, hold_sec=60.0, clock=clock, lookback_sec=120,
        transport=httpx.MockTransport(platform.handler),
    )  # fmt: skip
    updates, emit = collect()

    async def main() -> None:
        task = asyncio.create_task(source.run(emit))
        await eventually(lambda: bool(updates), within=5, period=IN_PROCESS_SEC, what="one poll")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert platform.requests[0].url.params["since"] == "2025-12-31T23:58:00+00:00"
    assert platform.requests[0].headers["authorization"] == "Bearer t"


# == settings =====================================================================================================
def test_settings_default_to_every_source_off_and_fall_back_on_invalid_values() -> None:
    settings = ResourceMonitorSettings.load()
    assert not settings.kube_enabled
    assert settings.directory is None
    assert settings.platform_url is None
    bad = ResourceMonitorSettings.load(directory_poll_sec=-1, platform_source="all", kube_watch_timeout_sec=1)
    assert (bad.directory_poll_sec, bad.platform_source, bad.kube_watch_timeout_sec) == (5.0, "real", 300)
    assert len(bad.config_warnings) == 3


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_MONITOR_PLATFORM_URL", "http://platform:8000")
    monkeypatch.setenv("HETEROFLOW_MONITOR_PLATFORM_TOKEN", "hf_x")
    monkeypatch.setenv("HETEROFLOW_MONITOR_DIRECTORY_POLL_SEC", "0.5")
    settings = ResourceMonitorSettings.load()
    assert (settings.platform_url, settings.platform_token, settings.directory_poll_sec) == (
        "http://platform:8000",
        "hf_x",
        0.5,
    )


# == the real client, against an API server over HTTP =============================================================
class _FakeApiServer(http.server.BaseHTTPRequestHandler):
    """Answers the two lists and the ConfigMap watch as kube-apiserver does (one event, or 410 Gone)."""

    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        doc = configmap("n1", faults=[fault_entry("Ascend910-1", "SeparateNPU")])
        if "watch=true" in self.path and "resourceVersion=7" in self.path:
            gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
            body = json.dumps({"type": "ERROR", "object": gone}) + "\n"
        elif "watch=true" in self.path:
            body = (
                json.dumps(
                    {"type": "MODIFIED", "object": {**doc, "metadata": {**doc["metadata"], "resourceVersion": "7"}}}
                )
                + "\n"
            )  # a watch streams one JSON object per line
        elif self.path.startswith("/api/v1/nodes"):
            body = json.dumps(
                {"kind": "NodeList", "metadata": {"resourceVersion": "3"}, "items": [node_doc("n1", "False")]}
            )
        else:
            items = [doc, {"metadata": {"name": "coredns"}, "data": {}}]
            body = json.dumps({"kind": "ConfigMapList", "metadata": {"resourceVersion": "5"}, "items": items})
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


def test_kubernetes_api_lists_watches_and_translates_410(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        api = KubernetesApi(namespace="kube-system", kubeconfig=str(kubeconfig))
        handler = WatchHandler(source="k", hosts_instance=nobody)
        items, version = api.list("configmaps")
        assert version == "5"
        (listed,) = handler.relisted("configmaps", items)  # coredns is not ours
        assert isinstance(listed, Snapshot)
        assert [f.card for f in listed.faults] == ["Ascend910-1"]
        nodes, _ = api.list("nodes")
        assert [n["metadata"]["name"] for n in nodes] == ["n1"]
        (event,) = list(api.watch("configmaps", version, 10))
        (watched,) = handler.event("configmaps", event)
        assert isinstance(watched, Snapshot)
        assert watched.faults == listed.faults
        with pytest.raises(WatchGoneError):
            list(api.watch("configmaps", "7", 10))
        assert "/api/v1/namespaces/kube-system/configmaps?resourceVersion=5&timeoutSeconds=10&watch=true" in (
            _FakeApiServer.paths
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_restarted_directory_source_rereads_and_still_clears_files_deleted_meanwhile(tmp_path: Path) -> None:
    source = DirectorySource(tmp_path, poll_sec=0.01, hosts_instance=nobody)
    detector = EdgeDetector()
    edges: list[HardwareFaultReport] = []

    def emit(update: SourceUpdate) -> None:
        if isinstance(update, Snapshot):
            edges.extend(detector.update(source.name, update))

    write(tmp_path / "a.json", json.dumps(configmap("a", faults=[fault_entry("Ascend910-1", "RestartNPU")])))
    write(tmp_path / "b.json", json.dumps(configmap("b", faults=[fault_entry("Ascend910-2", "RestartNPU")])))

    async def main() -> None:
        first = asyncio.create_task(source.run(emit))
        await eventually(lambda: len(edges) == 2, within=5, period=IN_PROCESS_SEC, what="both faults")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        (tmp_path / "a.json").unlink()  # while the source is down
        again = asyncio.create_task(source.run(emit))
        await eventually(
            lambda: len(edges) == 3, within=5, period=IN_PROCESS_SEC, what="the deleted file's fault cleared"
        )
        again.cancel()
        with pytest.raises(asyncio.CancelledError):
            await again

    asyncio.run(main())
    assert [(e.node_name, e.cleared) for e in edges[2:]] == [("a", True)]
    assert detector.standing() == ("80E18402|Ascend910-2|b",)


def test_gpu_health_source_trusts_only_its_tenant_and_cards_the_node_reported() -> None:
    """Another tenant's node of the same name, a card uuid the node never reported, and an event from a node
    whose credential was just issued again (an impostor holding it may be speaking), raise nothing."""
    platform, clock = FakePlatform(), FakeClock()
    own = gpu_event("xid", 79)
    foreign = {**gpu_event("xid", 95), "tenant_id": "other-tenant"}
    invented = {**gpu_event("xid", 79, uuid="GPU-deadbeef-0000-0000-0000-000000000000"), "card_known": False}
    reissued = {**gpu_event("xid", 79, uuid="GPU-22222222-0000-0000-0000-000000000000"), "identity_changed": True}
    platform.pages = [page([foreign, invented, reissued, own], "1.0")]
    source = GpuHealthSource(
        base_url="http://p", token=None, poll_sec=1.0, hold_sec=60.0, clock=clock,
        transport=httpx.MockTransport(platform.handler),
    )  # fmt: skip
    updates, emit = collect()

    async def poll() -> None:
        await source.poll_once(emit)
        await source.aclose()

    asyncio.run(poll())
    (snapshot,) = [u for u in updates if isinstance(u, Snapshot)]
    assert [(f.fault_code, f.card[:12]) for f in snapshot.faults] == [("XID79", "GPU-11111111")]
    assert source.skipped == {"foreign_tenant": 1, "unknown_card": 1, "identity_changed": 1}
    held = [u.detail for u in updates if isinstance(u, Problem)]
    assert len(held) == 1  # told to the operator, not acted on
    assert "held for an operator" in held[0]


def test_a_storm_of_new_card_faults_is_raised_at_most_once_per_interval() -> None:
    platform, clock = FakePlatform(), FakeClock()
    source = GpuHealthSource(
        base_url="http://p", token=None, poll_sec=1.0, hold_sec=600.0, clock=clock, new_fault_interval_sec=10.0,
        transport=httpx.MockTransport(platform.handler),
    )  # fmt: skip
    updates, emit = collect()

    def card(n: int) -> dict[str, Any]:
        return gpu_event("xid", 79, gpu_index=n % 8, uuid=f"GPU-{n:08d}-0000-0000-0000-000000000000")

    async def poll(events: list[dict[str, Any]]) -> tuple[str, ...]:
        platform.pages = [page(events, "1.1")]
        await source.poll_once(emit)
        await source.aclose()
        last = [u for u in updates if isinstance(u, Snapshot)][-1]
        return tuple(sorted(f.card for f in last.faults))

    first = asyncio.run(poll([card(0), card(1)]))
    assert len(first) == 2  # the new faults of one poll are raised together
    raised: list[tuple[str, ...]] = [first]
    for n in range(2, 40):  # a new invented card every second
        clock.advance(1)
        raised.append(asyncio.run(poll([card(n)])))
    changes = sum(1 for before, after in itertools.pairwise(raised) if before != after)
    assert changes == 3  # at 10 s, 20 s and 30 s: held faults are raised together, never one by one
    assert source.deferred > 0
    assert any(isinstance(u, Problem) and "held" in u.detail for u in updates)
