"""The controllers' leader lease on a real etcd: one leader, a standby that takes over, fenced writes, and a
leader that gives up before its lease can have expired (``docs/controller.md``, active/standby)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aetcd
import pytest

from heteroflow.core.clock import SystemClock
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.ranks import DpRank, InstanceId
from heteroflow.serving.controller.leadership import Claim, LeaderElection
from heteroflow.serving.controller.store import EtcdFtRuntimeStore, NotLeaderError
from heteroflow.serving.controller.store.testing import EtcdServer

pytestmark = pytest.mark.timeout(60)

TTL = 2


def election(
    store: EtcdFtRuntimeStore, name: str, lost: list[tuple[str, float]] | None = None, *, ttl: int = TTL
) -> LeaderElection:
    return LeaderElection(
        store,
        key=store.prefix.rstrip("/") + "-leader",
        controller_id=name,
        url=f"http://{name}:8500",
        ttl_sec=ttl,
        clock=SystemClock(),
        on_lost=lambda reason: (lost if lost is not None else []).append((reason, time.monotonic())),
    )


def record(instance: str = "inst-1") -> rt.PersistedRuntime:
    runtime = rt.new_runtime(InstanceId(instance), frozenset(DpRank(r) for r in range(4)), enabled=True)
    return rt.persisted(runtime)


async def eventually(check: Callable[[], bool], *, within: float, what: str) -> float:
    """Seconds until ``check`` held; fails after ``within``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > within:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def test_one_leader_and_a_standby_that_takes_over_when_it_resigns(etcd_endpoint: str, etcd_prefix: str) -> None:
    async def main() -> None:
        stores = [EtcdFtRuntimeStore(etcd_endpoint, prefix=etcd_prefix, timeout_sec=2.0) for _ in range(2)]
        first, second = election(stores[0], "a"), election(stores[1], "b")
        try:
            await first.campaign()
            assert first.leading
            standby = asyncio.create_task(second.campaign())
            await eventually(lambda: second.holder is not None, within=5, what="the standby sees the leader")
            assert not second.leading
            assert not standby.done()
            assert second.status()["leader_id"] == "a"
            assert second.status()["leader_url"] == "http://a:8500"
            # the leader renews: after two TTLs it still leads and the standby still waits
            await asyncio.sleep(2 * TTL)
            assert first.leading
            assert not standby.done()

            await first.resign()
            took = await eventually(standby.done, within=5, what="the standby takes over")
            assert took <= second.poll_sec + 1.0
            assert second.leading
            claim = Claim.decode(await stores[0].read_claim(second.key) or b"")
            assert claim is not None
            assert claim.controller_id == "b"
        finally:
            await second.resign()
            for store in stores:
                await store.close()

    asyncio.run(main())


def test_a_dead_leaders_lease_runs_out_and_the_standby_takes_over_within_the_ttl(
    etcd_endpoint: str, etcd_prefix: str
) -> None:
    async def main() -> None:
        stores = [EtcdFtRuntimeStore(etcd_endpoint, prefix=etcd_prefix, timeout_sec=2.0) for _ in range(2)]
        first, second = election(stores[0], "a"), election(stores[1], "b")
        try:
            await first.campaign()
            standby = asyncio.create_task(second.campaign())
            await eventually(lambda: second.holder is not None, within=5, what="the standby sees the leader")
            # the leader dies: it stops renewing without revoking (a killed process)
            assert first._keeper is not None
            first._keeper.cancel()
            died = time.monotonic()
            await eventually(standby.done, within=TTL + 5, what="the standby takes over")
            took = time.monotonic() - died
            # etcd deletes the key at most one TTL after the last renewal; the standby polls every poll_sec
            assert took <= TTL + second.poll_sec + 1.0, took
            assert second.leading
        finally:
            await second.resign()
            for store in stores:
                await store.close()

    asyncio.run(main())


def test_a_deposed_leaders_fenced_write_is_refused_and_changes_nothing(etcd_endpoint: str, etcd_prefix: str) -> None:
    async def main() -> None:
        stores = [EtcdFtRuntimeStore(etcd_endpoint, prefix=etcd_prefix, timeout_sec=2.0) for _ in range(2)]
        lost: list[tuple[str, float]] = []
        first, second = election(stores[0], "a", lost), election(stores[1], "b")
        try:
            await first.campaign()
            revision = await stores[0].put(record(), expected_revision=None)  # a fenced write while leading
            assert first.lease_id is not None
            assert first._keeper is not None
            first._keeper.cancel()  # paused: it neither renews nor notices
            await stores[1].revoke_lease(first.lease_id)  # its lease is gone, as after a long pause
            await second.campaign()

            with pytest.raises(NotLeaderError) as refused:
                await stores[0].put(record(), expected_revision=revision)
            assert refused.value.holder is not None
            assert '"id": "b"' in refused.value.holder
            with pytest.raises(NotLeaderError):
                await stores[0].delete(InstanceId("inst-1"), expected_revision=revision)
            found = await stores[1].load(InstanceId("inst-1"))
            assert found is not None
            assert found.revision == revision
            # the new leader writes on
            assert await stores[1].put(record(), expected_revision=revision) > revision
        finally:
            await second.resign()
            for store in stores:
                await store.close()

    asyncio.run(main())


