"""The hardware error counters (H-1) as the GPU health domain stores them.

The counters' keys, bounds and reading type are the heartbeat's wire contract and live in
:mod:`heteroflow.contracts.counters`, which the agent imports too; they are re-exported here for the server's
domain code. What is the server's own is how a list of health keys is stored (:func:`join_keys`,
:func:`split_keys`).
"""

from __future__ import annotations

from heteroflow.contracts.counters import (
    COUNTER_MAX,
    HEALTH_KEYS,
    PLAIN_WIRE_TYPES,
    Counters,
    counters_from_values,
    interned_counters,
    parse_counter,
    parse_keys,
    shared_counters,
)

__all__ = [
    "COUNTER_MAX",
    "HEALTH_KEYS",
    "PLAIN_WIRE_TYPES",
    "Counters",
    "counters_from_values",
    "interned_counters",
    "join_keys",
    "parse_counter",
    "parse_keys",
    "shared_counters",
    "split_keys",
]


def join_keys(keys: tuple[str, ...]) -> str | None:
    """Health keys as stored (comma-separated; ``None`` for none)."""
    return ",".join(keys) if keys else None


def split_keys(stored: str | None) -> tuple[str, ...]:
    """Stored health keys back as a tuple; unknown names are dropped."""
    if not stored:
        return ()
    return parse_keys(stored.split(","))
