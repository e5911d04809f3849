"""Cambricon ``cnmon``: the ``Ecc-Error`` column, located by its header label (H-12).

Two header layouts exist (CNMON ≤1.x with ``Inited Driver``/``vMemory-Usage``; v4-v5 with ``Bus-Id`` /
``Mode Compute-Mode``), so the column is found by label, never by position. ``N/A`` is unknown.

The vendor has not said whether ``Ecc-Error`` counts correctable errors, uncorrectable errors or both.
Following the spec's decision (H-12) the value is stored as ``ecc_uncorrected_total`` and every reading
carries ``semantics_unconfirmed`` for that key, shown by ``agent probe`` and documented in docs/agent.md.
"""

from __future__ import annotations

import re
from typing import Final

from heteroflow.agent.commands import CommandError, CommandRunner
from heteroflow.agent.parsing import parse_count, parse_measure, search_measure
from heteroflow.agent.readings import (
    CollectorName,
    GpuHealth,
    GpuTelemetry,
    HealthCollection,
    TelemetryCollection,
    VendorTable,
)
from heteroflow.agent.tables import banner_line, cells, device_head, find_box_table, locate, value_at
from heteroflow.contracts.counters import Counters
from heteroflow.core.clock import Clock

TOOL: Final = "cnmon"
UNCONFIRMED: Final = ("ecc_uncorrected_total",)
_BANNER = re.compile(r"\bCNMON\s+v?\d", re.IGNORECASE)
_TEMP = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?C\b")
_POWER = re.compile(r"(\d+(?:\.\d+)?)\s*W\s*/")
_MEMORY_USED = re.compile(r"(\d+(?:\.\d+)?)\s*MiB\s*/")
_MEMORY_TOTAL = re.compile(r"/\s*(\d+(?:\.\d+)?)\s*MiB")


def parse_cnmon(text: str) -> VendorTable | None:
    """The cards of a ``cnmon`` default table; ``None`` when there is no CNMON banner."""
    lines = text.splitlines()
    banner = banner_line(lines, _BANNER)
    if banner is None:
        return None
    table = find_box_table(lines, start=banner + 1)
    if table is None:
        return VendorTable(health=(), telemetry=(), warnings=("cnmon: no device table found",))
    ecc_ref = locate(table.header, "Ecc-Error")
    util_ref = locate(table.header, "Util")
    warnings: list[str] = []
    if ecc_ref is None:
        warnings.append("cnmon has no 'Ecc-Error' column; ECC unknown")
    health: list[GpuHealth] = []
    telemetry: list[GpuTelemetry] = []
    for block in table.devices:
        head = device_head(block)
        if head is None:
            continue
        index, words = head
        # "Card VF Name Firmware": VF is "/" or a number on v4-v5; older layouts have no VF column.
        rest = words
        if rest and (rest[0] == "/" or rest[0].isdigit()):
            rest = rest[1:]
        name = rest[0] if rest else ""
        ecc = parse_count(value_at(block, ecc_ref)) if ecc_ref is not None else None
        health.append(
            GpuHealth(
                index=index,
                vendor="Cambricon",
                uuid=None,
                name=name[:200],
                counters=Counters(ecc_uncorrected_total=ecc),
                semantics_unconfirmed=UNCONFIRMED,
            )
        )
        second = block[1] if len(block) > 1 else ""
        util = value_at(block, util_ref) if util_ref is not None else None
        telemetry.append(
            GpuTelemetry(
                index=index,
                name=name[:200],
                temperature_c=search_measure(_TEMP, cells(second)[0]),
                power_w=search_measure(_POWER, second),
                memory_used_mib=search_measure(_MEMORY_USED, second),
                memory_total_mib=search_measure(_MEMORY_TOTAL, second),
                utilization_pct=parse_measure(util),
            )
        )
    return VendorTable(health=tuple(health), telemetry=tuple(telemetry), warnings=tuple(warnings))


class CnmonCollector:
    """One ``cnmon`` call per tick covers every Cambricon card."""

    name: CollectorName = "cnmon"

    def __init__(self, *, runner: CommandRunner, clock: Clock, timeout_sec: float = 10.0) -> None:
        self._runner = runner
        self._clock = clock
        self._timeout_s = timeout_sec

    def available(self) -> tuple[bool, str]:
        if self._runner.which(TOOL) is None:
            return False, "cnmon is not installed (not found on PATH); Cambricon cards are not collected"
        return True, ""

    def _read(self) -> VendorTable:
        try:
            result = self._runner.run([TOOL], timeout_sec=self._timeout_s)
        except CommandError as exc:
            return VendorTable(health=(), telemetry=(), warnings=(str(exc),))
        table = parse_cnmon(result.stdout)
        if table is None:
            return VendorTable(health=(), telemetry=(), warnings=("cnmon printed no CNMON banner; not collected",))
        return table

    def read_health(self) -> HealthCollection:
        now = self._clock.now()
        table = self._read()
        return HealthCollection(collector="cnmon", collected_at=now, gpus=table.health, warnings=table.warnings)

    def read_telemetry(self) -> TelemetryCollection:
        now = self._clock.now()
        table = self._read()
        return TelemetryCollection(collector="cnmon", collected_at=now, gpus=table.telemetry, warnings=table.warnings)

    def close(self) -> None:
        return None
