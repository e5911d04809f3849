"""Fakes of the core seams, shipped for tests of this project and of its users."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import random
import selectors
import socket
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from heteroflow.core.clock import LoopWaits

T = TypeVar("T")

_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class FakeClock:
    """A clock that moves only when told to (:meth:`advance`); its sleepers wake when it passes their time."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 1000.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = 0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        self._now += timedelta(seconds=seconds)
        self._mono += seconds
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, waiter = heapq.heappop(self._sleepers)
            if not waiter.done():
                waiter.set_result(None)

    async def sleep(self, seconds: float) -> None:
        """Wait until :meth:`advance` moves the clock ``seconds`` on (``<= 0``: only let the others run)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._order += 1
        heapq.heappush(self._sleepers, (self._mono + seconds, self._order, waiter))
        await waiter

    async def wait_for(self, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109 (this clock is the time)
        if event.is_set():
            return True
        setter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(self.sleep(timeout))
        try:
            await asyncio.wait({setter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            setter.cancel()
            sleeper.cancel()
        return event.is_set()


# == virtual time: an event loop that jumps to its next timer when nothing else can run ======================
class _JumpingSelector(selectors.DefaultSelector):
    """The loop's selector: when no I/O is ready and no thread works for the loop, the wait for the next timer
    takes no time, the loop's clock jumps there instead (as trio's ``MockClock(autojump_threshold=0)``)."""

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready or timeout == 0:
            self.loop.catch_up()
            return ready
        if timeout is None or self.loop.threads_working:  # only real I/O or a thread can move things on
            found: list[tuple[selectors.SelectorKey, int]] = super().select(timeout)
            return found
        self.loop.jump(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when every task waits on a timer: it then jumps to the next one.

    Whatever waits through the loop's timers (``asyncio.sleep``, ``asyncio.wait_for``, a :class:`LoopClock`)
    takes no real time, in the same order as with real time. Sound when every peer is in the loop (ASGI
    transports, in-memory fakes); time stands still while a thread of ``run_in_executor`` works; a wait on a
    socket to another process gets no jump (the loop waits for real when a timer is further off than the
    answer), so such tests keep the real clock. A task that never waits on a timer (a loop of ``sleep(0)``, a
    period kept by reading ``time.monotonic``) stops virtual time for every other.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._virtual_time = start
        self.threads_working = 0
        selector = _JumpingSelector()
        selector.loop = self
        super().__init__(selector)

    def time(self) -> float:
        return self._virtual_time

    def jump(self, seconds: float) -> None:
        self._virtual_time += max(0.0, seconds)
        self.catch_up()

    def catch_up(self) -> None:
        """Bring the clock to the next timer when it is due within the loop's clock resolution.

        asyncio runs a timer up to that resolution early; with real time the clock gets there a moment later,
        with virtual time it would not, and code that waits until a deadline and then checks ``now >=
        deadline`` would find it not reached and wait again at the same instant, for ever.
        """
        scheduled: list[asyncio.TimerHandle] = getattr(self, "_scheduled", [])  # the loop's heap of timers
        if scheduled:
            when = scheduled[0].when()
            if self._virtual_time < when <= self._virtual_time + self._clock_resolution:  # type: ignore[attr-defined]
                self._virtual_time = when

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.threads_working += 1

        def done(_: asyncio.Future[T]) -> None:
            self.threads_working -= 1

        future.add_done_callback(done)
        return future


class LoopClock(LoopWaits):
    """The :class:`~heteroflow.core.clock.Clock` of an event loop: ``monotonic`` is the loop's time, ``now``
    moves with it from ``start``. On a :class:`VirtualTimeLoop` that is virtual time."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, *, start: datetime | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._origin = self._loop.time()
        self._start = start or datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._loop.time() - self._origin)

    def monotonic(self) -> float:
        return self._loop.time()


def run_virtual(main: Coroutine[Any, Any, T], *, debug: bool = False) -> T:
    """``asyncio.run(main)`` on a :class:`VirtualTimeLoop`."""
    with asyncio.Runner(debug=debug, loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)


def _worker_slice() -> tuple[int, int]:
    """(index, count) of this pytest-xdist worker, ``(0, 1)`` outside one (the variables xdist sets)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(worker[2:]) % int(count), int(count)
    return 0, 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, chosen below the kernel's ephemeral range.

    A port picked there cannot be taken by an outgoing connection or a ``bind(0)`` (gloo, HTTP clients)
    between the moment it is chosen and the moment the process under test binds it. Test workers running side
    by side (pytest-xdist) draw from disjoint slices of that range, so two of them never pick the same port
    in the moment before it is bound.
    """
    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(_PORT_RANGE_FILE.read_text().split()[0])
    floor = 10000 if low > 12000 else 1024
    index, count = _worker_slice()
    width = max(1, (low - floor) // count)
    floor, low = floor + index * width, floor + (index + 1) * width
    for _ in range(200):
        port = random.randrange(floor, max(low, floor + 1))
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # a crowded range: let the kernel choose
        sock.bind((host, 0))
        chosen: int = sock.getsockname()[1]
        return chosen
