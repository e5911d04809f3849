"""Simulated cards, so a local platform has live data without hardware (H-17, H-70 profile names).

This is the minimal profile set. Every value is a pure function of the simulated time since start (wall time x
``speed``), the card index and a seed, so two runs with the same inputs report the same counters.
"""

from __future__ import annotations

import random
import uuid as uuidlib
from collections.abc import Sequence
from datetime import datetime
from typing import Final, Literal

from heteroflow.agent.readings import (
    CollectorName,
    GpuHealth,
    GpuTelemetry,
    HealthCollection,
    TelemetryCollection,
)
from heteroflow.contracts.counters import Counters
from heteroflow.core.clock import Clock

Profile = Literal["healthy", "degrading", "sudden_ue", "remap_pending", "remap_failure"]
PROFILES: Final[tuple[Profile, ...]] = ("healthy", "degrading", "sudden_ue", "remap_pending", "remap_failure")
MODEL: Final = "Simulated H100 80GB"
CARD_FAULT_PROFILES: Final[frozenset[Profile]] = frozenset({"sudden_ue", "remap_failure"})
"""Profiles whose counters grow into a card fault (an uncorrectable ECC error, a row-remap failure): what the
platform's hardware-event feed reports and the controller's GPU-health source takes as L5 / L6."""


def simulated_counters(profile: Profile, hours: float) -> Counters:
    """The five counters of a card of ``profile`` after ``hours`` of simulated time. Pure."""
    hours = max(hours, 0.0)
    if profile == "degrading":
        # Accelerating corrected errors: the trend rule's target shape (Δ24h grows window over window).
        return Counters(0, int(2 * hours + 0.05 * hours * hours), 0, 0, 0)
    if profile == "sudden_ue":
        return Counters(1 if hours >= 2 else 0, int(hours / 4), 0, 0, 0)
    if profile == "remap_pending":
        return Counters(0, int(hours), 0, 1 if hours >= 1 else 0, 0)
    if profile == "remap_failure":
        return Counters(0, int(hours), 0, 1 if hours >= 1 else 0, 1 if hours >= 3 else 0)
    return Counters(0, 0, 0, 0, 0)


class SimulatedCollector:
    """``count`` cards cycling through ``profiles``; vendor ``simulated``, uuids derived from ``seed``."""

    name: CollectorName = "simulated"

    def __init__(
        self,
        *,
        clock: Clock,
        count: int,
        seed: str,
        speed: float = 60.0,
        profiles: Sequence[Profile] = PROFILES,
        started_at: datetime | None = None,
    ) -> None:
        if count < 0 or not profiles:
            raise ValueError("a simulation needs a card count >= 0 and at least one profile")
        self._clock = clock
        self._count = count
        self._seed = seed
        self._speed = speed
        self._profiles = tuple(profiles)
        self._started_at = started_at or clock.now()

    def available(self) -> tuple[bool, str]:
        return True, ""

    def profile_of(self, index: int) -> Profile:
        return self._profiles[index % len(self._profiles)]

    def uuid_of(self, index: int) -> str:
        return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'heteroflow-sim/{self._seed}/{index}')}"

    def _hours(self) -> float:
        return (self._clock.now() - self._started_at).total_seconds() * self._speed / 3600.0

    def read_health(self) -> HealthCollection:
        hours = self._hours()
        gpus = tuple(
            GpuHealth(
                index=i,
                vendor="simulated",
                uuid=self.uuid_of(i),
                name=MODEL,
                counters=simulated_counters(self.profile_of(i), hours),
            )
            for i in range(self._count)
        )
        return HealthCollection(collector="simulated", collected_at=self._clock.now(), gpus=gpus)

    def read_telemetry(self) -> TelemetryCollection:
        tick = int(self._clock.monotonic())
        gpus: list[GpuTelemetry] = []
        for i in range(self._count):
            rng = random.Random(f"{self._seed}/{i}/{tick}")
            gpus.append(
                GpuTelemetry(
                    index=i,
                    uuid=self.uuid_of(i),
                    name=MODEL,
                    temperature_c=float(rng.randint(35, 75)),
                    utilization_pct=float(rng.randint(0, 100)),
                    memory_used_mib=float(rng.randint(0, 81559)),
                    memory_total_mib=81559.0,
                    power_w=round(rng.uniform(70, 700), 2),
                )
            )
        return TelemetryCollection(collector="simulated", collected_at=self._clock.now(), gpus=tuple(gpus))

    def close(self) -> None:
        return None
