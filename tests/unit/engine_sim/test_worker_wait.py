"""How a simulated rank uses the group's TCP store while it waits: a peer that left the group and says so in
the store fails a collective at once, even when gloo keeps that peer's side of the connection open (real gloo,
two ranks in one process, one of which never takes part); a store whose host stopped answering (a hung rank,
SIGSTOP on a real store process) never holds the rank longer than a deadline: the collective's own timeout,
or a store call's."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heteroflow.core.testing import free_port
from heteroflow.engine_sim.collectives import (
    FAULT_CHECK_AFTER_SEC,
    BoundedStore,
    PeerLeftError,
    StoreTimeoutError,
    wait_collective,
)
from heteroflow.engine_sim.model import D_MODEL
from heteroflow.engine_sim.worker import ANNOUNCE_STORE_TIMEOUT_SEC, IDLE_POLL_STORE_TIMEOUT_SEC, Worker, WorkerConfig

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, TCPStore

TIMEOUT_SEC = 5.0
HUNG_TIMEOUT_SEC = 2.0
"""The collective timeout of the groups whose store host is stopped (short: the tests wait it out)."""
SLACK_SEC = 1.0
"""How much later than its deadline a wait may end on a busy machine."""

_HOST_SCRIPT = """
import datetime, sys, time, warnings
warnings.simplefilter("ignore")
from torch._C._distributed_c10d import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), None, True, datetime.timedelta(seconds=60),
                 wait_for_workers=False, use_libuv=False)
print("up", flush=True)
time.sleep(600)
"""


class StoreHost:
    """A TCP store hosted by a process of its own, which a test stops (SIGSTOP) as a hung rank would be."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOST_SCRIPT, str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )

    def client(self) -> Any:
        return TCPStore("127.0.0.1", self.port, None, False, datetime.timedelta(seconds=10))

    def stop(self) -> None:
        """SIGSTOP the host and wait until every thread of it is stopped (the signal is asynchronous)."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        tasks = Path(f"/proc/{self.proc.pid}/task")
        deadline = time.monotonic() + 10.0
        while not all(stat.read_text().rsplit(")", 1)[1].split()[0] == "T" for stat in tasks.glob("*/stat")):
            assert time.monotonic() < deadline, "the store host did not stop"
            time.sleep(0.005)

    def resume(self) -> None:
        if self.proc.poll() is None:  # a test may have killed it
            os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def store_host() -> Iterator[StoreHost]:
    host = StoreHost()
    try:
        assert host.proc.stdout is not None
        assert host.proc.stdout.readline() == b"up\n", "the store host did not start"
        yield host
    finally:
        host.resume()  # first: a call stuck on the stopped host returns, then the host goes
        host.proc.kill()
        host.proc.wait(timeout=30)
        if host.proc.stdout is not None:
            host.proc.stdout.close()


def pair_of_groups(*, port: int | None = None, timeout_sec: float = TIMEOUT_SEC) -> tuple[Any, list[Any]]:
    """Rank 0's TCP store and two connected gloo groups (ranks 0 and 1) with ``timeout_sec`` as collective
    timeout. The store is hosted here, or by another process at ``port``."""
    if port is None:
        port = free_port()
        store = TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=10))
    else:
        store = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10))
    groups: list[Any] = [None, None]

    def make(rank: int) -> None:
        client = store if rank == 0 else TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10))
        opts: Any = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._devices = [ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        opts._timeout = datetime.timedelta(seconds=timeout_sec)
        groups[rank] = ProcessGroupGloo(PrefixStore("g/", client), rank, 2, opts)

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(g is not None for g in groups)
    return store, groups


class CountingStore:
    """A raw store that counts the checks made through it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.checks = 0

    def check(self, keys: list[str]) -> bool:
        self.checks += 1
        return bool(self.store.check(keys))


