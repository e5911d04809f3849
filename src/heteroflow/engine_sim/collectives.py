"""The group's TCP store and collectives as a simulated rank's worker loop uses them: deadlines and early faults.

Every store call of the worker loop has a deadline (:class:`BoundedStore`): a TCPStore client call to a host
that stopped (a hung rank hosting the store) would otherwise block without limit, and every rank would sit in
it instead of failing its collective after the collective timeout.

A rank whose collective fails leaves the group and says so in the TCP store (``<group>fault``). Peers blocked
in a collective on it would otherwise wait for the collective timeout whenever gloo keeps its side of the
connection open (it does when the failed operation still references the transport): a collective that has not
finished after :data:`FAULT_CHECK_AFTER_SEC` looks at that key every :data:`FAULT_CHECK_EVERY_SEC` and fails at
once when a peer has left, or when the store itself fails the check: the store lives in min(alive)'s worker, so
its host has died (and could not announce it). A healthy step never reads the store. gloo itself still waits in
such a collective until its timeout, and a gloo group is destroyed only once its collectives ended, so the rank
lets go of that group on a thread of its own (:func:`release_when_finished`): the fault is reported and the
loop takes commands at once, not at the collective timeout.
"""

from __future__ import annotations

import contextlib
import gc
import queue
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar

FAULT_CHECK_AFTER_SEC = 0.2
"""A collective still running after this long starts looking for a peer that left the group."""
FAULT_CHECK_EVERY_SEC = 0.05

_T = TypeVar("_T")


class RebuildError(RuntimeError):
    """A rebuild that cannot complete (store, peers, expert slots, disagreement)."""


class CheckinError(RebuildError):
    """Not every member of the round arrived within the round's check-in (vLLM 0.34): failed before the vote."""


class PeerLeftError(RuntimeError):
    """A peer left the group while this rank waited in a collective with it."""


class StoreTimeoutError(RuntimeError):
    """A TCP store call that did not finish within its deadline: the store's host is hung or unreachable."""


class BoundedStore:
    """The worker loop's access to the group's TCP store: every call has a deadline.

    A TCPStore client call to a host that stopped answering (SIGSTOP) blocks without limit, whatever the store's
    own timeout says, and releases the GIL while it does. So the calls run one at a time on this object's one
    daemon thread, and the caller waits for each with a deadline: a call that misses it is cancelled if it has
    not started yet, and the caller gets :class:`StoreTimeoutError`. A call that did start stays on the thread
    until the host answers or goes away; calls behind it wait in the queue and miss their own deadlines, so at
    most one thread is ever stuck and nothing piles up. Once the host answers, the stuck call completes and
    later calls work again.

    Only the loop's own calls go through here: gloo is given the raw store (:attr:`raw`), which it uses itself
    while it creates a group.
    """

    def __init__(self, raw: Any) -> None:
        self.raw = raw  # a TCPStore, or anything with its add, set and check
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        # a daemon thread, not a ThreadPoolExecutor: the interpreter joins an executor's threads when it exits,
        # and a stuck one would keep the worker from exiting
        threading.Thread(target=self._serve, name="store-calls", daemon=True).start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn = call
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up before it started
            try:
                result = fn()
            except BaseException as exc:  # handed to the caller, who decides
                future.set_exception(exc)
            else:
                future.set_result(result)

    def _submit(self, fn: Callable[[], _T]) -> Future[_T]:
        future: Future[_T] = Future()
        self._calls.put((future, fn))
        return future

    def _call(self, what: str, fn: Callable[[], _T], timeout: float) -> _T:
        limit = max(timeout, 0.0)
        future = self._submit(fn)
        try:
            return future.result(timeout=limit)
        except FutureTimeoutError:
            future.cancel()  # not started: it never runs; started: it finishes on its own, result dropped
            raise StoreTimeoutError(f"store {what} did not finish within {limit:.3g} s") from None

    def add(self, key: str, value: int, *, timeout: float) -> int:
        """``store.add(key, value)``; :class:`StoreTimeoutError` after ``timeout`` seconds."""
        return int(self._call("add", lambda: self.raw.add(key, value), timeout))

    def set(self, key: str, value: str, *, timeout: float) -> None:
        """``store.set(key, value)``; :class:`StoreTimeoutError` after ``timeout`` seconds."""
        self._call("set", lambda: self.raw.set(key, value), timeout)

    def check(self, keys: list[str], *, timeout: float) -> bool:
        """``store.check(keys)``: every key is set; :class:`StoreTimeoutError` after ``timeout`` seconds."""
        return bool(self._call("check", lambda: self.raw.check(keys), timeout))

    def get(self, key: str, *, timeout: float) -> str:
        """``store.get(key)`` of a key known to be set, decoded; :class:`StoreTimeoutError` after ``timeout``."""
        return bytes(self._call("get", lambda: self.raw.get(key), timeout)).decode()

    def submit_check(self, keys: list[str]) -> Future[bool]:
        """``store.check(keys)`` without waiting for it: the caller looks at the future when it suits it."""
        return self._submit(lambda: bool(self.raw.check(keys)))

    def close(self) -> None:
        """Let the thread end once the calls already queued are done (a stuck one: once its host answers)."""
        self._calls.put(None)


