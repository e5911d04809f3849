"""Fakes of the agent's seams, for this project's tests and its users'.

- :class:`FakeCommandRunner`: vendor tools answering from canned output (or hanging, or missing).
- :class:`FakeNvml`: a stand-in for the ``pynvml`` module, with per-card values and per-call NVML errors.
- :class:`FakePlatformClient`: an in-memory server that records beats and can be told to fail.
- :class:`FakeCollector`: a collector that returns what it is given, and can hang until released.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from heteroflow.agent.client import (
    BeatResult,
    NodeGoneError,
    PermanentError,
    PlatformError,
    Registered,
    Registration,
    ServerUnavailableError,
)
from heteroflow.agent.commands import CommandResult, ToolMissingError, ToolTimeoutError
from heteroflow.agent.readings import CollectorName, HealthCollection, TelemetryCollection
from heteroflow.core.clock import Clock
from heteroflow.core.ids import NodeId

Answer = CommandResult | Callable[[Sequence[str]], CommandResult]


class FakeCommandRunner:
    """Tools that answer from a table. ``answers`` maps a tool name to an answer for every call, or to a
    function of the argv. A tool not in ``installed`` is missing; ``hang`` makes calls time out."""

    def __init__(self, answers: Mapping[str, Answer] | None = None, *, installed: Sequence[str] | None = None) -> None:
        self.answers: dict[str, Answer] = dict(answers or {})
        self.installed = set(installed if installed is not None else self.answers)
        self.hang: set[str] = set()
        self.calls: list[tuple[str, ...]] = []

    def which(self, tool: str) -> str | None:
        return f"/fake/bin/{tool}" if tool in self.installed else None

    def run(self, argv: Sequence[str], *, timeout_sec: float) -> CommandResult:
        self.calls.append(tuple(argv))
        tool = argv[0]
        if tool not in self.installed:
            raise ToolMissingError(f"{tool} is not installed (not found on PATH)")
        if tool in self.hang:
            raise ToolTimeoutError(f"{tool} did not answer within {timeout_sec:g} s")
        answer = self.answers.get(tool, CommandResult(returncode=127, stdout="", stderr="no answer"))
        return answer(argv) if callable(answer) else answer


class FakeNVMLError(Exception):
    """Shaped like ``pynvml.NVMLError``: the NVML return code is in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    """One card of :class:`FakeNvml`. ``errors`` maps a pynvml function name to the NVML code it fails
    with on this card (e.g. ``{"nvmlDeviceGetRemappedRows": 3}`` for NOT_SUPPORTED under MIG)."""

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    name: str = "NVIDIA H100 80GB HBM3"
    ecc_mode: tuple[int, int] = (1, 1)
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    retired_sbe: int = 0
    retired_dbe: int = 0
    retired_pending: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    temperature: int = 40
    utilization: int = 10
    memory_used: int = 1024 * 1024 * 1024
    memory_total: int = 80 * 1024 * 1024 * 1024
    power_mw: int = 70_000
    pci_bus_id: str = ""
    """``nvmlDeviceGetPciInfo(h).busId``; empty = ``00000000:<index+1 in hex>:00.0``."""
    errors: dict[str, int] = field(default_factory=dict)
    memory_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    """``nvmlDeviceGetMemoryErrorCounter`` by (error type, location: 2 DRAM, 7 SRAM); absent = NOT_SUPPORTED
    (a driver without the split, where only the totals exist)."""


@dataclass(frozen=True)
class _PciInfo:
    busId: str


@dataclass(frozen=True)
class _Util:
    gpu: int
    memory: int


@dataclass(frozen=True)
class _Memory:
    used: int
    total: int
    free: int


@dataclass(frozen=True)
class FakeEventData:
    device: int
    eventType: int
    eventData: int


