"""Vendor text → numbers. Pure, total: every function returns a value or ``None`` and never raises.

The rule everywhere is H-1: what cannot be read is *unknown* (``None``), never 0. Reading "ECC disabled"
or "not supported" as 0 would present a card with no observability as a card with zero errors, the one
distortion this subsystem exists to prevent. ``Yes``/``No`` are not unknown: they are the flags 1/0.
"""

from __future__ import annotations

import math
import re
from typing import Final

from heteroflow.contracts.counters import COUNTER_MAX

#: Texts the vendor tools print instead of a value (compared case-insensitively, brackets optional).
SENTINELS: Final = frozenset(
    {
        "n/a",
        "na",
        "not supported",
        "unknown error",
        "insufficient permissions",
        "gpu requires reset",
        "gpu is lost",
        "requested functionality has been deprecated",
        "unknown",
        "err!",
        "error",
        "-",
        "",
    }
)

#: NVML/DCGM "blank" values: at or above this a 64-bit reading means not-a-value.
BLANK_SENTINEL_MIN: Final = 0x7FFFFFFFFFFFFFF0

_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_MAX_TEXT = 64


def _clean(text: object) -> str | None:
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        return None
    return text.strip()


def is_sentinel(text: str) -> bool:
    core = text.strip()
    if core.startswith("[") and core.endswith("]"):
        core = core[1:-1].strip()
    return core.lower() in SENTINELS


def parse_count(text: object) -> int | None:
    """A lifetime counter from tool text: a non-negative 64-bit integer, or ``None`` (unknown).

    Sentinels, empty, negative, non-integral, non-numeric and values beyond 2**63-1 are unknown; a
    huge value is never clamped (a clamped counter would later look like a decrease or a plateau).
    """
    cleaned = _clean(text)
    if cleaned is None or is_sentinel(cleaned) or not _INTEGER.fullmatch(cleaned):
        return None
    number = int(cleaned)
    if number < 0 or number > COUNTER_MAX or number >= BLANK_SENTINEL_MIN:
        return None
    return number


def parse_flag(text: object) -> int | None:
    """A 0/1 flag: ``Yes``/``No`` (any case) → 1/0, ``0``/``1`` as written, anything else unknown."""
    cleaned = _clean(text)
    if cleaned is None:
        return None
    lowered = cleaned.lower()
    if lowered == "yes":
        return 1
    if lowered == "no":
        return 0
    if cleaned in ("0", "1"):
        return int(cleaned)
    return None


def parse_measure(text: object) -> float | None:
    """A telemetry value (temperature, %, MiB, W), an optional unit after it; ``None`` when unreadable.

    ``"43"``, ``"26.20 W"``, ``"35C"``, ``"0 %"`` and ``"596 MiB"`` all read; sentinels, negative values,
    NaN and infinities do not.
    """
    cleaned = _clean(text)
    if cleaned is None or is_sentinel(cleaned):
        return None
    match = _NUMBER.match(cleaned)
    if match is None:
        return None
    rest = cleaned[match.end() :].strip()
    if rest and not re.fullmatch(r"[A-Za-z%°]{1,4}", rest):
        return None
    value = float(match.group())
    if not math.isfinite(value) or value < 0:
        return None
    return value


def add_counts(*values: int | None) -> int | None:
    """The sum of counts, unknown when any part is unknown (a partial sum would under-report)."""
    total = 0
    for value in values:
        if value is None:
            return None
        total += value
    return total if total <= COUNTER_MAX else None


def search_measure(pattern: re.Pattern[str], text: str) -> float | None:
    """The measure in the first group of the first match of ``pattern`` in ``text``; ``None`` when absent."""
    match = pattern.search(text)
    return parse_measure(match.group(1)) if match else None
