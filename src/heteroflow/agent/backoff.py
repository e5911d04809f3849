"""Reconnect pacing. Purely computational, no side effects."""

from __future__ import annotations


def backoff_delay(failures: int, *, initial_sec: float, max_sec: float) -> float:
    """Seconds to wait after ``failures`` consecutive failures: doubling from ``initial_sec``, capped.

    No jitter: agents restart at different moments and heartbeats are cheap for the server, so the
    thundering herd this would prevent does not form; determinism keeps the tests exact.
    """
    if failures <= 0:
        return 0.0
    exponent = min(failures - 1, 32)
    return float(min(max_sec, initial_sec * (2**exponent)))


def retry_delay(failures: int, *, retry_after_sec: float | None, initial_sec: float, max_sec: float) -> float:
    """Seconds to wait before the next attempt: the backoff, but never sooner than the server's Retry-After.

    An overloaded server answers 503 with Retry-After; coming back earlier only adds to its load. The
    Retry-After is capped at ``max_sec`` so that a confused server cannot park the agent for hours.
    """
    delay = backoff_delay(failures, initial_sec=initial_sec, max_sec=max_sec)
    if retry_after_sec is None:
        return delay
    return max(delay, min(retry_after_sec, max_sec))
