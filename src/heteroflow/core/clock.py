"""Time, injected.

Every component that reads the time, or waits for it to pass, takes a :class:`Clock`. Production code gets
:class:`SystemClock`; tests get :class:`heteroflow.core.testing.FakeClock` (moved by hand) or
:class:`heteroflow.core.testing.LoopClock` on a virtual-time loop (:func:`heteroflow.core.testing.run_virtual`),
and never wait on the real clock.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current wall-clock time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes backwards."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time (``<= 0``: only let the other tasks run)."""
        ...

    async def wait_for(self, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109 (this clock is the time)
        """Wait until ``event`` is set or ``timeout`` seconds pass; whether it is set."""
        ...


class LoopWaits:
    """Waits on the running event loop's own timers: the loop's clock is the clock (real or virtual)."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait_for(self, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109 (this clock is the time)
        if event.is_set():
            return True
        # asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for drops a cancellation that comes in the
        # same instant as the event (it returns the event's answer), and a loop waiting here would outlive its
        # cancel (``Controller.stop`` then waits for it for ever; virtual time makes the coincidence certain)
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await event.wait()
        except TimeoutError:
            return event.is_set()
        return True


class SystemClock(LoopWaits):
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


async def sleep_until(clock: Clock, deadline: float) -> None:
    """Wait until ``clock.monotonic()`` reaches ``deadline`` (at once when it already has)."""
    await clock.sleep(deadline - clock.monotonic())


def remaining(clock: Clock, deadline: float) -> float:
    """Seconds left until the monotonic ``deadline`` (never negative)."""
    return max(0.0, deadline - clock.monotonic())


def utc(value: datetime) -> datetime:
    """The same instant as an aware UTC datetime (naive values are taken as UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