class FakeNvml:
    """A stand-in for the ``pynvml`` module (the :class:`~heteroflow.agent.nvml.NvmlApi` seam).

    ``init_error`` makes ``nvmlInit`` fail with that code (12 = LIBRARY_NOT_FOUND, as on a machine without
    a GPU). XID events are queued with :meth:`emit_xid`; a registered card whose ``errors`` name
    ``nvmlEventSetWait`` makes every wait fail with that code; ``nvmlEventSetWait`` raises TIMEOUT when none is
    waiting, after waiting on a condition (never on the clock) for at most ``timeout_ms``.
    """

    NVMLError: type[Exception] = FakeNVMLError

    def __init__(self, gpus: Sequence[FakeGpu] = (), *, init_error: int | None = None) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.initialised = False
        self.calls: list[str] = []
        self._events: list[FakeEventData] = []
        self._cond = threading.Condition()
        self.registered: set[int] = set()
        self.wait_error: int | None = None
        """Make every ``nvmlEventSetWait`` fail with this code, whatever the cards (e.g. 999 UNKNOWN)."""

    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        self.calls.append(fn)
        if not self.initialised:
            raise FakeNVMLError(1)  # UNINITIALIZED
        gpu: FakeGpu = self.gpus[handle]
        code = gpu.errors.get(fn)
        if code is not None:
            raise FakeNVMLError(code)
        return gpu

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            raise FakeNVMLError(1)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._gpu(index, "nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        self._gpu(handle, "nvmlDeviceGetIndex")
        return handle

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetEccMode(self, handle: int) -> list[int]:
        return list(self._gpu(handle, "nvmlDeviceGetEccMode").ecc_mode)

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if counter_type != 1:
            raise FakeNVMLError(2)  # INVALID_ARGUMENT: the agent only reads aggregate counts
        return gpu.ecc_uncorrected if error_type == 1 else gpu.ecc_corrected

    def nvmlDeviceGetMemoryErrorCounter(self, handle: int, error_type: int, counter_type: int, location: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryErrorCounter")
        if counter_type != 1:
            raise FakeNVMLError(2)  # INVALID_ARGUMENT: the agent only reads aggregate counts
        value = gpu.memory_errors.get((error_type, location))
        if value is None:
            raise FakeNVMLError(3)  # NOT_SUPPORTED
        return value

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPages")
        count = gpu.retired_sbe if cause == 0 else gpu.retired_dbe
        return [0x1000 * (i + 1) for i in range(count)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return self._gpu(handle, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Util:
        return _Util(gpu=self._gpu(handle, "nvmlDeviceGetUtilizationRates").utilization, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        return _Memory(used=gpu.memory_used, total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetPciInfo(self, handle: int) -> _PciInfo:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        return _PciInfo(busId=gpu.pci_bus_id or f"00000000:{handle + 1:02X}:00.0")

    def nvmlEventSetCreate(self) -> str:
        self.calls.append("nvmlEventSetCreate")
        if not self.initialised:
            raise FakeNVMLError(1)
        self.registered = set()  # a new set watches no card until registered
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, event_set: Any) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        self.registered.add(handle)

    def emit_xid(self, index: int, xid: int) -> None:
        with self._cond:
            self._events.append(FakeEventData(device=index, eventType=0x8, eventData=xid))
            self._cond.notify_all()

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> FakeEventData:
        self.calls.append("nvmlEventSetWait")
        # a card registered in the set can make every wait fail (GPU_IS_LOST when it falls off the bus)
        for handle in sorted(self.registered):
            code = self.gpus[handle].errors.get("nvmlEventSetWait")
            if code is not None:
                raise FakeNVMLError(code)
        if self.wait_error is not None:
            raise FakeNVMLError(self.wait_error)
        with self._cond:
            if not self._events:
                self._cond.wait(timeout_ms / 1000.0)
            if not self._events:
                raise FakeNVMLError(10)  # TIMEOUT
            return self._events.pop(0)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        return None


class FakePlatformClient:
    """An in-memory platform server. ``fail_with`` makes every call raise that error until cleared;
    ``xid_retry`` answers ``retry: true`` (the server could not store the events)."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[NodeId, Registration]] = {}
        self.beats: list[tuple[NodeId, dict[str, Any]]] = []
        self.stored_xids: set[tuple[str, int, int, str]] = set()
        self.fail_with: PlatformError | None = None
        self.xid_retry = False
        self.closed = False
        self._lock = threading.Lock()

    def register(self, registration: Registration) -> Registered:
        with self._lock:
            if self.fail_with is not None:
                raise self.fail_with
            known = self.nodes.get(registration.hostname)
            if known is not None:
                if known[1].source != registration.source:
                    raise PermanentError("hostname registered with another source")
                return Registered(node_id=known[0], created=False, heartbeat_interval_seconds=5.0)
            node_id = NodeId(f"node-{len(self.nodes) + 1}")
            self.nodes[registration.hostname] = (node_id, registration)
            return Registered(node_id=node_id, created=True, heartbeat_interval_seconds=5.0)

    def forget(self, hostname: str) -> None:
        """Delete a node, as an operator would: its next heartbeat gets 404."""
        with self._lock:
            self.nodes.pop(hostname, None)

    def heartbeat(self, node_id: NodeId, body: Mapping[str, Any]) -> BeatResult:
        with self._lock:
            if self.fail_with is not None:
                raise self.fail_with
            if node_id not in {known[0] for known in self.nodes.values()}:
                raise NodeGoneError(f"node {node_id} is unknown to the server")
            self.beats.append((node_id, dict(body)))
            events = list(body.get("xid_events", []))
            if events and self.xid_retry:
                return BeatResult(len(events), 0, (), True)
            stored = 0
            for event in events:
                key = (str(node_id), int(event["index"]), int(event["xid"]), str(event["occurred_at"]))
                if key not in self.stored_xids:
                    self.stored_xids.add(key)
                    stored += 1
            return BeatResult(len(events), stored, (), False)

    def close(self) -> None:
        self.closed = True


class FakeCollector:
    """Returns the collections it is given. ``hold`` (an Event) makes reads block until it is set, to
    stand in for a hung vendor tool; ``health_reads`` and ``telemetry_reads`` count calls."""

    def __init__(
        self,
        *,
        clock: Clock,
        health: HealthCollection | None = None,
        telemetry: TelemetryCollection | None = None,
        name: CollectorName = "nvidia-smi",
    ) -> None:
        self._clock = clock
        self.name: CollectorName = name
        self.health = health
        self.telemetry = telemetry
        self.hold: threading.Event | None = None
        self.health_reads = 0
        self.telemetry_reads = 0
        self.closed = False

    def available(self) -> tuple[bool, str]:
        return True, ""

    def read_health(self) -> HealthCollection:
        self.health_reads += 1
        if self.hold is not None:
            self.hold.wait()
        return self.health or HealthCollection(collector=self.name, collected_at=self._clock.now())

    def read_telemetry(self) -> TelemetryCollection:
        self.telemetry_reads += 1
        if self.hold is not None:
            self.hold.wait()
        return self.telemetry or TelemetryCollection(collector=self.name, collected_at=self._clock.now())

    def close(self) -> None:
        self.closed = True


__all__ = [
    "FakeCollector",
    "FakeCommandRunner",
    "FakeGpu",
    "FakeNVMLError",
    "FakeNvml",
    "FakePlatformClient",
    "ServerUnavailableError",
]
