"""The NVML collector (in-process, preferred where the library loads) and the XID event watcher.

This is the only module that touches ``pynvml`` (package ``nvidia-ml-py``), and only lazily, through the
:class:`NvmlApi` seam: tests pass ``heteroflow.agent.testing.FakeNvml`` instead. On a machine without the
NVIDIA driver ``nvmlInit()`` raises ``NVMLError_LibraryNotFound``; that means "collector unavailable",
and the agent falls back to nvidia-smi with a warning.

Error classes (vendor-tools.md): NOT_SUPPORTED, NO_PERMISSION, GPU_IS_LOST, RESET_REQUIRED, UNKNOWN and
every other NVML error make the value unknown — never 0 (H-1). A lost GPU or one needing a reset also
produces a warning naming the card (the health event).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar, cast

from heteroflow.agent.backoff import backoff_delay
from heteroflow.agent.kernel_xid import CardMap, parse_bus_id
from heteroflow.agent.parsing import add_counts
from heteroflow.agent.readings import (
    CollectorName,
    GpuHealth,
    GpuTelemetry,
    HealthCollection,
    TelemetryCollection,
    XidEvent,
)
from heteroflow.agent.xid_status import XidCollectionStatus, not_collected, watcher_status
from heteroflow.contracts.counters import COUNTER_MAX, Counters
from heteroflow.core.clock import Clock

# NVML return codes (nvml.h); the numbers are part of the C API and never change.
NOT_SUPPORTED: Final = 3
NO_PERMISSION: Final = 4
DRIVER_NOT_LOADED: Final = 9
TIMEOUT: Final = 10
LIBRARY_NOT_FOUND: Final = 12
GPU_IS_LOST: Final = 15
RESET_REQUIRED: Final = 16
UNKNOWN: Final = 999

MEMORY_ERROR_CORRECTED: Final = 0
MEMORY_ERROR_UNCORRECTED: Final = 1
AGGREGATE_ECC: Final = 1
MEMORY_LOCATION_DRAM: Final = 2
MEMORY_LOCATION_SRAM: Final = 7
RETIRED_MULTIPLE_SINGLE_BIT: Final = 0
RETIRED_DOUBLE_BIT: Final = 1
EVENT_XID_CRITICAL: Final = 0x8
TEMPERATURE_GPU: Final = 0
_MIB: Final = 1024 * 1024

_ERROR_NAMES: Final = {
    NOT_SUPPORTED: "not supported",
    NO_PERMISSION: "no permission",
    GPU_IS_LOST: "GPU is lost",
    RESET_REQUIRED: "GPU requires reset",
    UNKNOWN: "unknown error",
}

T = TypeVar("T")


class NvmlApi(Protocol):
    """The slice of ``pynvml`` the agent uses (the real module satisfies it; so does ``FakeNvml``)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetIndex(self, handle: Any) -> int: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetEccMode(self, handle: Any) -> Sequence[int]: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetMemoryErrorCounter(
        self, handle: Any, error_type: int, counter_type: int, location_type: int
    ) -> int: ...
    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> Sequence[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...


class NvmlUnavailableError(Exception):
    """NVML cannot be used here (no library, no driver): fall back to another collector."""


def load_pynvml() -> NvmlApi:
    """The real ``pynvml`` module, imported now (never at agent import time)."""
    try:
        module = importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailableError("nvidia-ml-py (pynvml) is not installed") from exc
    return cast(NvmlApi, module)


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def describe(exc: BaseException) -> str:
    code = error_code(exc)
    return _ERROR_NAMES.get(code, f"NVML error {code}") if code is not None else type(exc).__name__


@dataclass(slots=True)
class _Card:
    index: int
    handle: Any
    warnings: list[str]


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= COUNTER_MAX else None


class NvmlCollector:
    """Reads every NVIDIA GPU in-process through NVML; one call per value, each failure isolated."""

    name: CollectorName = "nvml"

    def __init__(self, *, clock: Clock, loader: Callable[[], NvmlApi] = load_pynvml) -> None:
        self._clock = clock
        self._loader = loader
        self._api: NvmlApi | None = None

    @property
    def api(self) -> NvmlApi | None:
        """The initialised library, once :meth:`available` succeeded (the XID watcher shares it)."""
        return self._api

    def available(self) -> tuple[bool, str]:
        if self._api is not None:
            return True, ""
        try:
            api = self._loader()
        except NvmlUnavailableError as exc:
            return False, f"NVML unavailable: {exc}; falling back"
        try:
            api.nvmlInit()
        except api.NVMLError as exc:
            return False, f"NVML unavailable: nvmlInit failed ({type(exc).__name__}); falling back"
        self._api = api
        return True, ""

    def _require(self) -> NvmlApi:
        if self._api is None:
            ok, why = self.available()
            if not ok or self._api is None:
                raise NvmlUnavailableError(why)
        return self._api

    def _call(self, card: _Card, what: str, fn: Callable[[], T]) -> T | None:
        api = self._require()
        try:
            return fn()
        except api.NVMLError as exc:
            code = error_code(exc)
            if code in (GPU_IS_LOST, RESET_REQUIRED):
                warning = f"NVML: GPU {card.index}: {describe(exc)}; its values are unknown"
                if warning not in card.warnings:
                    card.warnings.append(warning)
            elif code not in (NOT_SUPPORTED, NO_PERMISSION):
                card.warnings.append(f"NVML: GPU {card.index}: {what}: {describe(exc)}; unknown")
            return None

    def _cards(self, warnings: list[str]) -> list[_Card]:
        api = self._require()
        try:
            count = api.nvmlDeviceGetCount()
        except api.NVMLError as exc:
            warnings.append(f"NVML: nvmlDeviceGetCount failed ({describe(exc)})")
            return []
        cards: list[_Card] = []
        for index in range(count):
            card = _Card(index=index, handle=None, warnings=warnings)
            card.handle = self._call(card, "handle", functools.partial(api.nvmlDeviceGetHandleByIndex, index))
            cards.append(card)
        return cards

    def _identity(self, card: _Card) -> tuple[str | None, str]:
        api = self._require()
        if card.handle is None:
            return None, ""
        uuid = _text(self._call(card, "uuid", lambda: api.nvmlDeviceGetUUID(card.handle))) or None
        name = _text(self._call(card, "name", lambda: api.nvmlDeviceGetName(card.handle)))
        return uuid, name[:200]

    def _counters(self, card: _Card) -> tuple[Counters, tuple[tuple[str, int | None], ...]]:
        api = self._require()
        h = card.handle
        if h is None:
            return Counters(), ()
        mode = self._call(card, "ECC mode", lambda: api.nvmlDeviceGetEccMode(h))
        ecc_on = bool(mode) and mode is not None and int(mode[0]) == 1
        # ECC disabled reads as "not supported" from the driver; it is unknown, never "zero errors".
        unc = corr = sram_unc = sram_corr = None
        if ecc_on:
            # Turing and later split the counts by location: DRAM (HBM) is the memory the rules are about, on-die
            # SRAM is kept apart. Where the split is not supported, the total is the only figure there is.
            located = self._located_ecc(card, h)
            if located is not None:
                unc, corr, sram_unc, sram_corr = located
        if ecc_on and unc is None and corr is None:
            unc = _count(
                self._call(
                    card,
                    "uncorrected ECC",
                    lambda: api.nvmlDeviceGetTotalEccErrors(h, MEMORY_ERROR_UNCORRECTED, AGGREGATE_ECC),
                )
            )
            corr = _count(
                self._call(
                    card,
                    "corrected ECC",
                    lambda: api.nvmlDeviceGetTotalEccErrors(h, MEMORY_ERROR_CORRECTED, AGGREGATE_ECC),
                )
            )
        sbe = self._call(card, "retired pages", lambda: api.nvmlDeviceGetRetiredPages(h, RETIRED_MULTIPLE_SINGLE_BIT))
        dbe = self._call(card, "retired pages", lambda: api.nvmlDeviceGetRetiredPages(h, RETIRED_DOUBLE_BIT))
        retired = add_counts(
            len(sbe) if sbe is not None else None,
            len(dbe) if dbe is not None else None,
        )
        pending_retire = self._call(
            card, "retired pages pending", lambda: api.nvmlDeviceGetRetiredPagesPendingStatus(h)
        )
        remap = self._call(card, "remapped rows", lambda: api.nvmlDeviceGetRemappedRows(h))
        pending = failure = corr_rows = unc_rows = None
        if remap is not None and len(remap) == 4:
            corr_rows, unc_rows = _count(remap[0]), _count(remap[1])
            pending = 1 if remap[2] else 0
            failure = 1 if remap[3] else 0
        counters = Counters(
            ecc_uncorrected_total=unc,
            ecc_corrected_total=corr,
            retired_pages=retired,
            remapped_rows_pending=pending,
            remapped_rows_failure=failure,
            remapped_rows_correctable=corr_rows,
            remapped_rows_uncorrectable=unc_rows,
            ecc_sram_uncorrected_total=sram_unc,
            ecc_sram_corrected_total=sram_corr,
        )
        extras = (("retired_pages_pending", None if pending_retire is None else (1 if pending_retire else 0)),)
        return counters, extras

    def _located_ecc(self, card: _Card, h: Any) -> tuple[int | None, int | None, int | None, int | None] | None:
        """DRAM and SRAM ECC counts (uncorrected, corrected each), or ``None`` when the driver has no DRAM split."""
        api = self._require()

        def read(error_type: int, location: int) -> int | None:
            return _count(
                self._call(
                    card,
                    "ECC by location",
                    lambda: api.nvmlDeviceGetMemoryErrorCounter(h, error_type, AGGREGATE_ECC, location),
                )
            )

        dram_unc = read(MEMORY_ERROR_UNCORRECTED, MEMORY_LOCATION_DRAM)
        dram_corr = read(MEMORY_ERROR_CORRECTED, MEMORY_LOCATION_DRAM)
        if dram_unc is None and dram_corr is None:
            return None
        sram_unc = read(MEMORY_ERROR_UNCORRECTED, MEMORY_LOCATION_SRAM)
        sram_corr = read(MEMORY_ERROR_CORRECTED, MEMORY_LOCATION_SRAM)
        return dram_unc, dram_corr, sram_unc, sram_corr

    def read_health(self) -> HealthCollection:
        now = self._clock.now()
        warnings: list[str] = []
        try:
            cards = self._cards(warnings)
        except NvmlUnavailableError as exc:
            return HealthCollection(collector="nvml", collected_at=now, warnings=(str(exc),))
        gpus: list[GpuHealth] = []
        for card in cards:
            uuid, name = self._identity(card)
            counters, extras = self._counters(card)
            gpus.append(
                GpuHealth(index=card.index, vendor="NVIDIA", uuid=uuid, name=name, counters=counters, extras=extras)
            )
        return HealthCollection(collector="nvml", collected_at=now, gpus=tuple(gpus), warnings=tuple(warnings))

    def _telemetry(self, card: _Card) -> GpuTelemetry:
        api = self._require()
        h = card.handle
        uuid, name = self._identity(card)
        if h is None:
            return GpuTelemetry(index=card.index)
        temp = self._call(card, "temperature", lambda: api.nvmlDeviceGetTemperature(h, TEMPERATURE_GPU))
        util = self._call(card, "utilisation", lambda: api.nvmlDeviceGetUtilizationRates(h))
        memory = self._call(card, "memory", lambda: api.nvmlDeviceGetMemoryInfo(h))
        power = self._call(card, "power", lambda: api.nvmlDeviceGetPowerUsage(h))
        return GpuTelemetry(
            index=card.index,
            uuid=uuid,
            name=name,
            temperature_c=_number(temp),
            utilization_pct=_number(getattr(util, "gpu", None)),
            memory_used_mib=_mib(getattr(memory, "used", None)),
            memory_total_mib=_mib(getattr(memory, "total", None)),
            power_w=_milli(power),
        )

    def read_telemetry(self) -> TelemetryCollection:
        now = self._clock.now()
        warnings: list[str] = []
        try:
            cards = self._cards(warnings)
        except NvmlUnavailableError as exc:
            return TelemetryCollection(collector="nvml", collected_at=now, warnings=(str(exc),))
        gpus = tuple(self._telemetry(card) for card in cards)
        return TelemetryCollection(collector="nvml", collected_at=now, gpus=gpus, warnings=tuple(warnings))

    def card_map(self) -> CardMap:
        """Each card's PCI address (``nvmlDeviceGetPciInfo(h).busId``) → (index, uuid), for the kernel log's XIDs."""
        api = self._api
        if api is None:
            return {}
        return nvml_card_map(api)

    def close(self) -> None:
        if self._api is not None:
            api, self._api = self._api, None
            with contextlib.suppress(api.NVMLError):
                api.nvmlShutdown()


def nvml_card_map(api: NvmlApi) -> CardMap:
    """PCI address → (index, uuid) of every card NVML can name; a card whose call fails is left out."""
    cards: CardMap = {}
    try:
        count = api.nvmlDeviceGetCount()
    except api.NVMLError:
        return cards
    for index in range(count):
        try:
            handle = api.nvmlDeviceGetHandleByIndex(index)
            info = api.nvmlDeviceGetPciInfo(handle)
        except api.NVMLError:
            continue
        address = parse_bus_id(getattr(info, "busId", None))
        if address is None:
            continue
        try:
            uuid = _text(api.nvmlDeviceGetUUID(handle)) or None
        except api.NVMLError:
            uuid = None
        cards[address] = (index, uuid)
    return cards


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= 0 else None


def _milli(value: object) -> float | None:
    number = _number(value)
    return number / 1000.0 if number is not None else None


def _mib(value: object) -> float | None:
    number = _number(value)
    return number / _MIB if number is not None else None


class XidWatcher:
    """Waits for NVML XID critical-error events (H-15) and hands each one to ``sink``.

    :meth:`poll` waits at most ``timeout_ms`` for one event, so the loop that calls it stays responsive to
    shutdown; NVML's timeout (``NVMLError_Timeout``) just means nothing happened. Any other error of the wait
    is counted and backed off (:meth:`retry_delay_sec`, doubling to 30 s): the error that matters most —
    GPU_IS_LOST, exactly when a card falls off the bus — is persistent, and retrying at once would spin a
    core. A lost card is found by asking each watched card for its uuid, reported (:meth:`status`) and left
    out of a new event set, so the other cards' XIDs are still read. Warnings are kept bounded and distinct.
    """

    MAX_WARNINGS: Final = 32
    RETRY_INITIAL_SEC: Final = 0.5
    RETRY_MAX_SEC: Final = 30.0

    def __init__(self, *, api: NvmlApi, clock: Clock) -> None:
        self._api = api
        self._clock = clock
        self._set: Any = None
        self._lock = threading.Lock()
        self._warnings: collections.deque[str] = collections.deque(maxlen=self.MAX_WARNINGS)
        self._watched: dict[int, Any] = {}
        self._unwatched: dict[int, str] = {}
        self._lost: set[int] = set()
        self._wait_error: str | None = None
        self._consecutive = 0
        self._failures = 0
        self._started = False

    @property
    def warnings(self) -> list[str]:
        """The distinct recent warnings (at most :attr:`MAX_WARNINGS`)."""
        with self._lock:
            return list(self._warnings)

    def _warn(self, message: str) -> None:
        with self._lock:
            if message not in self._warnings:
                self._warnings.append(message)

    def status(self) -> XidCollectionStatus:
        with self._lock:
            if not self._started:
                return not_collected("the XID watcher has not started")
            return watcher_status(
                watched=tuple(sorted(self._watched)),
                unwatched=tuple(sorted(self._unwatched.items())),
                lost=tuple(sorted(self._lost)),
                wait_error=self._wait_error,
                wait_failures_total=self._failures,
            )

    def start(self) -> bool:
        """Register every GPU for XID events; ``False`` (with warnings) when none could be."""
        api = self._api
        self._started = True
        try:
            self._set = api.nvmlEventSetCreate()
            count = api.nvmlDeviceGetCount()
        except api.NVMLError as exc:
            with self._lock:
                self._wait_error = f"XID events unavailable ({describe(exc)})"
            self._warn(f"NVML: XID events unavailable ({describe(exc)})")
            return False
        for index in range(count):
            try:
                handle = api.nvmlDeviceGetHandleByIndex(index)
                api.nvmlDeviceRegisterEvents(handle, EVENT_XID_CRITICAL, self._set)
            except api.NVMLError as exc:
                with self._lock:
                    self._unwatched[index] = describe(exc)
                    if error_code(exc) == GPU_IS_LOST:
                        self._lost.add(index)
                self._warn(f"NVML: GPU {index}: XID events not registered ({describe(exc)})")
                continue
            with self._lock:
                self._watched[index] = handle
        return bool(self._watched)

    def retry_delay_sec(self) -> float:
        """Seconds to wait before the next poll: 0 after a good wait, a doubling backoff after failed ones."""
        return backoff_delay(self._consecutive, initial_sec=self.RETRY_INITIAL_SEC, max_sec=self.RETRY_MAX_SEC)

    def poll(self, timeout_ms: int) -> XidEvent | None:
        api = self._api
        try:
            data = api.nvmlEventSetWait(self._set, timeout_ms)
        except api.NVMLError as exc:
            if error_code(exc) == TIMEOUT:
                self._waited_well()
            else:
                self._wait_failed(exc)
            return None
        self._waited_well()
        xid = _count(getattr(data, "eventData", None))
        if xid is None or xid > 2**31 - 1:
            return None
        handle = getattr(data, "device", None)
        try:
            index = int(api.nvmlDeviceGetIndex(handle))
        except api.NVMLError:
            return None
        try:
            uuid = _text(api.nvmlDeviceGetUUID(handle)) or None
        except api.NVMLError:
            uuid = None
        return XidEvent(index=index, uuid=uuid, xid=xid, occurred_at=self._clock.now())

    def _waited_well(self) -> None:
        self._consecutive = 0
        with self._lock:
            self._wait_error = None

    def _wait_failed(self, exc: BaseException) -> None:
        self._consecutive += 1
        with self._lock:
            self._failures += 1
            self._wait_error = describe(exc)
        self._warn(f"NVML: waiting for XID events failed ({describe(exc)})")
        if error_code(exc) in (GPU_IS_LOST, RESET_REQUIRED):
            self._drop_lost_cards()

    def _drop_lost_cards(self) -> None:
        """Find the cards that answer GPU_IS_LOST, report them, and watch the others in a new event set."""
        api = self._api
        lost: list[int] = []
        for index, handle in list(self._watched.items()):
            try:
                api.nvmlDeviceGetUUID(handle)
            except api.NVMLError as exc:
                if error_code(exc) in (GPU_IS_LOST, RESET_REQUIRED):
                    lost.append(index)
        if not lost:
            return
        with self._lock:
            self._lost.update(lost)
            for index in lost:
                self._watched.pop(index, None)
            remaining = dict(self._watched)
        for index in lost:
            self._warn(f"NVML: GPU {index}: lost; its XID events are no longer read")
        old, self._set = self._set, None
        with contextlib.suppress(api.NVMLError):
            api.nvmlEventSetFree(old)
        try:
            self._set = api.nvmlEventSetCreate()
        except api.NVMLError as exc:
            self._warn(f"NVML: XID events unavailable ({describe(exc)})")
            return
        for index, handle in remaining.items():
            try:
                api.nvmlDeviceRegisterEvents(handle, EVENT_XID_CRITICAL, self._set)
            except api.NVMLError as exc:
                with self._lock:
                    self._watched.pop(index, None)
                    self._unwatched[index] = describe(exc)
                self._warn(f"NVML: GPU {index}: XID events not registered ({describe(exc)})")

    def close(self) -> None:
        if self._set is not None:
            event_set, self._set = self._set, None
            with contextlib.suppress(self._api.NVMLError):
                self._api.nvmlEventSetFree(event_set)
