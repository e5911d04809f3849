"""MindCluster (Ascend on Kubernetes): the ``mindx-dl-deviceinfo-<node>`` ConfigMaps and Node readiness
(``engine-protocol.md``, "Hardware fault source 1"), and the directory source that reads the same documents
from files. The Kubernetes watch over the same parser is :mod:`.kube`.

The parser is purely computational and never raises: whatever it is given, it returns the faults it could read
and a sentence for everything it could not. A document it cannot trust as a whole (no name, a section that is
not JSON or not an object) yields no fault list at all (``faults is None``), so that the source keeps the node's
last known state instead of clearing it on garbage. A single odd entry is skipped with a problem.

Levels (``engine-protocol.md``'s table): NotHandleFault and SubHealthFault L1, RestartRequest L2,
RestartBusiness L3, FreeRestartNPU L4, RestartNPU L5, SeparateNPU and ManuallySeparateNPU L6; PreSeparateNPU L6,
but L2 while the node hosts a running instance (the caller's ``hosts_instance``, asked when the document is
read). A level name we do not know is never guessed at: the entry is skipped with a problem, because an invented
L6 would reconfigure an instance and an invented L1 would hide a fault. Node NotReady (the Ready condition
False or Unknown) is a node-level fault (empty card) at L6, fault code ``NodeNotReady``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from heteroflow.contracts.serving import HardwareFaultReport
from heteroflow.core.clock import Clock, SystemClock

from .base import Emit, Problem, Snapshot

DEFAULT_NAMESPACE = "kube-system"
DEFAULT_NAME_PREFIX = "mindx-dl-deviceinfo-"
DEVICE_INFO_KEY = "DeviceInfoCfg"
SWITCH_INFO_KEY = "SwitchInfoCfg"
MANUALLY_SEPARATE_KEY = "ManuallySeparateNPU"
NODE_NOT_READY_CODE = "NodeNotReady"
PRE_SEPARATE = "PreSeparateNPU"

LEVELS: Mapping[str, int] = {
    "NotHandleFault": 1,
    "SubHealthFault": 1,
    "RestartRequest": 2,
    "RestartBusiness": 3,
    "FreeRestartNPU": 4,
    "RestartNPU": 5,
    "SeparateNPU": 6,
    "ManuallySeparateNPU": 6,
    PRE_SEPARATE: 6,
}
"""Origin level → L1…L6 for card faults."""

SWITCH_LEVELS: Mapping[str, int] = {**LEVELS, "NotHandle": 1, "Separate": 6}
"""``SwitchInfoCfg`` speaks a shorter vocabulary (NotHandle, SubHealthFault, RestartRequest, Separate)."""

NODE_NOT_READY_LEVEL = 6
PRE_SEPARATE_HOSTED_LEVEL = 2

HostsInstance = Callable[[str], bool]
"""Does this node host a running (assembled) instance? Decides PreSeparateNPU's level."""

_MAX_CODE = 128
_MAX_DETAIL = 1000


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    node_name: str | None
    """The node the document describes; ``None`` when even that could not be read."""
    faults: tuple[HardwareFaultReport, ...] | None
    """The node's faults; ``None``: the document as a whole is unusable (keep the last state)."""
    problems: tuple[str, ...] = ()


class _Unusable(Exception):
    """The document as a whole cannot be trusted."""


@dataclass
class _Reader:
    node: str
    source: str
    problems: list[str] = field(default_factory=list)
    faults: list[HardwareFaultReport] = field(default_factory=list)

    def add(self, *, card: str, code: str, level: int, detail: str) -> None:
        try:
            self.faults.append(
                HardwareFaultReport(
                    node_name=self.node,
                    card=card,
                    fault_code=code[:_MAX_CODE],
                    level=level,
                    source=self.source,
                    detail=detail[:_MAX_DETAIL],
                )
            )
        except ValidationError as exc:
            self.problems.append(f"fault {code!r} on card {card!r} skipped: {exc.errors()[0]['msg']}")