def wait_collective(work: Any, store: BoundedStore, fault_key: str) -> None:
    """``work.wait()``, except that a peer announcing (``fault_key`` in ``store``) that it left the group, or the
    store's host going away (the check fails), fails the wait at once: :class:`PeerLeftError`. The store is read
    only once the collective has run for
    :data:`FAULT_CHECK_AFTER_SEC`, so a healthy step never touches it, and the wait never blocks on the store:
    a check that does not answer (a hung store host) stays in flight while the collective's own timeout ends
    the wait."""
    finished: Future[None] = Future()
    work.get_future().add_done_callback(lambda _: finished.set_result(None))  # on success and on error alike
    wait_futures([finished], timeout=FAULT_CHECK_AFTER_SEC)  # a healthy step wakes the moment it finishes
    check: Future[bool] | None = None
    try:
        while not finished.done():
            if check is None:
                check = store.submit_check([fault_key])
            either: list[Future[Any]] = [finished, check]
            wait_futures(either, timeout=FAULT_CHECK_EVERY_SEC, return_when=FIRST_COMPLETED)
            if not check.done():
                continue  # the store has not answered yet: look again at the next poll, never submit twice
            # the store lives in min(alive)'s worker: a store that fails the check (its host closed or refused
            # the connection) is a member gone, exactly like an announced fault, and a member that died hosting
            # the store could not announce anything. A store that does not answer (a hung host) says nothing:
            # the collective's own timeout ends that wait.
            error = check.exception()
            if error is not None:
                raise PeerLeftError(f"the group's store host left during a collective: {error}") from error
            if check.result():
                raise PeerLeftError(f"a peer left the group during a collective ({fault_key})")
            check = None
            wait_futures([finished], timeout=FAULT_CHECK_EVERY_SEC)
    finally:
        if check is not None:
            check.cancel()  # still queued behind a stuck call: it never runs
    work.wait()  # raises the collective's own error, if any


def release_when_finished(pg: Any, unfinished: Any) -> None:
    """Destroy ``pg`` once its collective ``unfinished`` has ended, on a daemon thread of its own.

    A gloo group's destructor waits for the collectives still running in it, and one that a peer never joins
    ends only at the collective timeout. A :class:`PeerLeftError` leaves exactly such a collective behind (the
    wait stopped early, gloo did not): destroying that group on the worker loop would hold the loop, the fault
    event and every command after it for the whole collective timeout. The thread keeps the group referenced,
    so no garbage collection on another thread destroys it either; it ends, with the group, at the collective's
    own timeout at the latest."""

    def release() -> None:
        nonlocal pg, unfinished
        with contextlib.suppress(Exception):  # the collective's own error: nobody waits for it any more
            unfinished.wait()
        pg = unfinished = None
        gc.collect()

    threading.Thread(target=release, name="group-release", daemon=True).start()