def test_a_peer_that_left_fails_the_wait_long_before_the_collective_timeout() -> None:
    store, groups = pair_of_groups()
    work = groups[0].allreduce([torch.ones(8)])  # rank 1 never joins: its side stays open, as after a fault
    announce = threading.Timer(0.3, lambda: store.set("g/fault", "1"))
    announce.start()
    started = time.monotonic()
    with pytest.raises(PeerLeftError, match="left the group"):
        wait_collective(work, BoundedStore(store), "g/fault")
    waited = time.monotonic() - started
    assert 0.3 <= waited < 1.0 < TIMEOUT_SEC
    groups[1].allreduce([torch.ones(8)]).wait()  # let rank 0's pending operation finish before teardown


def test_a_healthy_collective_never_reads_the_store() -> None:
    store, groups = pair_of_groups()
    counting = CountingStore(store)
    results = [torch.ones(8), torch.full((8,), 2.0)]
    works = [groups[rank].allreduce([results[rank]]) for rank in (0, 1)]
    for work in works:
        wait_collective(work, BoundedStore(counting), "g/fault")
    assert results[0].tolist() == [3.0] * 8
    assert counting.checks == 0


def test_a_store_that_fails_the_check_fails_the_wait_at_once() -> None:
    _, groups = pair_of_groups()

    class DeadStore:
        reads = 0

        def check(self, keys: list[str]) -> bool:
            DeadStore.reads += 1
            raise RuntimeError("Connection reset by peer")

    work = groups[0].allreduce([torch.ones(8)])  # rank 1 never joins
    started = time.monotonic()
    with pytest.raises(PeerLeftError, match="store host left"):
        wait_collective(work, BoundedStore(DeadStore()), "g/fault")
    assert FAULT_CHECK_AFTER_SEC <= time.monotonic() - started < 1.0 < TIMEOUT_SEC  # only a stuck one reads it
    assert DeadStore.reads == 1
    groups[1].allreduce([torch.ones(8)]).wait()  # let rank 0's pending operation finish before teardown


def test_the_store_host_killed_during_a_collective_fails_the_wait_long_before_the_timeout(
    store_host: StoreHost,
) -> None:
    store, groups = pair_of_groups(port=store_host.port)
    work = groups[0].allreduce([torch.ones(8)])  # rank 1 never joins, and the store's host dies
    store_host.proc.kill()
    store_host.proc.wait(timeout=30)
    started = time.monotonic()
    with pytest.raises(PeerLeftError, match="store host left"):
        wait_collective(work, BoundedStore(store), "g/fault")
    assert time.monotonic() - started < 1.5 < TIMEOUT_SEC
    groups[1].allreduce([torch.ones(8)]).wait()


def test_a_hung_store_host_never_outlasts_the_collective_timeout(store_host: StoreHost) -> None:
    store, groups = pair_of_groups(port=store_host.port, timeout_sec=HUNG_TIMEOUT_SEC)
    counting = CountingStore(store)
    work = groups[0].allreduce([torch.ones(8)])  # rank 1 never joins: it hangs, and so does the store's host
    store_host.stop()
    started = time.monotonic()
    with pytest.raises(RuntimeError) as failure:
        wait_collective(work, BoundedStore(counting), "g/fault")
    waited = time.monotonic() - started
    assert not isinstance(failure.value, PeerLeftError), failure.value  # gloo's own timeout ended the wait
    assert HUNG_TIMEOUT_SEC - 0.5 <= waited < HUNG_TIMEOUT_SEC + SLACK_SEC
    assert counting.checks == 1  # the one check that never came back; none queued up behind it


def test_a_call_to_a_stopped_store_host_times_out_without_piling_up(store_host: StoreHost) -> None:
    store = BoundedStore(store_host.client())
    assert store.add("k", 1, timeout=5.0) == 1
    threads = threading.active_count()
    store_host.stop()
    deadline = 0.5
    for amount in (1, 10):  # the first call sticks on the store's thread; the second waits behind it
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError, match=r"did not finish within 0\.5 s"):
            store.add("k", amount, timeout=deadline)
        assert deadline - 0.05 <= time.monotonic() - started < deadline + SLACK_SEC
    assert threading.active_count() == threads  # no thread per call: the stuck one is the store's own
    store_host.resume()
    # the stuck call completes once the host answers; the queued one was cancelled and never ran
    assert store.add("k", 0, timeout=5.0) == 2
    store.close()


