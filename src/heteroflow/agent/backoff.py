"""Reconnect pacing. Purely computational, no side effects."""

from __future__ import annotations


def backoff_delay(failures: int, *, initial_s: float, max_s: float) -> float:
    """Seconds to wait after ``failures`` consecutive failures: doubling from ``initial_s``, capped.

    No jitter: agents restart at different moments and heartbeats are cheap for the server, so the
    thundering herd this would prevent does not form; determinism keeps the tests exact.
    """
    if failures <= 0:
        return 0.0
    exponent = min(failures - 1, 32)
    return float(min(max_s, initial_s * (2**exponent)))
