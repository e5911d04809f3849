"""How a simulated rank waits in a collective: a peer that left the group and says so in the TCP store fails
the wait at once, even when gloo keeps that peer's side of the connection open (real gloo, two ranks in one
process, one of which never takes part)."""

from __future__ import annotations

import datetime
import threading
import time
import warnings
from typing import Any

import pytest

from heteroflow.core.testing import free_port
from heteroflow.engine_sim.worker import FAULT_CHECK_AFTER_SEC, PeerLeftError, wait_collective

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, TCPStore

TIMEOUT_SEC = 5.0


def pair_of_groups() -> tuple[Any, list[Any]]:
    """A TCP store and two connected gloo groups (ranks 0 and 1) with a 5 s collective timeout."""
    port = free_port()
    store = TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=10))
    groups: list[Any] = [None, None]

    def make(rank: int) -> None:
        client = store if rank == 0 else TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10))
        opts: Any = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._devices = [ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        opts._timeout = datetime.timedelta(seconds=TIMEOUT_SEC)
        groups[rank] = ProcessGroupGloo(PrefixStore("g/", client), rank, 2, opts)

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(g is not None for g in groups)
    return store, groups


def test_a_peer_that_left_fails_the_wait_long_before_the_collective_timeout() -> None:
    store, groups = pair_of_groups()
    work = groups[0].allreduce([torch.ones(8)])  # rank 1 never joins: its side stays open, as after a fault
    announce = threading.Timer(0.3, lambda: store.set("g/fault", "1"))
    announce.start()
    started = time.monotonic()
    with pytest.raises(PeerLeftError, match="left the group"):
        wait_collective(work, store, "g/fault")
    waited = time.monotonic() - started
    assert 0.3 <= waited < 1.0 < TIMEOUT_SEC
    groups[1].allreduce([torch.ones(8)]).wait()  # let rank 0's pending operation finish before teardown


def test_a_healthy_collective_never_reads_the_store() -> None:
    store, groups = pair_of_groups()

    class CountingStore:
        reads = 0

        def check(self, keys: list[str]) -> bool:
            CountingStore.reads += 1
            return bool(store.check(keys))

    results = [torch.ones(8), torch.full((8,), 2.0)]
    works = [groups[rank].allreduce([results[rank]]) for rank in (0, 1)]
    for work in works:
        wait_collective(work, CountingStore(), "g/fault")
    assert results[0].tolist() == [3.0] * 8
    assert CountingStore.reads == 0


def test_an_unreachable_store_leaves_the_collective_timeout_in_charge() -> None:
    _, groups = pair_of_groups()

    class DeadStore:
        reads = 0

        def check(self, keys: list[str]) -> bool:
            DeadStore.reads += 1
            raise RuntimeError("connection refused")

    work = groups[0].allreduce([torch.ones(8)])
    finish = threading.Timer(FAULT_CHECK_AFTER_SEC + 0.3, lambda: groups[1].allreduce([torch.ones(8)]).wait())
    finish.start()
    wait_collective(work, DeadStore(), "g/fault")  # no error: the peer did join in the end
    finish.join()
    assert DeadStore.reads >= 2