def idle_worker(port: int) -> Worker:
    """Rank 1 of a 2-rank instance whose store (hosted at ``port``) it reaches, outside of any group."""
    config = WorkerConfig(
        rank=1,
        dp_size=2,
        master_addr="127.0.0.1",
        master_port=port,
        bind_host="127.0.0.1",
        num_experts=4,
        num_redundant_experts=0,
        slots_per_rank=2,
        collective_timeout_sec=HUNG_TIMEOUT_SEC,
        startup_timeout_sec=10.0,
        rebuild_timeout_sec=10.0,
        seed=1,
        max_batch=4,
        idle_poll_interval_sec=0.02,
    )
    worker = Worker(config)
    worker._use_store(TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10)))
    worker.group_id = "g/"
    return worker


def test_a_hung_store_host_stalls_neither_the_idle_poll_nor_a_rank_with_traffic(
    store_host: StoreHost, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = idle_worker(store_host.port)
    assert worker._should_start_wave() is False  # a reachable store, nobody started a wave
    store_host.stop()
    for _ in range(2):  # idle: not a fault, and the loop gets back to its commands within the poll's deadline
        started = time.monotonic()
        assert worker._should_start_wave() is False
        assert time.monotonic() - started < IDLE_POLL_STORE_TIMEOUT_SEC + SLACK_SEC
    assert worker.last_poll_error is not None
    assert "did not finish" in worker.last_poll_error
    assert capsys.readouterr().err.count("idle store poll failed") == 1  # logged once, not once per poll

    worker.handle({"op": "submit", "rid": "r1", "tokens": [1, 2, 3], "max_tokens": 4})
    started = time.monotonic()
    with pytest.raises(StoreTimeoutError) as failure:  # traffic: the store stands for a collective
        worker._should_start_wave()
    assert HUNG_TIMEOUT_SEC - 0.05 <= time.monotonic() - started < HUNG_TIMEOUT_SEC + SLACK_SEC
    started = time.monotonic()
    worker._announce_fault()  # best effort, and short: the store it would tell is the hung one
    assert time.monotonic() - started < ANNOUNCE_STORE_TIMEOUT_SEC + SLACK_SEC
    worker._fault(failure.value)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["fault_info"] for e in events if e["ev"] == "fault"] == ["StoreTimeoutError"]


def test_the_store_host_killed_under_a_step_reports_the_fault_long_before_the_collective_timeout(
    store_host: StoreHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bad moment of the store host's death: a survivor in a step whose other peer is not in it (idle, or
    gone itself) waits in a collective that gloo ends only at its timeout. The wait stops at once (the store
    fails the check), and so must the fault's report: destroying that group on the loop would wait for gloo."""
    timeout_sec = 10.0
    _, groups = pair_of_groups(port=store_host.port, timeout_sec=timeout_sec)
    worker = idle_worker(store_host.port)  # rank 1; rank 0 (groups[0]) never joins the step
    worker.pg, worker.group_id = groups.pop(), "g/"  # the worker holds its group alone, as in its process
    worker.handle({"op": "submit", "rid": "r1", "tokens": [1, 2, 3], "max_tokens": 4})
    worker.in_wave = True
    capsys.readouterr()
    store_host.proc.kill()  # the store's host dies, its sockets closed by the kernel
    store_host.proc.wait(timeout=30)
    killed = time.monotonic()
    with pytest.raises(PeerLeftError, match="store host left") as failure:
        worker.step()
    worker._fault(failure.value)
    reported = time.monotonic() - killed
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["fault_info"] for e in events if e["ev"] == "fault"] == ["PeerLeftError"]
    assert reported < 2.0 < timeout_sec, f"the fault was reported {reported:.2f} s after the store host died"
    assert worker.pg is None
    assert worker.unfinished is None
    # the abandoned collective ends when its peer finally joins; the group is then destroyed off the loop
    released = threading.active_count()
    groups[0].allreduce([torch.zeros(2, 4, D_MODEL + 2, dtype=torch.float64)]).wait()
    deadline = time.monotonic() + 10.0
    while threading.active_count() >= released:
        assert time.monotonic() < deadline, "the abandoned group was never released"
        time.sleep(0.01)
