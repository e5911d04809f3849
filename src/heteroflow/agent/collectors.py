"""The collector interface and how the agent picks one (H-10, H-12).

NVIDIA: NVML in-process where the library loads, else nvidia-smi. Kunlunxin: xpu-smi (banner-checked).
Cambricon: cnmon. Other vendors are not collected, and ``agent probe`` says so. ``auto`` takes the first
collector, in that order, that is available and sees at least one card; every collector it passed over
leaves a warning explaining why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from heteroflow.agent.cnmon import CnmonCollector
from heteroflow.agent.commands import CommandRunner
from heteroflow.agent.nvidia_smi import NvidiaSmiCollector
from heteroflow.agent.nvml import NvmlApi, NvmlCollector, load_pynvml
from heteroflow.agent.readings import CollectorName, HealthCollection, TelemetryCollection
from heteroflow.agent.xpu_smi import XpuSmiCollector
from heteroflow.core.clock import Clock

VendorCollector = Literal["nvml", "nvidia-smi", "xpu-smi", "cnmon"]
CollectorChoice = Literal["auto", "nvml", "nvidia-smi", "xpu-smi", "cnmon"]
CHOICES: tuple[CollectorChoice, ...] = ("auto", "nvml", "nvidia-smi", "xpu-smi", "cnmon")
AUTO_ORDER: tuple[VendorCollector, ...] = ("nvml", "nvidia-smi", "xpu-smi", "cnmon")
NOT_COLLECTED_NOTE = "other vendors (MetaX, Enflame, Iluvatar, Biren, Hygon, Moore Threads, Ascend) are not collected"


class Collector(Protocol):
    """Reads one vendor's cards. Each read starts at most one process (or NVML calls) and never raises."""

    @property
    def name(self) -> CollectorName: ...

    def available(self) -> tuple[bool, str]:
        """Whether the collector can run here, and if not, the warning that says why."""
        ...

    def read_health(self) -> HealthCollection:
        """The five counters of every card (every 60 s by default)."""
        ...

    def read_telemetry(self) -> TelemetryCollection:
        """Temperature, utilisation, memory and power of every card (every heartbeat)."""
        ...

    def close(self) -> None: ...


class NoCollector:
    """Stands in when nothing can be collected: no cards, and the warnings that explain why."""

    name: CollectorName = "none"

    def __init__(self, *, clock: Clock, warnings: tuple[str, ...]) -> None:
        self._clock = clock
        self.warnings = warnings

    def available(self) -> tuple[bool, str]:
        return False, "; ".join(self.warnings)

    def read_health(self) -> HealthCollection:
        return HealthCollection(collector="none", collected_at=self._clock.now(), warnings=self.warnings)

    def read_telemetry(self) -> TelemetryCollection:
        return TelemetryCollection(collector="none", collected_at=self._clock.now(), warnings=self.warnings)

    def close(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Selection:
    collector: Collector
    first_health: HealthCollection | None
    """The collection that proved the collector sees cards (reused as the first tick)."""
    warnings: tuple[str, ...]


def build_collector(
    choice: VendorCollector,
    *,
    runner: CommandRunner,
    clock: Clock,
    timeout_sec: float,
    nvml_loader: Callable[[], NvmlApi] = load_pynvml,
) -> Collector:
    if choice == "nvml":
        return NvmlCollector(clock=clock, loader=nvml_loader)
    if choice == "nvidia-smi":
        return NvidiaSmiCollector(runner=runner, clock=clock, timeout_sec=timeout_sec)
    if choice == "xpu-smi":
        return XpuSmiCollector(runner=runner, clock=clock, timeout_sec=timeout_sec)
    return CnmonCollector(runner=runner, clock=clock, timeout_sec=timeout_sec)


def select_collector(
    choice: CollectorChoice,
    *,
    runner: CommandRunner,
    clock: Clock,
    timeout_sec: float,
    nvml_loader: Callable[[], NvmlApi] = load_pynvml,
) -> Selection:
    """The collector to use, or :class:`NoCollector` with every reason, never an exception.

    An explicit choice is used as long as it is available (even when it sees no card, so that
    ``probe --collector X`` shows what X sees). ``auto`` tries :data:`AUTO_ORDER`.
    """
    order: tuple[VendorCollector, ...] = AUTO_ORDER if choice == "auto" else (choice,)
    warnings: list[str] = []
    for name in order:
        collector = build_collector(name, runner=runner, clock=clock, timeout_sec=timeout_sec, nvml_loader=nvml_loader)
        ok, why = collector.available()
        if not ok:
            warnings.append(why)
            collector.close()
            continue
        health = collector.read_health()
        if health.gpus or choice != "auto":
            return Selection(collector=collector, first_health=health, warnings=tuple(warnings))
        warnings.append(f"{name} found no cards" + (f" ({'; '.join(health.warnings)})" if health.warnings else ""))
        collector.close()
    if choice == "auto":
        warnings.append(NOT_COLLECTED_NOTE)
    return Selection(
        collector=NoCollector(clock=clock, warnings=tuple(warnings)),
        first_health=None,
        warnings=tuple(warnings),
    )
