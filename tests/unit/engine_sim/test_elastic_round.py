"""One rank's elastic EP round over an in-memory store: the coordinator's waits as vLLM 0.34 words them."""

from __future__ import annotations

import time

import pytest

from heteroflow.contracts.engine_protocol import (
    ELASTIC_EP_ACTIVE_TEXT,
    ELASTIC_EP_BOOTSTRAP_TIMEOUT_TEXT,
    ELASTIC_EP_DRAIN_TIMEOUT_TEXT,
    ELASTIC_EP_PREPARE_TIMEOUT_TEXT,
    elastic_ep_ready_failed_text,
    elastic_ep_unexpected_rank_text,
)
from heteroflow.engine_sim.collectives import BoundedStore, StoreTimeoutError
from heteroflow.engine_sim.elastic import retires
from heteroflow.engine_sim.elastic_round import (
    FINISHED_TIMEOUT_TEXT,
    POLL_SEC,
    ElasticEpError,
    ElasticRound,
    await_old_ranks,
    await_old_ranks_commit,
    retry_store,
)
from heteroflow.engine_sim.elastic_store import ElasticStore, key


class MemoryStore:
    """The TCPStore calls the round uses, in memory."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, name: str, value: str | bytes) -> None:
        self.data[name] = value.encode() if isinstance(value, str) else value

    def get(self, name: str) -> bytes:
        return self.data[name]

    def check(self, names: list[str]) -> bool:
        return all(n in self.data for n in names)

    def add(self, name: str, value: int) -> int:
        total = int(self.data.get(name, b"0")) + value
        self.data[name] = str(total).encode()
        return total


class SlowOnceStore(MemoryStore):
    """A store whose next ``set`` or ``check`` times out once each time the test asks for it (a slow read)."""

    def __init__(self) -> None:
        super().__init__()
        self.slow: list[str] = []
        self.timed_out = 0

    def _maybe_slow(self, call: str) -> None:
        if call in self.slow:
            self.slow.remove(call)
            self.timed_out += 1
            raise StoreTimeoutError(f"store {call} did not finish within 0.5 s")

    def set(self, name: str, value: str | bytes) -> None:
        self._maybe_slow("set")
        super().set(name, value)

    def check(self, names: list[str]) -> bool:
        self._maybe_slow("check")
        return super().check(names)


@pytest.fixture
def store() -> ElasticStore:
    return ElasticStore(BoundedStore(MemoryStore()), timeout=1.0)


def _round(store: ElasticStore, rank: int, *, cur: int = 2, new: int = 3, epoch: str | None = None) -> ElasticRound:
    return ElasticRound(
        store=store, rank=rank, cur=cur, new=new, num_redundant_experts=8, slots_per_rank=4, timeout_sec=300.0,
        epoch=epoch, previous_epoch=None,
    )  # fmt: skip


def _step(op: ElasticRound, now: float, *, in_wave: bool = False) -> str | None:
    op.next_poll = 0.0  # every call of the test is a poll
    return op.poll(now, in_wave=in_wave)


def test_a_scale_up_prepares_once_every_new_rank_is_ready_and_switches_between_waves(store: ElasticStore) -> None:
    r0, r1 = _round(store, 0, epoch="e1"), _round(store, 1)
    r0.begin(0.0)
    r1.begin(0.0)
    assert _step(r1, 1.0) is None  # found the bootstrap: ready now
    assert (r1.stage, r1.epoch, r1.seen_epoch) == ("ready", "e1", "e1")
    assert _step(r0, 1.0) is None  # rank 2 is not ready yet
    store.mark("e1", "ready", 2)  # the launched rank
    assert _step(r0, 2.0) == "prepared"
    assert _step(r1, 2.0) == "prepared"
    r0.commit(3.0, timeout_sec=600.0)
    assert _step(r0, 3.5) is None  # rank 1 still drains
    r1.commit(4.0, timeout_sec=600.0)
    assert _step(r0, 4.5, in_wave=True) is None  # a step of the old group still runs
    assert _step(r0, 4.6) == "switch"
    assert not retires(rank=r0.rank, cur=r0.cur, new=r0.new)


def test_a_scale_down_retires_the_top_ranks_which_wait_without_getting_ready(store: ElasticStore) -> None:
    r0, r2 = _round(store, 0, cur=3, new=2, epoch="d"), _round(store, 2, cur=3, new=2)
    r0.begin(0.0)
    r2.begin(0.0)
    assert _step(r2, 0.5) is None
    assert not store.store.check([key("d", "ready", 2)], timeout=1.0)
    assert retires(rank=r2.rank, cur=r2.cur, new=r2.new)
    store.mark("d", "ready", 1)
    assert _step(r2, 1.0) == "prepared"


def test_rank_0_refuses_while_another_operation_is_neither_failed_nor_completed(store: ElasticStore) -> None:
    _round(store, 0, epoch="first").begin(0.0)
    with pytest.raises(ElasticEpError, match=ELASTIC_EP_ACTIVE_TEXT):
        _round(store, 0, epoch="second").begin(1.0)
    store.publish_error("first", "boom")
    _round(store, 0, epoch="second").begin(2.0)  # a failed operation does not block the next


def test_the_ready_barrier_and_the_bootstrap_wait_time_out_with_vllms_texts(store: ElasticStore) -> None:
    r1 = _round(store, 1)
    r1.begin(0.0)
    with pytest.raises(ElasticEpError, match=ELASTIC_EP_BOOTSTRAP_TIMEOUT_TEXT) as late:
        _step(r1, 301.0)
    assert late.value.timed_out
    r0 = _round(store, 0, epoch="t")
    r0.begin(0.0)
    with pytest.raises(ElasticEpError, match=ELASTIC_EP_PREPARE_TIMEOUT_TEXT):
        _step(r0, 301.0)


def test_a_completed_operation_is_never_taken_and_another_size_in_progress_fails(store: ElasticStore) -> None:
    done = _round(store, 0, epoch="old")
    done.begin(0.0)
    store.mark("old", "completed")
    r1 = _round(store, 1)
    r1.begin(1.0)
    assert _step(r1, 2.0) is None
    assert r1.stage == "bootstrap"
    _round(store, 0, cur=2, new=4, epoch="other").begin(3.0)
    with pytest.raises(RuntimeError, match="already in progress for target dp size 4"):
        _step(r1, 4.0)


def test_an_unexpected_rank_fails_rank_0_with_its_text_and_the_others_with_the_wrapped_one(
    store: ElasticStore,
) -> None:
    r0, r1 = _round(store, 0, epoch="u"), _round(store, 1)
    r0.begin(0.0)
    r1.begin(0.0)
    _step(r1, 0.5)
    store.publish_error("u", elastic_ep_unexpected_rank_text(5))
    with pytest.raises(RuntimeError) as on_0:
        _step(r0, 1.0)
    assert str(on_0.value) == "Received scale-up handshake from unexpected dp rank 5"
    with pytest.raises(RuntimeError) as on_1:
        _step(r1, 1.0)
    assert str(on_1.value) == elastic_ep_ready_failed_text("Received scale-up handshake from unexpected dp rank 5")


def test_the_commit_barrier_times_out_as_the_drain_wait(store: ElasticStore) -> None:
    r0 = _round(store, 0, epoch="c")
    r0.begin(0.0)
    for rank in (1, 2):
        store.mark("c", "ready", rank)
    assert _step(r0, 1.0) == "prepared"
    r0.commit(2.0, timeout_sec=600.0)
    with pytest.raises(ElasticEpError, match=ELASTIC_EP_DRAIN_TIMEOUT_TEXT):
        _step(r0, 603.0)


def test_polls_are_spaced(store: ElasticStore) -> None:
    r1 = _round(store, 1)
    r1.begin(0.0)
    assert r1.poll(1.0, in_wave=False) is None
    assert r1.next_poll == pytest.approx(1.0 + POLL_SEC)
    _round(store, 0, epoch="p").begin(1.01)
    assert r1.poll(1.05, in_wave=False) is None  # too early: not read
    stages = [r1.stage]
    assert r1.poll(1.2, in_wave=False) is None
    stages.append(r1.stage)
    assert stages == ["bootstrap", "ready"]


def test_a_launched_rank_and_rank_0_retry_a_store_call_that_timed_out_until_the_deadline() -> None:
    raw = SlowOnceStore()
    store = ElasticStore(BoundedStore(raw), timeout=1.0)
    deadline = time.monotonic() + 30.0
    raw.slow.append("set")  # the launched rank's "ready" mark
    retry_store(lambda: store.mark("s", "ready", 2), deadline=deadline, timeout_text=ELASTIC_EP_PREPARE_TIMEOUT_TEXT)
    assert raw.check([key("s", "ready", 2)])
    for rank in (0, 1):
        store.mark("s", "commit_ready", rank)
        store.mark("s", "finished", rank)
    raw.slow.append("check")  # the launched rank's read of the old ranks' commit marks
    await_old_ranks_commit(store, epoch="s", cur=2, deadline=deadline)
    raw.slow.append("check")  # rank 0's read of the old ranks' "finished" marks, after the switch
    await_old_ranks(
        store, epoch="s", what="finished", cur=2, deadline=deadline, timeout_text=FINISHED_TIMEOUT_TEXT, poll_sec=0.01
    )
    assert raw.timed_out == 3


def test_a_store_that_keeps_timing_out_fails_at_the_operations_deadline_with_vllms_text() -> None:
    raw = SlowOnceStore()
    store = ElasticStore(BoundedStore(raw), timeout=1.0)
    raw.slow.extend(["check"] * 1000)
    with pytest.raises(ElasticEpError, match=FINISHED_TIMEOUT_TEXT) as late:
        await_old_ranks(
            store, epoch="s", what="finished", cur=2, deadline=time.monotonic() + 0.05,
            timeout_text=FINISHED_TIMEOUT_TEXT, poll_sec=0.01,
        )  # fmt: skip
    assert late.value.timed_out
    assert raw.timed_out > 1  # tried again until the deadline
