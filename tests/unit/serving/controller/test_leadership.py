"""The leader election on an in-memory lease store, on virtual time: the TTLs, renewals and polls are the real
ones (seconds), and a test takes milliseconds. The same election against a real etcd is
``tests/integration/serving/test_controller_leadership.py``."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import pytest

from heteroflow.core.clock import Clock
from heteroflow.core.errors import StoreUnavailableError
from heteroflow.core.testing import LoopClock, run_virtual
from heteroflow.serving.controller.leadership import LeaderElection
from tests.support.polling import eventually

KEY = "/ft/leader"
TTL = 6


@dataclass
class MemoryLeases:
    """etcd's leases and one put-if-absent key, expiring on ``clock``."""

    clock: Clock
    down: bool = False
    leases: dict[int, float] = field(default_factory=dict)
    """lease id → when it runs out."""
    keys: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    fences: list[tuple[str, bytes | None]] = field(default_factory=list)
    granted: int = 0

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailableError("etcd is unreachable")
        now = self.clock.monotonic()
        for lease, until in list(self.leases.items()):
            if until <= now:
                self.expire(lease)

    def expire(self, lease_id: int) -> None:
        self.leases.pop(lease_id, None)
        self.keys = {k: v for k, v in self.keys.items() if v[1] != lease_id}

    def fence(self, key: str, claim: bytes | None) -> None:
        self.fences.append((key, claim))

    async def grant_lease(self, ttl_sec: int) -> tuple[int, int]:
        self._check()
        self.granted += 1
        self.leases[self.granted] = self.clock.monotonic() + ttl_sec
        return self.granted, ttl_sec

    async def claim(self, key: str, claim: bytes, lease_id: int) -> bytes | None:
        self._check()
        if key in self.keys:
            return self.keys[key][0]
        if lease_id not in self.leases:
            raise StoreUnavailableError("lease not found")
        self.keys[key] = (claim, lease_id)
        return None

    async def read_claim(self, key: str) -> bytes | None:
        self._check()
        held = self.keys.get(key)
        return None if held is None else held[0]

    async def keep_alive(self, lease_id: int) -> int:
        self._check()
        if lease_id not in self.leases:
            return 0
        self.leases[lease_id] = self.clock.monotonic() + TTL
        return TTL

    async def revoke_lease(self, lease_id: int) -> None:
        self._check()
        self.expire(lease_id)


def election(store: MemoryLeases, name: str, lost: list[tuple[str, float]], clock: Clock) -> LeaderElection:
    return LeaderElection(
        store,
        key=KEY,
        controller_id=name,
        url=f"http://{name}",
        ttl_sec=TTL,
        clock=clock,
        on_lost=lambda reason: lost.append((reason, clock.monotonic())),
    )


def test_one_leader_and_a_standby_that_takes_over_when_it_resigns() -> None:
    async def main() -> None:
        clock = LoopClock()
        store = MemoryLeases(clock)
        lost: list[tuple[str, float]] = []
        first, second = election(store, "a", lost, clock), election(store, "b", lost, clock)
        await first.campaign()
        waiting = asyncio.create_task(second.campaign())
        await clock.sleep(5 * TTL)  # many renewals: the leader keeps its key, the standby keeps waiting
        assert first.leading
        assert not waiting.done()
        assert second.role == "standby"
        assert second.holder == first.claim
        resigned_at = clock.monotonic()
        await first.resign()
        await asyncio.wait_for(waiting, timeout=second.poll_sec + 0.01)
        assert second.leading
        assert clock.monotonic() - resigned_at <= second.poll_sec
        assert lost == []
        await second.resign()

    run_virtual(main())


def test_a_dead_leaders_lease_runs_out_and_the_standby_takes_over_within_the_ttl() -> None:
    async def main() -> None:
        clock = LoopClock()
        store = MemoryLeases(clock)
        lost: list[tuple[str, float]] = []
        first, second = election(store, "a", lost, clock), election(store, "b", lost, clock)
        await first.campaign()
        waiting = asyncio.create_task(second.campaign())
        await clock.sleep(TTL)
        keeper = first._keeper  # the leader dies: it stops renewing, nothing is revoked
        assert keeper is not None
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        died_at = clock.monotonic()
        await asyncio.wait_for(waiting, timeout=TTL + second.poll_sec + 0.01)
        took = clock.monotonic() - died_at
        assert TTL - first.renew_sec <= took <= TTL + second.poll_sec  # not before the lease ran out
        assert second.leading

    run_virtual(main())


def test_a_leader_that_learns_its_lease_is_gone_gives_up_at_its_next_renewal() -> None:
    async def main() -> None:
        clock = LoopClock()
        store = MemoryLeases(clock)
        lost: list[tuple[str, float]] = []
        leader = election(store, "a", lost, clock)
        await leader.campaign()
        assert leader.lease_id is not None
        revoked_at = clock.monotonic()
        store.expire(leader.lease_id)  # revoked behind its back
        await eventually(lambda: lost, within=leader.renew_sec + 0.01, what="the leader gives up")
        ((reason, at),) = lost
        assert "gone" in reason
        assert at - revoked_at <= leader.renew_sec
        assert leader.role == "lost"
        assert store.fences[-1] == (KEY, leader.claim.encode())  # every further write stays fenced

    run_virtual(main())


@pytest.mark.parametrize("outage_after", [0.1, 1.9, 3.7])
def test_a_leader_cut_off_from_the_store_gives_up_before_its_lease_can_have_expired(outage_after: float) -> None:
    async def main() -> None:
        clock = LoopClock()
        store = MemoryLeases(clock)
        lost: list[tuple[str, float]] = []
        leader = election(store, "a", lost, clock)
        await leader.campaign()
        renewed: list[float] = [clock.monotonic()]  # when a renewal that etcd answered was sent
        real_keep_alive = store.keep_alive

        async def keep_alive(lease_id: int) -> int:
            sent = clock.monotonic()
            answer = await real_keep_alive(lease_id)
            renewed.append(sent)
            return answer

        store.keep_alive = keep_alive  # type: ignore[method-assign]
        await clock.sleep(outage_after)
        store.down = True
        await eventually(lambda: lost, within=TTL, what="the cut-off leader gives up")
        ((reason, at),) = lost
        assert "could not be renewed" in reason
        assert at < renewed[-1] + TTL  # before the lease it last renewed can have run out
        assert at >= renewed[-1] + TTL - 1.0 - leader.renew_sec  # and not long before: one renewal period
        assert leader.last_error is not None

    run_virtual(main())
