"""One rank's elastic EP operation up to the group switch: the waits of vLLM 0.34's external-LB coordinator over
the keys of :mod:`.elastic_store` (no torch, no group).

The worker (:mod:`.worker`, through :mod:`.elastic_worker`) advances an :class:`ElasticRound` from its loop, so
that the old group keeps stepping in lockstep while the operation waits; when :meth:`ElasticRound.poll` says
``"switch"`` the worker leaves the old group and joins the new one. A scale-up-launched rank waits at start with
:func:`await_scale_up_bootstrap` and :func:`await_old_ranks_commit`. File:line references are to
``distributed/elastic_ep/external_elastic_ep.py`` of the vLLM 0.34.0 wheel.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from heteroflow.contracts.engine_protocol import (
    ELASTIC_EP_ACTIVE_TEXT,
    ELASTIC_EP_BOOTSTRAP_TIMEOUT_TEXT,
    ELASTIC_EP_DRAIN_TIMEOUT_TEXT,
    ELASTIC_EP_PREPARE_TIMEOUT_TEXT,
    elastic_ep_ready_failed_text,
    elastic_ep_unexpected_rank_text,
)
from heteroflow.engine_sim.collectives import StoreTimeoutError
from heteroflow.engine_sim.elastic import launched_ranks
from heteroflow.engine_sim.elastic_store import Bootstrap, ElasticStore

POLL_SEC = 0.1
"""How often a rank reads the keys of an operation under way (vLLM polls with a 0.1-0.8 s backoff, L30)."""
UNEXPECTED_RANK_PREFIX = elastic_ep_unexpected_rank_text(0).rsplit(" ", 1)[0]

Stage = Literal["bootstrap", "ready", "prepared", "commit"]
_T = TypeVar("_T")


class ElasticEpError(RuntimeError):
    """An elastic EP operation failed on this rank; ``timed_out`` for vLLM's ``TimeoutError``s (HTTP 408)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def past_deadline(now: float, deadline: float, timeout_text: str) -> None:
    """A store call timed out (one slow read): tolerated until the operation's own ``deadline``, then vLLM's
    ``TimeoutError`` with ``timeout_text``."""
    if now > deadline:
        raise ElasticEpError(timeout_text, timed_out=True) from None


def retry_store(call: Callable[[], _T], *, deadline: float, timeout_text: str) -> _T:
    """One store call, tried again after a :class:`StoreTimeoutError` until ``deadline`` (see
    :func:`past_deadline`)."""
    while True:
        try:
            return call()
        except StoreTimeoutError:
            past_deadline(time.monotonic(), deadline, timeout_text)


FINISHED_TIMEOUT_TEXT = "Timed out waiting for all old ranks to finish external Elastic EP scaling."
"""Rank 0's wait for every old rank's switch (``_wait_for_all_old_ranks``, L559-591)."""


def await_old_ranks(
    store: ElasticStore,
    *,
    epoch: str,
    what: str,
    cur: int,
    deadline: float,
    timeout_text: str,
    poll_sec: float,
    failure_prefix: str = "",
) -> None:
    """Wait until every old rank (``range(cur)``) marked ``what``; a failure published for the operation raises
    :class:`ElasticEpError` (``failure_prefix`` + the failure), and so does ``deadline`` (a store call that timed
    out is tried again until then)."""
    while True:
        try:
            error = store.error(epoch)
            if error is not None:
                raise ElasticEpError(f"{failure_prefix}{error}")
            if store.all_marked(epoch, what, range(cur)):
                return
        except StoreTimeoutError:
            pass
        past_deadline(time.monotonic(), deadline, timeout_text)
        time.sleep(poll_sec)  # polling the peers' keys with the deadline above


def _timeout_text(stage: Stage) -> str:
    if stage == "bootstrap":
        return ELASTIC_EP_BOOTSTRAP_TIMEOUT_TEXT
    if stage == "commit":
        return ELASTIC_EP_DRAIN_TIMEOUT_TEXT
    return ELASTIC_EP_PREPARE_TIMEOUT_TEXT