def test_a_leader_that_learns_its_lease_is_gone_gives_up(etcd_endpoint: str, etcd_prefix: str) -> None:
    async def main() -> None:
        store = EtcdFtRuntimeStore(etcd_endpoint, prefix=etcd_prefix, timeout_sec=2.0)
        lost: list[tuple[str, float]] = []
        leader = election(store, "a", lost)
        try:
            await leader.campaign()
            assert leader.lease_id is not None
            await store.revoke_lease(leader.lease_id)  # e.g. an operator, or etcd after a long stall
            await eventually(lambda: bool(lost), within=TTL + 2, what="the leader notices")
            assert "gone" in lost[0][0]
            assert leader.role == "lost"
            with pytest.raises(NotLeaderError):  # the fence stays: no write after losing
                await store.put(record(), expected_revision=None)
        finally:
            await store.close()

    asyncio.run(main())


def test_a_leader_cut_off_from_etcd_gives_up_before_its_lease_can_have_expired(
    own_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    etcd = own_etcd_server

    async def main() -> None:
        store = EtcdFtRuntimeStore(etcd.endpoint, prefix=etcd_prefix, timeout_sec=0.5)
        lost: list[tuple[str, float]] = []
        leader = election(store, "a", lost, ttl=3)
        try:
            await leader.campaign()
            await asyncio.sleep(leader.renew_sec + 0.2)  # at least one renewal went through
            etcd.pause()  # frozen: renewals hang until the store's deadline
            frozen = time.monotonic()
            await eventually(lambda: bool(lost), within=leader.ttl_sec + 3, what="the leader gives up")
            gave_up = lost[0][1] - frozen
            # the last successful renewal was sent before the freeze, so the lease lives at least until
            # then + TTL: giving up within the TTL means no other controller can have led meanwhile
            assert gave_up < leader.ttl_sec, gave_up
            assert "could not be renewed" in lost[0][0]
        finally:
            etcd.resume()
            await store.close()

    asyncio.run(main())


def test_a_claim_that_is_not_ours_or_not_json_is_reported_as_such() -> None:
    assert Claim.decode(b"not json") is None
    assert Claim.decode(b'{"url": "x"}') is None
    assert Claim.decode(Claim("a", None, "n").encode()) == Claim("a", None, "n")


def test_a_claim_that_landed_although_its_answer_was_lost_is_recognised_as_ours(
    etcd_endpoint: str, etcd_prefix: str
) -> None:
    async def main() -> None:
        store = EtcdFtRuntimeStore(etcd_endpoint, prefix=etcd_prefix, timeout_sec=2.0)
        leader = election(store, "a")
        try:
            # the first attempt's transaction landed, but its answer never came back
            leader.lease_id, _ = await store.grant_lease(TTL)
            assert await store.claim(leader.key, leader.claim.encode(), leader.lease_id) is None
            await asyncio.wait_for(leader.campaign(), timeout=2 * TTL)
            assert leader.leading
        finally:
            await leader.resign()
            await store.close()

    asyncio.run(main())


def test_a_leader_whose_key_was_deleted_behind_its_back_gives_up(etcd_endpoint: str, etcd_prefix: str) -> None:
    async def main() -> None:
        store = EtcdFtRuntimeStore(etcd_endpoint, prefix=etcd_prefix, timeout_sec=2.0)
        lost: list[tuple[str, float]] = []
        leader = election(store, "a", lost)
        host, port = etcd_endpoint.rsplit(":", 1)
        operator = aetcd.Client(host=host, port=int(port))
        try:
            await leader.campaign()
            # the lease lives on, but the key is gone: another controller could claim it now
            await operator.delete(leader.key.encode())
            await eventually(lambda: bool(lost), within=TTL + 2, what="the leader notices")
            assert "no longer holds" in lost[0][0]
            assert leader.role == "lost"
        finally:
            await operator.close()
            await store.close()

    asyncio.run(main())
