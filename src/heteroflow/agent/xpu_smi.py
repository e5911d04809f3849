"""Kunlunxin ``xpu-smi``: the default table's ``Volatile Uncorr. ECC`` column (H-12).

The vendor is recognised by the banner (``XPU-SMI … Driver Version … XPU-RT Version``), never by the
binary name: Intel ships an unrelated tool called ``xpu-smi`` too. Only the third generation prints the
ECC column; where it is absent the key stays unknown. The column is *volatile* (reset with the driver), so
a decrease after a reload is expected and stored as read (H-3). No retired-page or remap data exists.

Where ``xpu-smi -q`` works (``xpu_query.py``), its card UUID and *aggregate* DRAM ECC counts replace the table's
volatile count: card swaps become visible and the corrected count makes trend prediction possible. A failing or
unrecognised ``-q`` leaves the table's values, with a warning, and is not retried for 30 minutes.
"""

from __future__ import annotations

import re
from dataclasses import replace
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
from heteroflow.agent.xpu_query import XpuQueryCard, bus_id_in, parse_xpu_query
from heteroflow.contracts.counters import Counters
from heteroflow.core.clock import Clock

TOOL: Final = "xpu-smi"
QUERY_RETRY_SEC: Final = 1800.0
_BANNER = re.compile(r"XPU-SMI\b.*Driver Version", re.IGNORECASE)
_TEMP = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)C\b")
_POWER = re.compile(r"(\d+(?:\.\d+)?)\s*W\s*/")
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*MiB\s*/\s*(\d+(?:\.\d+)?)\s*MiB")
_UTIL = re.compile(r"(\d+(?:\.\d+)?)\s*%")


def parse_xpu_smi(text: str) -> VendorTable | None:
    """The cards of an ``xpu-smi`` default table; ``None`` when the banner is not Kunlunxin's."""
    lines = text.splitlines()
    banner = banner_line(lines, _BANNER)
    if banner is None:
        return None
    table = find_box_table(lines, start=banner + 1)
    if table is None:
        return VendorTable(health=(), telemetry=(), warnings=("xpu-smi: no device table found",))
    ecc_ref = locate(table.header, "Volatile Uncorr. ECC")
    warnings: list[str] = []
    if ecc_ref is None:
        warnings.append("xpu-smi has no 'Volatile Uncorr. ECC' column (first/second generation); ECC unknown")
    health: list[GpuHealth] = []
    telemetry: list[GpuTelemetry] = []
    for block in table.devices:
        head = device_head(block)
        if head is None:
            continue
        index, words = head
        # "XPU  Name  Persistence-M": the name sits between the index and the persistence mode.
        name = " ".join(words[:-1]) if len(words) > 1 else " ".join(words)
        ecc = parse_count(value_at(block, ecc_ref)) if ecc_ref is not None else None
        health.append(
            GpuHealth(
                index=index,
                vendor="Kunlunxin",
                uuid=None,
                name=name[:200],
                counters=Counters(ecc_uncorrected_total=ecc),
            )
        )
        second = block[1] if len(block) > 1 else ""
        memory = _MEMORY.search(second)
        util_cells = cells(second)
        telemetry.append(
            GpuTelemetry(
                index=index,
                name=name[:200],
                temperature_c=search_measure(_TEMP, second),
                power_w=search_measure(_POWER, second),
                memory_used_mib=parse_measure(memory.group(1)) if memory else None,
                memory_total_mib=parse_measure(memory.group(2)) if memory else None,
                utilization_pct=search_measure(_UTIL, util_cells[-1]) if len(util_cells) > 2 else None,
            )
        )
    return VendorTable(health=tuple(health), telemetry=tuple(telemetry), warnings=tuple(warnings))


def table_bus_ids(text: str) -> dict[int, str]:
    """The PCI bus id of each card of the default table (its ``Bus-Id`` column), by declared index."""
    lines = text.splitlines()
    banner = banner_line(lines, _BANNER)
    table = find_box_table(lines, start=banner + 1) if banner is not None else None
    found: dict[int, str] = {}
    for block in table.devices if table is not None else ():
        head = device_head(block)
        bus = bus_id_in(block[0]) if head is not None and block else None
        if head is not None and bus is not None:
            found[head[0]] = bus
    return found


