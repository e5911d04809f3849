"""The heartbeat's hardware error counters: their keys, bounds and reading type, and the rule that unknown is
never 0 (H-1). This is part of the agent ⇄ platform server wire (``heartbeat.py``): the agent reads its cards into
:class:`Counters` and sends :data:`HEALTH_KEYS`, and the server reads the same keys back with the same bounds.

The seed's five counters, and four that real drivers give beyond it: the remapped-row counts (the durable evidence
of failing memory rows on Ampere and later) and the on-die SRAM ECC counts, kept apart from the DRAM (HBM) errors
that ``ecc_*_total`` hold where the driver splits them.

A counter is an ``int`` or ``None``. ``None`` means *unknown*: not collected, not parseable, not supported
or not permitted. Reading an unknown counter as 0 would turn a card with no observability into "a healthy
card with zero errors", the one distortion this subsystem exists to prevent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

#: Largest value a counter column holds (64-bit signed). Larger readings are unknown, not clamped.
COUNTER_MAX: Final = 2**63 - 1

HEALTH_KEYS: Final = (
    "ecc_uncorrected_total",
    "ecc_corrected_total",
    "retired_pages",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "ecc_sram_uncorrected_total",
    "ecc_sram_corrected_total",
)


@dataclass(frozen=True, slots=True)
class Counters:
    """One reading of the counters of one card; ``None`` = unknown."""

    ecc_uncorrected_total: int | None = None
    ecc_corrected_total: int | None = None
    retired_pages: int | None = None
    remapped_rows_pending: int | None = None
    remapped_rows_failure: int | None = None
    remapped_rows_correctable: int | None = None
    """Rows remapped after correctable errors (nvidia-smi ``remapped_rows.correctable``)."""
    remapped_rows_uncorrectable: int | None = None
    """Rows remapped after uncorrectable errors: growth is a strong signal and a failure event."""
    ecc_sram_uncorrected_total: int | None = None
    """Uncorrectable ECC errors of on-die SRAM, where the driver splits them from DRAM."""
    ecc_sram_corrected_total: int | None = None
    """Correctable ECC errors of on-die SRAM, where the driver splits them from DRAM."""
    all_unknown: bool = field(init=False, repr=False, compare=False)
    """Whether every counter is unknown: worked out once, when the object is made. A beat asks it of every card
    twice (the health dedup and the newest values for /metrics), and a steady card's object is shared
    (:func:`interned_counters`): as a property it was a Python call each time."""

    def __post_init__(self) -> None:
        unknown = (  # field by field: the first known one answers
            self.ecc_uncorrected_total is None
            and self.ecc_corrected_total is None
            and self.retired_pages is None
            and self.remapped_rows_pending is None
            and self.remapped_rows_failure is None
            and self.remapped_rows_correctable is None
            and self.remapped_rows_uncorrectable is None
            and self.ecc_sram_uncorrected_total is None
            and self.ecc_sram_corrected_total is None
        )
        object.__setattr__(self, "all_unknown", unknown)

    def as_dict(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in HEALTH_KEYS}

    @classmethod
    def from_wire(cls, stat: Mapping[str, object]) -> Counters:
        """The counters of one heartbeat stat; every malformed value becomes unknown, nothing raises."""
        return counters_from_values(tuple(map(stat.get, HEALTH_KEYS)))  # C-speed: no comprehension frame per card


def counters_from_values(raw: tuple[object, ...]) -> Counters:
    """The counters of a stat's wire values in :data:`HEALTH_KEYS` order (what :meth:`Counters.from_wire`
    reads); every malformed value becomes unknown, nothing raises."""
    # a steady card sends what it sent before: wire integers (not booleans) and nulls only, found as they
    # are among the parsed values (no key holds a negative or oversized number, so those never match)
    if PLAIN_WIRE_TYPES.issuperset(map(type, raw)):
        known = shared_counters(raw)  # type: ignore[arg-type]
        if known is not None:
            return known
    return interned_counters(tuple([parse_counter(value) for value in raw]))


_INTERNED: dict[tuple[int | None, ...], Counters] = {}
_INTERNED_MAX: Final = 65_536
PLAIN_WIRE_TYPES: Final = frozenset({int, type(None)})
"""The wire types of a steady card's counters: integers (not booleans) and nulls."""
shared_counters: Final = _INTERNED.get
"""The shared :class:`Counters` of wire values whose types are all :data:`PLAIN_WIRE_TYPES`, when a card sent
them before, else ``None``; in C (what :func:`counters_from_values` tries first, for a caller that reads a beat's
cards in one loop without a call per card). No key holds a negative or oversized number, so those never match;
the table is emptied in place, so this stays its lookup."""


def interned_counters(values: tuple[int | None, ...]) -> Counters:
    """The :class:`Counters` of ``values`` (parsed, in :data:`HEALTH_KEYS` order), shared between readings.

    A fleet's cards mostly repeat a few readings (all zero, steady counts): each beat finds its object here
    instead of building one. The table is emptied when full; it only ever holds immutable values."""
    counters = _INTERNED.get(values)
    if counters is None:
        if len(_INTERNED) >= _INTERNED_MAX:
            _INTERNED.clear()
        counters = _INTERNED[values] = Counters(*values)
    return counters


def parse_keys(value: object) -> tuple[str, ...]:
    """A list of health keys from any JSON value (e.g. ``semantics_unconfirmed``): known keys only, in order."""
    if not isinstance(value, list):
        return ()
    named = {item for item in value[: len(HEALTH_KEYS) * 2] if isinstance(item, str)}
    return tuple(key for key in HEALTH_KEYS if key in named)


def parse_counter(value: object) -> int | None:
    """A counter from any JSON value: a non-negative integer, or ``None`` (unknown).

    Missing, ``null``, booleans, strings, non-integral or non-finite numbers, negative values and values
    beyond 64 bits are all unknown. Integral floats (``12.0``) are accepted as the integer they spell.
    """
    if type(value) is int:  # the common case first (a bool is not of type int)
        return value if 0 <= value <= COUNTER_MAX else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        number = int(value)
    else:
        return None
    if number < 0 or number > COUNTER_MAX:
        return None
    return number