def _loads(value: object, what: str) -> object:
    """A ConfigMap value: a JSON string (what Kubernetes stores) or an already-decoded value (hand-written files)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise _Unusable(f"{what} is not JSON: {exc}") from None
    return value


def normalize_codes(raw: object) -> str | None:
    """``"A8028801, 80e18402"`` → ``"80E18402,A8028801"``: upper case, no blanks, sorted, so that the same set of
    codes is always the same key however the producer ordered it."""
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        return None
    parts = {part.strip().upper() for part in str(raw).split(",") if part.strip()}
    return ",".join(sorted(f"0x{p[2:]}" if p.startswith("0X") else p for p in parts)) or None


def _switch_map_code(map_key: str) -> str | None:
    """The fault code of a ``FaultTimeAndLevelMap`` key: ``<code>_<chip>_<port>``, where some producers write
    the code as ``[<code>,<more>,...]``."""
    code = map_key.rsplit("_", 2)[0].strip()
    if code.startswith("[") and "]" in code:
        code = code[1 : code.index("]")].split(",")[0]
    return normalize_codes(code)


def _level_name(entry: Mapping[str, Any]) -> str | None:
    # fault_handling, fault_level and large_model_fault_level say the same; MindCluster recommends fault_handling
    for key in ("fault_handling", "fault_level", "large_model_fault_level"):
        value = entry.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _entries(value: object, key: str, reader: _Reader) -> list[object]:
    """A DeviceList value holding fault entries: a native array or a JSON string of one. A comma list of card
    names (how ``-NetworkUnhealthy`` is often written) carries no level and is not an entry list."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("["):
            return []  # "Ascend910-0,Ascend910-1": names only; the -Fault entries carry the same cards with levels
        decoded = _loads(text, f"{DEVICE_INFO_KEY} {key}")
        value = decoded
    if not isinstance(value, list):
        reader.problems.append(f"{key} is neither an array nor a JSON array string; ignored")
        return []
    return value


def _device_faults(raw: object, reader: _Reader, hosts_instance: HostsInstance) -> None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return  # the device plugin has written nothing yet
    cfg = _loads(raw, DEVICE_INFO_KEY)
    if not isinstance(cfg, dict):
        raise _Unusable(f"{DEVICE_INFO_KEY} is not an object")
    info = cfg.get("DeviceInfo", {})
    device_list = info.get("DeviceList", {}) if isinstance(info, dict) else None
    if not isinstance(device_list, dict):
        raise _Unusable(f"{DEVICE_INFO_KEY}.DeviceInfo.DeviceList is not an object")
    for key in sorted(device_list):
        if not key.endswith(("-Fault", "-NetworkUnhealthy")):
            continue
        for entry in _entries(device_list[key], key, reader):
            if not isinstance(entry, dict):
                reader.problems.append(f"{key}: an entry is not an object; skipped")
                continue
            card = entry.get("npu_name", "")
            if not isinstance(card, str):
                reader.problems.append(f"{key}: npu_name {card!r} is not a string; entry skipped")
                continue
            level_name = _level_name(entry)
            if level_name is None or level_name not in LEVELS:
                reader.problems.append(f"{key}: unknown fault level {level_name!r} on {card!r}; entry skipped")
                continue
            level = LEVELS[level_name]
            if level_name == PRE_SEPARATE and hosts_instance(reader.node):
                level = PRE_SEPARATE_HOSTED_LEVEL  # the node still serves: pre-separation waits for it to end
            fault_type = entry.get("fault_type")
            code = normalize_codes(entry.get("fault_code")) or (
                fault_type if isinstance(fault_type, str) and fault_type else "UnknownFault"
            )
            reader.add(
                card=card.strip(),
                code=code,
                level=level,
                detail=f"MindCluster {fault_type or 'fault'} {level_name} ({key})",
            )


def _switch_faults(raw: object, reader: _Reader) -> None:
    """``SwitchInfoCfg``: faults of the node's bus switch, node-level (every card of the node is behind it)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return
    cfg = _loads(raw, SWITCH_INFO_KEY)
    if cfg is None:
        return
    if not isinstance(cfg, dict):
        raise _Unusable(f"{SWITCH_INFO_KEY} is not an object")
    overall = cfg.get("FaultLevel")
    level_map = cfg.get("FaultTimeAndLevelMap")
    level_map = level_map if isinstance(level_map, dict) else {}
    codes = cfg.get("FaultCode")
    found: dict[str, str] = {}  # code → level name
    if isinstance(codes, list):
        for entry in codes:
            if not isinstance(entry, dict):
                reader.problems.append(f"{SWITCH_INFO_KEY}.FaultCode: an entry is not an object; skipped")
                continue
            if entry.get("Assertion") in (0, 2):
                continue  # 0: recovered, 2: a one-off notice; only 1 (raised) is a standing fault
            code = normalize_codes(entry.get("AssembledFaultCode"))
            if code is None:
                reader.problems.append(f"{SWITCH_INFO_KEY}.FaultCode: an entry has no AssembledFaultCode; skipped")
                continue
            chip, port = entry.get("SwitchChipId"), entry.get("SwitchPortId")
            mapped = level_map.get(f"{entry.get('AssembledFaultCode')}_{chip}_{port}")
            level = mapped.get("fault_level") if isinstance(mapped, dict) else None
            found[code] = level if isinstance(level, str) else overall if isinstance(overall, str) else ""
    elif level_map:
        for map_key, value in level_map.items():
            code = _switch_map_code(str(map_key))
            level = value.get("fault_level") if isinstance(value, dict) else None
            if code is not None:
                found[code] = level if isinstance(level, str) else overall if isinstance(overall, str) else ""
    elif isinstance(overall, str) and overall and overall not in SWITCH_LEVELS:
        reader.problems.append(f"{SWITCH_INFO_KEY}: unknown FaultLevel {overall!r}; ignored")
    elif isinstance(overall, str) and SWITCH_LEVELS.get(overall, 1) > 1:
        found["SwitchFault"] = overall  # a level without codes still says the switch is faulty
    for code, level_name in sorted(found.items()):
        if level_name not in SWITCH_LEVELS:
            reader.problems.append(f"{SWITCH_INFO_KEY}: unknown fault level {level_name!r} for {code}; skipped")
            continue
        reader.add(card="", code=code, level=SWITCH_LEVELS[level_name], detail=f"MindCluster switch {level_name}")


def _manually_separated(raw: object, reader: _Reader) -> None:
    if raw is None:
        return
    if not isinstance(raw, str):
        reader.problems.append(f"{MANUALLY_SEPARATE_KEY} is not a comma-separated string; ignored")
        return
    for card in sorted({part.strip() for part in raw.split(",") if part.strip()}):
        reader.add(
            card=card, code=MANUALLY_SEPARATE_KEY, level=LEVELS[MANUALLY_SEPARATE_KEY], detail="separated by hand"
        )


def _name(doc: Mapping[str, Any]) -> str | None:
    metadata = doc.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) and name else None


def parse_configmap(
    doc: object, *, source: str, hosts_instance: HostsInstance, name_prefix: str = DEFAULT_NAME_PREFIX
) -> ParsedDocument:
    """One ``mindx-dl-deviceinfo-<node>`` ConfigMap (as the API returns it: ``metadata.name`` and ``data``)."""
    if not isinstance(doc, dict):
        return ParsedDocument(None, None, ("the document is not a JSON object",))
    name = _name(doc)
    if name is None or not name.startswith(name_prefix) or len(name) == len(name_prefix):
        return ParsedDocument(None, None, (f"metadata.name {name!r} is not {name_prefix}<node>",))
    node = name[len(name_prefix) :]
    data = doc.get("data", {})
    if not isinstance(data, dict):
        return ParsedDocument(node, None, ("data is not an object",))
    reader = _Reader(node=node, source=source)
    try:
        _device_faults(data.get(DEVICE_INFO_KEY), reader, hosts_instance)
        _switch_faults(data.get(SWITCH_INFO_KEY), reader)
        _manually_separated(data.get(MANUALLY_SEPARATE_KEY), reader)
    except _Unusable as exc:
        return ParsedDocument(node, None, (*reader.problems, str(exc)))
    except RecursionError:
        return ParsedDocument(node, None, ("the document is nested too deeply",))
    return ParsedDocument(node, tuple(reader.faults), tuple(reader.problems))


def parse_node(doc: object, *, source: str) -> ParsedDocument:
    """One Kubernetes Node: NotReady (Ready condition False or Unknown) is a node-level L6 fault. A node that
    reports no Ready condition yet is taken as no fault (the kubelet has not spoken; nothing to act on)."""
    if not isinstance(doc, dict):
        return ParsedDocument(None, None, ("the document is not a JSON object",))
    node = _name(doc)
    if node is None:
        return ParsedDocument(None, None, ("a Node without metadata.name",))
    status = doc.get("status", {})
    conditions = status.get("conditions", []) if isinstance(status, dict) else None
    if not isinstance(conditions, list):
        return ParsedDocument(node, None, ("status.conditions is not an array",))
    ready = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") == "True":
        return ParsedDocument(node, ())
    reader = _Reader(node=node, source=source)
    why = " ".join(str(ready.get(k, "")) for k in ("reason", "message") if ready.get(k))
    reader.add(
        card="",
        code=NODE_NOT_READY_CODE,
        level=NODE_NOT_READY_LEVEL,
        detail=f"Node Ready={ready.get('status')!s} {why}".strip(),
    )
    return ParsedDocument(node, tuple(reader.faults), tuple(reader.problems))


def parse_document(
    doc: object, *, source: str, hosts_instance: HostsInstance, name_prefix: str = DEFAULT_NAME_PREFIX
) -> tuple[str, ParsedDocument]:
    """A ConfigMap or a Node, told apart by ``kind`` (a document without ``kind`` is taken as a ConfigMap).
    Returns the scope kind (``configmap`` or ``node``) and the parse."""
    if isinstance(doc, dict) and doc.get("kind") == "Node":
        return "node", parse_node(doc, source=source)
    return "configmap", parse_configmap(doc, source=source, hosts_instance=hosts_instance, name_prefix=name_prefix)


# == the directory source =========================================================================================
@dataclass(frozen=True, slots=True)
class _FileState:
    stamp: tuple[int, int]
    """(mtime_ns, size): a file is read again only when one of them moves."""


class DirectorySource:
    """``*.json`` files in a folder, one ConfigMap (or Node) document each, polled every ``poll_sec``.

    For clusters where the ConfigMaps are mirrored to disk (a sidecar, a test, an operator's hand). Each file is
    its own scope: deleting it clears its faults. A file that is not JSON or has a wrong shape is reported as a
    problem and its last good state stands (a writer caught half-way must not clear a fault). Files are read in a
    worker thread so that a slow disk never stalls the controller's loop.
    """

    def __init__(
        self,
        directory: Path,
        *,
        poll_sec: float,
        hosts_instance: HostsInstance,
        name: str = "mindcluster-dir",
        name_prefix: str = DEFAULT_NAME_PREFIX,
        max_file_bytes: int = 4 * 1024 * 1024,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self._clock: Clock = clock or SystemClock()
        self._directory = directory
        self._poll_sec = poll_sec
        self._hosts_instance = hosts_instance
        self._name_prefix = name_prefix
        self._max_bytes = max_file_bytes
        self._files: dict[str, _FileState] = {}

    async def run(self, emit: Emit) -> None:
        # a (re)started source reads everything again (the edge detector drops the repeats) and still sees the
        # files deleted meanwhile as gone
        self._files = {name: _FileState((-1, -1)) for name in self._files}
        while True:
            await self.poll_once(emit)
            await self._clock.sleep(self._poll_sec)

    async def poll_once(self, emit: Emit) -> None:
        changed, gone, listing_error = await asyncio.to_thread(self._scan)
        if listing_error is not None:
            emit(Problem(scope=f"dir/{self._directory}", detail=listing_error))
            return
        for file_name in gone:
            self._files.pop(file_name, None)
            emit(Snapshot(scope=f"file/{file_name}", faults=()))
        for file_name, stamp, content in changed:
            scope = f"file/{file_name}"
            self._files[file_name] = _FileState(stamp)  # read again only when it changes
            if isinstance(content, Exception):
                emit(Problem(scope=scope, detail=f"cannot read: {content}"))
                continue
            try:
                doc = json.loads(content)
            except ValueError as exc:
                emit(Problem(scope=scope, detail=f"not JSON: {exc}"))
                continue
            except RecursionError:
                emit(Problem(scope=scope, detail="JSON nested too deeply"))
                continue
            _, parsed = parse_document(
                doc, source=self.name, hosts_instance=self._hosts_instance, name_prefix=self._name_prefix
            )
            for problem in parsed.problems:
                emit(Problem(scope=scope, detail=problem))
            if parsed.faults is not None:
                emit(Snapshot(scope=scope, faults=parsed.faults))

    def _scan(self) -> tuple[list[tuple[str, tuple[int, int], bytes | Exception]], list[str], str | None]:
        try:
            entries = sorted(p for p in self._directory.iterdir() if p.name.endswith(".json") and p.is_file())
        except OSError as exc:
            return [], [], f"cannot list {self._directory}: {exc.strerror or exc}"
        present = {p.name for p in entries}
        gone = sorted(set(self._files) - present)
        changed: list[tuple[str, tuple[int, int], bytes | Exception]] = []
        for path in entries:
            try:
                st = os.stat(path)
            except OSError:
                continue  # removed meanwhile: seen as gone on the next poll
            stamp = (st.st_mtime_ns, st.st_size)
            known = self._files.get(path.name)
            if known is not None and known.stamp == stamp:
                continue
            if st.st_size > self._max_bytes:
                changed.append((path.name, stamp, ValueError(f"larger than {self._max_bytes} bytes")))
                continue
            try:
                changed.append((path.name, stamp, path.read_bytes()))
            except OSError as exc:
                changed.append((path.name, stamp, exc))
        return changed, gone, None
