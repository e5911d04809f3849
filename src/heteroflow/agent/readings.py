"""What collectors return: frozen per-GPU values, one collection at a time.

A collection is split in two because the two halves move at different speeds (H-10): telemetry
(temperature, utilisation, memory, power) rides every 5 s heartbeat, health counters are read every 60 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from heteroflow.contracts.counters import Counters

CollectorName = Literal["nvml", "nvidia-smi", "xpu-smi", "cnmon", "simulated", "none"]
"""Which collector produced a collection (shown by ``agent probe``)."""

Vendor = Literal["NVIDIA", "Kunlunxin", "Cambricon", "simulated"]


@dataclass(frozen=True, slots=True)
class VendorTable:
    """What a vendor tool's table showed: per-card health and telemetry, and why anything is unknown."""

    health: tuple[GpuHealth, ...]
    telemetry: tuple[GpuTelemetry, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GpuTelemetry:
    """The fast-moving values of one GPU; ``None`` = not read this time."""

    index: int
    uuid: str | None = None
    name: str = ""
    temperature_c: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """The five counters of one GPU as read by one health tick (``None`` = unknown, H-1)."""

    index: int
    vendor: Vendor
    uuid: str | None = None
    name: str = ""
    counters: Counters = field(default_factory=Counters)
    semantics_unconfirmed: tuple[str, ...] = ()
    """Keys whose meaning the vendor has not confirmed (cnmon ``Ecc-Error``, H-12)."""
    extras: tuple[tuple[str, int | None], ...] = ()
    """Vendor values beyond the five keys, shown by ``agent probe`` but not sent (e.g. retired pages
    pending, remapped row counts)."""


@dataclass(frozen=True, slots=True)
class TelemetryCollection:
    collector: CollectorName
    collected_at: datetime
    gpus: tuple[GpuTelemetry, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HealthCollection:
    collector: CollectorName
    collected_at: datetime
    """The agent's collection time of the readings; sent as each stat's ``sampled_at`` (H-14)."""
    gpus: tuple[GpuHealth, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One NVIDIA XID error reported by NVML (H-15)."""

    index: int
    uuid: str | None
    xid: int
    occurred_at: datetime
