"""The cyclic garbage collector's policy for a long-running server process.

A server that keeps per-card state for a fleet holds hundreds of thousands of long-lived objects, and CPython's
default thresholds (700, 10, 10) run a full collection every few seconds under heartbeat load: each one walks
every tracked object with the interpreter held, hundreds of milliseconds in which no request is answered. Almost
everything the server frees is freed by reference counting; the collector exists for cycles. So once start-up is
over, :func:`settle_after_start_up` moves what start-up built (modules, classes, the app, its routes) out of the
collector's scans (``gc.freeze``) and makes young collections rarer, so that fewer objects are promoted to the
old generation and a full collection, which CPython already postpones until the old generation has grown by a
quarter, comes seldom. Cyclic garbage is still collected; only later.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import structlog

_log = structlog.get_logger(__name__)


def settle_after_start_up(*, young_threshold: int) -> None:
    """Freeze what start-up left and set the young generation's threshold (0: leave the collector as it is)."""
    if young_threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
    _log.info("gc.settled", frozen_objects=gc.get_freeze_count(), thresholds=gc.get_threshold())


def watch_pauses(record: Callable[[int, float], None]) -> Callable[[], None]:
    """Call ``record(generation, seconds)`` after every collection with how long it held the interpreter;
    returns the function that stops watching."""
    started = [0.0]

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            record(int(info["generation"]), time.perf_counter() - started[0])

    gc.callbacks.append(on_collection)
    return lambda: gc.callbacks.remove(on_collection)
