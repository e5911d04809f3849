"""Waiting for something another process, thread or task does: poll with a deadline, never a bare sleep.

One helper for the tests and the benches (``bench/`` imports it too): :func:`until` in plain code,
:func:`eventually` in an event loop. Both return the check's first truthy value, so a check can hand back what
it found, and both fail with ``TimeoutError`` naming what was awaited and the check's last value.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

PERIOD_SEC = 0.1
"""Seconds between two checks unless told: short against the seconds the waits here last, long enough that
polling costs nothing on two shared cores."""
IN_PROCESS_SEC = 0.005
"""The period for a wait on a task of the same event loop (unit tests): it runs as soon as the loop does, and a
short period keeps the timing bounds of those tests wide."""


def timed_out(within: float, what: str, last: object) -> TimeoutError:
    return TimeoutError(f"not within {within} s: {what} (last: {last!r})")


def until(check: Callable[[], T | None], *, within: float, what: str, period: float = PERIOD_SEC) -> T:
    """Call ``check`` every ``period`` seconds until it returns something truthy; that value."""
    deadline = time.monotonic() + within
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise timed_out(within, what, last)
        time.sleep(period)  # the polling period, bounded by the deadline above


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]], *, within: float, what: str, period: float = PERIOD_SEC
) -> T: ...
@overload
async def eventually(check: Callable[[], T | None], *, within: float, what: str, period: float = PERIOD_SEC) -> T: ...
async def eventually(
    check: Callable[[], T | None] | Callable[[], Awaitable[T | None]],
    *,
    within: float,
    what: str,
    period: float = PERIOD_SEC,
) -> T:
    """:func:`until` in an event loop: the loop runs between two checks; ``check`` may be a coroutine function.

    The deadline is on the loop's clock (real time on asyncio's loop; virtual time on
    :class:`heteroflow.core.testing.VirtualTimeLoop`, where ``within`` is virtual seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = check()
        last: T | None = await result if inspect.isawaitable(result) else result
        if last:
            return last
        if loop.time() > deadline:
            raise timed_out(within, what, last)
        await asyncio.sleep(period)  # the polling period, bounded by the deadline above