@dataclass
class ElasticRound:
    """One rank's part in one operation, from the prepare command to the switch.

    Stages: ``bootstrap`` (waiting for rank 0's epoch), ``ready`` (the ready barrier over ``range(new)``),
    ``prepared`` (waiting for this rank's commit command), ``commit`` (the commit barrier over ``range(cur)``)."""

    store: ElasticStore
    rank: int
    cur: int
    new: int
    num_redundant_experts: int
    slots_per_rank: int
    timeout_sec: float
    """The bootstrap wait's and the ready barrier's deadline, each (vLLM: 300 s, L362 and L488)."""
    epoch: str | None
    """Rank 0's own epoch; on the other ranks the one they find (``None`` until then)."""
    previous_epoch: str | None
    """The epoch this rank last took part in: never taken for a new operation (vLLM's ``active_epoch``)."""
    stage: Stage = "bootstrap"
    deadline: float = 0.0
    next_poll: float = 0.0
    seen_epoch: str | None = None
    """The epoch this rank has now taken part in, failed or not (the next operation's ``previous_epoch``)."""

    def begin(self, now: float) -> None:
        """Rank 0 publishes the epoch and its bootstrap at once (L699-716), refusing while another operation is
        neither failed nor completed (L418-427); every other rank waits for them (L717-723). Raises on failure."""
        self.deadline = now + self.timeout_sec
        current = self.store.current()
        if self.rank == 0:
            if current is not None and current.error is None and not current.completed:
                raise ElasticEpError(ELASTIC_EP_ACTIVE_TEXT)
            if self.epoch is None:
                raise ElasticEpError("rank 0 prepares a resize without an epoch")
            bootstrap = Bootstrap(
                cur=self.cur, new=self.new, num_redundant_experts=self.num_redundant_experts,
                slots_per_rank=self.slots_per_rank,
            )  # fmt: skip
            self.store.publish(self.epoch, bootstrap)
            self._got_bootstrap(self.epoch, now)
        elif current is not None and current.completed:
            self.previous_epoch = current.epoch  # a completed operation is never taken for the new one (L370-373)

    def _got_bootstrap(self, epoch: str, now: float) -> None:
        """This rank knows the epoch: a rank of ``range(new)`` is ready (vLLM: once its engine reinitialised,
        L738-741); the ready barrier's own deadline starts (L491-492)."""
        self.epoch = self.seen_epoch = epoch
        if self.rank < self.new:
            self.store.mark(epoch, "ready", self.rank)
        self.stage = "ready"
        self.deadline = now + self.timeout_sec

    def poll(self, now: float, *, in_wave: bool) -> Literal["prepared", "switch"] | None:
        """Advance the operation: ``"prepared"`` once every rank of ``range(new)`` is ready, ``"switch"`` once every
        old rank is ready to commit and no step of the old group runs; raises on failure."""
        if now < self.next_poll or self.stage == "prepared":
            return None
        self.next_poll = now + POLL_SEC
        try:
            if self.stage == "bootstrap":
                self._poll_bootstrap(now)
                return None
            if self.stage == "ready":
                return self._poll_ready(now)
            return self._poll_commit(now, in_wave=in_wave)
        except StoreTimeoutError:
            past_deadline(now, self.deadline, _timeout_text(self.stage))
            return None

    def _poll_bootstrap(self, now: float) -> None:
        """vLLM's ``_wait_for_bootstrap`` (L358-408): a new epoch with an error fails; one prepared for another
        size and not completed fails; a prepared one for this size is taken."""
        current = self.store.current()
        if current is not None and current.epoch != self.previous_epoch:
            if current.error is not None:
                self.seen_epoch = current.epoch
                raise RuntimeError(current.error)
            boot = current.bootstrap
            if boot is not None and boot.new != self.new:
                if current.prepared and not current.completed:
                    raise RuntimeError(
                        "A different external Elastic EP scaling operation is already in progress for target "
                        f"dp size {boot.new}."
                    )
            elif boot is not None and current.prepared:
                self.num_redundant_experts = boot.num_redundant_experts
                self._got_bootstrap(current.epoch, now)
                return
        if now > self.deadline:
            raise ElasticEpError(ELASTIC_EP_BOOTSTRAP_TIMEOUT_TEXT, timed_out=True)

    def _poll_ready(self, now: float) -> Literal["prepared"] | None:
        """vLLM's ``_wait_for_ready_ranks`` (L481-515): every rank of ``range(new)``, 300 s."""
        assert self.epoch is not None
        error = self.store.error(self.epoch)
        if error is not None:
            if self.rank == 0 and error.startswith(UNEXPECTED_RANK_PREFIX):
                raise RuntimeError(error)  # rank 0's own handshake server raised it (raise_if_failed, L497-498)
            raise RuntimeError(elastic_ep_ready_failed_text(error))
        if self.store.all_marked(self.epoch, "ready", range(self.new)):
            self.stage = "prepared"
            return "prepared"
        if now > self.deadline:
            raise ElasticEpError(ELASTIC_EP_PREPARE_TIMEOUT_TEXT, timed_out=True)
        return None

    def commit(self, now: float, *, timeout_sec: float) -> None:
        """This old rank drained: ready to commit (``commit_ready/{rank}``, L633-636). Raises on failure."""
        if self.stage != "prepared" or self.epoch is None:
            raise ElasticEpError("External Elastic EP scaling has not been prepared.")
        self.stage = "commit"
        self.deadline = now + timeout_sec
        self.store.mark(self.epoch, "commit_ready", self.rank)

    def _poll_commit(self, now: float, *, in_wave: bool) -> Literal["switch"] | None:
        """vLLM's ``_wait_for_commit_ready`` (L628-655) over the old ranks; the switch only between waves."""
        assert self.epoch is not None
        error = self.store.error(self.epoch)
        if error is not None:
            raise RuntimeError(error)
        if not self.store.all_marked(self.epoch, "commit_ready", range(self.cur)):
            if now > self.deadline:
                raise ElasticEpError(ELASTIC_EP_DRAIN_TIMEOUT_TEXT, timed_out=True)
            return None
        # a peer still finishing its running requests (pause mode "wait") steps with this rank first
        return None if in_wave else "switch"

    def publish_failure(self, message: str) -> None:
        """Publish this rank's failure for the others (L607-619, L761-783); best effort."""
        if self.epoch is not None:
            self.store.publish_error(self.epoch, message)


