"""Kunlunxin ``xpu-smi -q`` (query mode): card UUID and aggregate DRAM ECC counts. Pure; never raises.

The default table (``xpu_smi.py``) gives only a *volatile* uncorrectable count and no card identity. Query mode
prints, per card, ``XPU UUID`` and ``ECC Errors`` → ``Aggregate`` → ``DRAM Correctable`` / ``DRAM Uncorrectable``
(P800, drivers 5.x). Where it is present the agent uses it: the uuid makes card swaps visible, and the aggregate
correctable count makes corrected-ECC trend prediction possible on Kunlunxin too. Cards are matched with the
table's rows by PCI bus id (both outputs print it), else by ``Minor Number`` = the table's index.

Verified against one public capture of this output only (a copy in a utility module's docstring, P800 PCIe,
driver 5.0.21.26); the layout is read by indentation and labels, never by line numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from heteroflow.agent.parsing import parse_count

_HEADER: Final = re.compile(r"XPUSMI LOG|Attached XPUs", re.IGNORECASE)
_CARD: Final = re.compile(r"^XPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KEY_VALUE: Final = re.compile(r"^(.+?)\s*:\s*(.*)$")
_BUS_ID: Final = re.compile(r"\b([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\b")
MAX_UUID: Final = 128


@dataclass(frozen=True, slots=True)
class XpuQueryCard:
    """One card of ``xpu-smi -q``; ``None`` = not printed or unreadable (unknown, never 0)."""

    bus_id: str
    minor: int | None
    uuid: str | None
    dram_corrected: int | None
    dram_uncorrected: int | None


def normal_bus_id(value: str) -> str:
    """A PCI bus id with an 8-digit domain, upper case (the table prints ``00000000:03:00.0``)."""
    domain, rest = value.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def bus_id_in(text: str) -> str | None:
    match = _BUS_ID.search(text)
    return normal_bus_id(match.group(1)) if match else None


def parse_xpu_query(text: str) -> list[XpuQueryCard] | None:
    """The cards of an ``xpu-smi -q`` output, or ``None`` when the text is not one."""
    lines = text.splitlines()
    if not any(_HEADER.search(line) for line in lines):
        return None
    cards: list[XpuQueryCard] = []
    current: dict[str, str] | None = None
    bus: str | None = None
    card_indent = 0
    sections: list[tuple[int, str]] = []

    def finish() -> None:
        if current is not None and bus is not None:
            cards.append(_card(bus, current))

    for raw in lines:
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        line = raw.strip()
        head = _CARD.match(line)
        if head is not None:
            finish()
            current, bus, card_indent, sections = {}, normal_bus_id(head.group(1)), indent, []
            continue
        if current is None or indent <= card_indent:
            continue
        while sections and sections[-1][0] >= indent:
            sections.pop()
        pair = _KEY_VALUE.match(line)
        if pair is None or not pair.group(2).strip():
            sections.append((indent, (pair.group(1) if pair else line).strip().lower()))
            continue
        path = "/".join([*(name for _, name in sections), pair.group(1).strip().lower()])
        current.setdefault(path, pair.group(2).strip())
    finish()
    return cards


def _card(bus: str, values: dict[str, str]) -> XpuQueryCard:
    uuid = values.get("xpu uuid", "").strip()
    return XpuQueryCard(
        bus_id=bus,
        minor=parse_count(values.get("minor number")),
        uuid=uuid if 0 < len(uuid) <= MAX_UUID and uuid.upper() not in ("N/A", "NONE") else None,
        dram_corrected=parse_count(values.get("ecc errors/aggregate/dram correctable")),
        dram_uncorrected=parse_count(values.get("ecc errors/aggregate/dram uncorrectable")),
    )