def with_query(
    health: tuple[GpuHealth, ...], *, bus_ids: dict[int, str], cards: list[XpuQueryCard]
) -> tuple[tuple[GpuHealth, ...], list[str]]:
    """The table's cards with the uuid and aggregate DRAM ECC counts of ``xpu-smi -q`` where a card matches."""
    by_bus = {card.bus_id: card for card in cards}
    by_minor = {card.minor: card for card in cards if card.minor is not None}
    merged: list[GpuHealth] = []
    unmatched = 0
    for gpu in health:
        bus = bus_ids.get(gpu.index)
        card = by_bus.get(bus) if bus is not None else None
        card = card or by_minor.get(gpu.index)
        if card is None:
            unmatched += 1
            merged.append(gpu)
            continue
        merged.append(
            replace(
                gpu,
                uuid=card.uuid,
                counters=replace(
                    gpu.counters,
                    ecc_uncorrected_total=card.dram_uncorrected,
                    ecc_corrected_total=card.dram_corrected,
                ),
            )
        )
    warnings = (
        [f"xpu-smi -q lists no card for {unmatched} table row(s); their values are the table's"] if unmatched else []
    )
    return tuple(merged), warnings


class XpuSmiCollector:
    """One ``xpu-smi`` call per tick covers every Kunlunxin card."""

    name: CollectorName = "xpu-smi"

    def __init__(self, *, runner: CommandRunner, clock: Clock, timeout_sec: float = 10.0) -> None:
        self._runner = runner
        self._clock = clock
        self._timeout_s = timeout_sec
        self._query_failed_at: float | None = None

    def available(self) -> tuple[bool, str]:
        if self._runner.which(TOOL) is None:
            return False, "xpu-smi is not installed (not found on PATH); Kunlunxin cards are not collected"
        return True, ""

    def _read(self) -> VendorTable:
        return self._read_text()[0]

    def _read_text(self) -> tuple[VendorTable, str]:
        try:
            result = self._runner.run([TOOL], timeout_sec=self._timeout_s)
        except CommandError as exc:
            return VendorTable(health=(), telemetry=(), warnings=(str(exc),)), ""
        table = parse_xpu_smi(result.stdout)
        if table is None:
            return (
                VendorTable(
                    health=(),
                    telemetry=(),
                    warnings=("xpu-smi on PATH is not Kunlunxin's (no XPU-SMI banner; Intel's tool?); not collected",),
                ),
                result.stdout,
            )
        return table, result.stdout

    def read_health(self) -> HealthCollection:
        now = self._clock.now()
        table, text = self._read_text()
        gpus, warnings = table.health, list(table.warnings)
        if gpus:
            cards, why = self._query()
            if cards is not None:
                gpus, merge_warnings = with_query(gpus, bus_ids=table_bus_ids(text), cards=cards)
                warnings += merge_warnings
            elif why is not None:
                warnings.append(why)
        return HealthCollection(collector="xpu-smi", collected_at=now, gpus=gpus, warnings=tuple(warnings))

    def _query(self) -> tuple[list[XpuQueryCard] | None, str | None]:
        """The cards of ``xpu-smi -q``, or ``None`` and why not (once per failure; retried after 30 minutes)."""
        mono = self._clock.monotonic()
        if self._query_failed_at is not None and mono - self._query_failed_at < QUERY_RETRY_SEC:
            return None, None
        try:
            result = self._runner.run([TOOL, "-q"], timeout_sec=self._timeout_s)
        except CommandError as exc:
            self._query_failed_at = mono
            return None, f"xpu-smi -q failed ({exc}); uuid unknown, ECC from the table's volatile column"
        cards = parse_xpu_query(result.stdout) if result.returncode == 0 else None
        if not cards:
            self._query_failed_at = mono
            why = f"xpu-smi -q gave no card (exit {result.returncode})"
            return None, f"{why}; uuid unknown, ECC from the table's volatile column"
        return cards, None

    def read_telemetry(self) -> TelemetryCollection:
        now = self._clock.now()
        table = self._read()
        return TelemetryCollection(collector="xpu-smi", collected_at=now, gpus=table.telemetry, warnings=table.warnings)

    def close(self) -> None:
        return None