def await_scale_up_bootstrap(store: ElasticStore, *, rank: int, deadline: float) -> tuple[str, Bootstrap]:
    """A rank launched with ``VLLM_ELASTIC_EP_SCALE_UP_LAUNCH=1`` waits for a prepared operation that is neither
    completed nor failed (rank 0's handshake, ``v1/engine/core.py`` L1593-1598). A rank outside
    ``range(cur, new)`` fails that operation with vLLM's text (L144-150) and, unanswered as in vLLM, waits on
    until ``deadline``. Raises ``TimeoutError`` at the deadline."""
    refused: set[str] = set()
    while time.monotonic() <= deadline:
        try:
            current = store.current()
        except StoreTimeoutError:
            current = None
        boot = None if current is None else current.bootstrap
        if current is not None and boot is not None and current.prepared and not current.completed:
            if current.error is None and rank in launched_ranks(cur=boot.cur, new=boot.new):
                return current.epoch, boot
            if current.error is None and current.epoch not in refused:
                refused.add(current.epoch)
                store.publish_error(current.epoch, elastic_ep_unexpected_rank_text(rank))
        time.sleep(POLL_SEC)  # polling rank 0's keys with the deadline above
    raise TimeoutError("no scale-up handshake from rank 0")


def await_old_ranks_commit(store: ElasticStore, *, epoch: str, cur: int, deadline: float) -> None:
    """The launched rank got ready: wait until every old rank is ready to commit (then all switch together);
    raises :class:`ElasticEpError` on the operation's failure or at ``deadline``."""
    await_old_ranks(
        store, epoch=epoch, what="commit_ready", cur=cur, deadline=deadline,
        timeout_text=ELASTIC_EP_DRAIN_TIMEOUT_TEXT, poll_sec=POLL_SEC,
        failure_prefix="the scale-up this rank was launched for failed: ",
    )  # fmt: skip
