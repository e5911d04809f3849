"""The clock port's waits and the virtual-time loop the shells' tests run on."""

from __future__ import annotations

import asyncio
import math
import time

from heteroflow.core.clock import SystemClock, remaining, sleep_until
from heteroflow.core.testing import FakeClock, LoopClock, run_virtual


def test_virtual_time_runs_timers_in_order_without_waiting_for_them() -> None:
    async def main() -> tuple[list[str], float]:
        clock = LoopClock()
        start = clock.monotonic()
        woke: list[str] = []

        async def sleeper(name: str, seconds: float) -> None:
            await clock.sleep(seconds)
            woke.append(f"{name}@{clock.monotonic() - start:g}")

        await asyncio.gather(sleeper("late", 3600), sleeper("soon", 60), sleeper("now", 0))
        return woke, clock.monotonic() - start

    real = time.monotonic()
    woke, elapsed = run_virtual(main())
    assert woke == ["now@0", "soon@60", "late@3600"]
    assert elapsed == 3600
    assert time.monotonic() - real < 5  # an hour of timers, no hour of waiting


def test_wait_for_says_whether_the_event_came_before_the_timeout() -> None:
    async def main() -> list[tuple[bool, float]]:
        clock = LoopClock()
        event = asyncio.Event()
        start = clock.monotonic()
        answers = [(await clock.wait_for(event, 30), clock.monotonic() - start)]
        asyncio.get_running_loop().call_later(5, event.set)
        answers.append((await clock.wait_for(event, 30), clock.monotonic() - start))
        answers.append((await clock.wait_for(event, 30), clock.monotonic() - start))  # already set: at once
        return answers

    assert run_virtual(main()) == [(False, 30), (True, 35), (True, 35)]


def test_time_stands_still_while_a_thread_works_for_the_loop() -> None:
    async def main() -> float:
        clock = LoopClock()
        ticker = asyncio.create_task(clock.sleep(0.001))  # a timer due long before the thread is done
        start = clock.monotonic()
        await asyncio.to_thread(time.sleep, 0.05)
        ticker.cancel()
        return clock.monotonic() - start

    assert run_virtual(main()) < 0.01


def test_a_wait_until_a_deadline_a_few_ulps_ahead_ends() -> None:
    """A deadline a few ulps past the clock (what float sums of periods leave): asyncio runs the timer up to its
    clock resolution early, so the loop brings its clock to the timer, and ``now >= deadline`` then holds
    instead of the wait starting again at the same instant for ever."""

    async def main() -> int:
        clock = LoopClock()
        deadline = clock.monotonic() + 8 * math.ulp(clock.monotonic())
        waits = 0
        while clock.monotonic() < deadline:
            waits += 1
            assert waits < 5, f"stuck at {clock.monotonic()!r} before {deadline!r}"
            await clock.wait_for(asyncio.Event(), deadline - clock.monotonic())
        return waits

    assert run_virtual(main()) == 1


def test_sleep_until_and_remaining_use_the_clock() -> None:
    async def main() -> tuple[float, float]:
        clock = LoopClock()
        deadline = clock.monotonic() + 12
        before = remaining(clock, deadline)
        await sleep_until(clock, deadline)
        return before, remaining(clock, deadline)

    assert run_virtual(main()) == (12, 0)


def test_a_fake_clocks_sleepers_wake_when_it_is_advanced_past_them() -> None:
    async def main() -> list[str]:
        clock = FakeClock()
        woke: list[str] = []

        async def sleeper(name: str, seconds: float) -> None:
            await clock.sleep(seconds)
            woke.append(name)

        tasks = [asyncio.create_task(sleeper("a", 2)), asyncio.create_task(sleeper("b", 1))]
        await asyncio.sleep(0)
        clock.advance(0.5)
        await asyncio.sleep(0)
        assert woke == []
        clock.advance(0.5)
        await asyncio.sleep(0)
        assert woke == ["b"]
        event = asyncio.Event()
        waiting = asyncio.create_task(clock.wait_for(event, 10))
        clock.advance(1)
        await asyncio.gather(*tasks)
        event.set()
        assert await waiting is True
        return woke

    assert asyncio.run(main()) == ["b", "a"]


def test_the_system_clock_waits_on_the_real_loop() -> None:
    async def main() -> bool:
        clock = SystemClock()
        await clock.sleep(0)
        return await clock.wait_for(asyncio.Event(), 0.01)

    assert asyncio.run(main()) is False


def test_a_waiter_cancelled_as_its_event_is_set_is_cancelled() -> None:
    """A loop that waits for its wake-up event (the strategy center) must end when cancelled in the same instant as
    the event is set (``Controller.stop`` cancels a strategy whose end sets it): Python 3.11's
    ``asyncio.wait_for`` returns the event's answer there and drops the cancellation, and ``stop`` would wait for
    the loop for ever. Virtual time makes the coincidence certain."""

    async def main() -> list[bool]:
        clock = LoopClock()
        ended: list[bool] = []
        for set_first in (True, False):
            event = asyncio.Event()

            async def center(wake: asyncio.Event = event) -> None:
                while True:
                    await clock.wait_for(wake, 30)
                    wake.clear()

            task = asyncio.create_task(center())
            await asyncio.sleep(1)
            if set_first:
                event.set()
            task.cancel()
            event.set()
            done, _ = await asyncio.wait({task}, timeout=300)
            ended.append(task in done and task.cancelled())
            task.cancel()
        return ended

    assert run_virtual(main()) == [True, True]
