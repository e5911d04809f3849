"""One rank's side of vLLM 0.34's elastic EP in its worker (:mod:`.worker`): the ``eep_prepare`` and ``eep_commit``
commands, the operation advanced from the worker's loop, the switch of the group (a remaining rank joins the new
one with the new layout, a retiring one leaves for good) and a scale-up-launched rank's start (the wait for rank 0's
bootstrap and the old ranks' commit).

The waits of the operation are :mod:`.elastic_round`'s (no torch, no group) over the keys of :mod:`.elastic_store`;
the group is the worker's, reached through the narrow :class:`ResizableGroup`. The outcomes leave as the worker's
``eep_prepared`` and ``eep_committed`` events (:mod:`.process_backend` reads them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from heteroflow.contracts.engine_protocol import ELASTIC_EP_ACTIVE_TEXT, ELASTIC_EP_PREPARE_TIMEOUT_TEXT
from heteroflow.engine_sim.collectives import BoundedStore, RebuildError, StoreTimeoutError
from heteroflow.engine_sim.elastic import retires
from heteroflow.engine_sim.elastic_round import (
    FINISHED_TIMEOUT_TEXT,
    ElasticEpError,
    ElasticRound,
    await_old_ranks,
    await_old_ranks_commit,
    await_scale_up_bootstrap,
    retry_store,
)
from heteroflow.engine_sim.elastic_store import ElasticStore
from heteroflow.engine_sim.placement import ExpertPlacement

ELASTIC_STORE_TIMEOUT_SEC = 0.5
"""Deadline of one elastic EP store read: a store that does not answer is "not yet", until the operation's own."""

Emit = Callable[[dict[str, Any]], None]
"""Send one event to the API server (a JSON line on the worker's stdout)."""
Log = Callable[[str], None]
"""Write one line to the worker's log (stderr)."""


class ResizableGroup(Protocol):
    """What the elastic EP side needs of the worker's group."""

    @property
    def bounded_store(self) -> BoundedStore:
        """The group's TCP store, every call under a deadline."""
        ...

    def connect_launch_store(self, timeout: float) -> None:
        """Use the launch store (``master_addr:master_port``), connecting within ``timeout`` seconds."""

    def drop_group(self) -> None:
        """Leave the current process group (none is fine)."""

    def retire(self) -> None:
        """After :meth:`drop_group`: this rank belongs to no group any more."""

    def join_resized_group(
        self, epoch: str, *, new: int, num_redundant_experts: int, slots_per_rank: int
    ) -> ExpertPlacement:
        """Form the group over ``range(new)`` and load this rank's experts of the new layout."""
        ...


class ElasticEpRank:
    """The elastic EP operation this rank takes part in (an :class:`ElasticRound` while one runs) and the epoch it
    last took part in (vLLM's ``active_epoch``, never taken for a new operation)."""

    def __init__(self, group: ResizableGroup, *, rank: int, rebuild_timeout_sec: float, emit: Emit, log: Log) -> None:
        self._group = group
        self._rank = rank
        self._rebuild_timeout_sec = rebuild_timeout_sec
        self._emit = emit
        self._log = log
        self.round: ElasticRound | None = None
        self.active_epoch: str | None = None

    def _store(self) -> ElasticStore:
        return ElasticStore(self._group.bounded_store, timeout=ELASTIC_STORE_TIMEOUT_SEC)

    def prepare(self, cmd: dict[str, Any]) -> None:
        """Start this rank's part in a resize (:class:`~heteroflow.engine_sim.elastic_round.ElasticRound`)."""
        if self.round is not None:
            self._emit({"ev": "eep_prepared", "epoch": cmd.get("epoch"), "ok": False, "error": ELASTIC_EP_ACTIVE_TEXT})
            return
        self.round = ElasticRound(
            store=self._store(),
            rank=self._rank,
            cur=int(cmd["cur"]),
            new=int(cmd["new"]),
            num_redundant_experts=int(cmd["num_redundant_experts"]),
            slots_per_rank=int(cmd["slots_per_rank"]),
            timeout_sec=float(cmd["timeout_sec"]),
            epoch=cmd.get("epoch"),
            previous_epoch=self.active_epoch,
        )
        try:
            self.round.begin(time.monotonic())
        except Exception as exc:  # every failure of the prepare is this operation's outcome
            self._failed(exc, event="eep_prepared")
        finally:
            self._track_epoch()

    def commit(self, timeout_sec: float) -> None:
        op = self.round
        if op is None:
            self._emit(
                {"ev": "eep_committed", "ok": False, "error": "External Elastic EP scaling has not been prepared."}
            )
            return
        try:
            op.commit(time.monotonic(), timeout_sec=timeout_sec)
        except Exception as exc:  # the commit fails with the store's error
            self._failed(exc, event="eep_committed")

    def _track_epoch(self) -> None:
        if self.round is not None and self.round.seen_epoch is not None:
            self.active_epoch = self.round.seen_epoch

    def _failed(self, exc: BaseException, *, event: str) -> None:
        """Report the operation's failure (``event``: the stage's outcome) and publish it for the other ranks."""
        op, self.round = self.round, None
        message = str(exc) or type(exc).__name__
        if op is not None:
            if op.seen_epoch is not None:
                self.active_epoch = op.seen_epoch
            with contextlib.suppress(Exception):
                op.publish_failure(message)
        self._log(f"elastic EP {event} failed: {message}")
        timed_out = isinstance(exc, ElasticEpError) and exc.timed_out
        outcome: dict[str, Any] = {"ev": event, "ok": False, "error": message[:500], "timed_out": timed_out}
        if event == "eep_prepared":
            outcome["epoch"] = None if op is None else op.epoch
        self._emit(outcome)

    def poll(self, *, in_wave: bool) -> None:
        """Advance the operation under way, if any (the worker's loop calls this each turn)."""
        op = self.round
        if op is None:
            return
        event = "eep_committed" if op.stage == "commit" else "eep_prepared"
        try:
            outcome = op.poll(time.monotonic(), in_wave=in_wave)
            self._track_epoch()
            if outcome == "prepared":
                self._emit({"ev": "eep_prepared", "epoch": op.epoch, "ok": True})
            elif outcome == "switch":
                self._switch(op)
        except Exception as exc:  # the operation's failure, reported to the API server
            self._failed(exc, event=event)

    def _switch(self, op: ElasticRound) -> None:
        """Commit: a remaining rank builds the group over ``range(new)`` with the new layout, a retiring one
        leaves (``reinitialize_distributed`` with ``SHUTDOWN_CURRENT_RANK``, ``external_elastic_ep.py``
        L807-816); rank 0 waits for every old rank to finish and marks the operation completed (L826-834)."""
        assert op.epoch is not None
        epoch, store = op.epoch, op.store
        self._group.drop_group()

        def mark(what: str, rank: int | None = None) -> None:
            deadline = time.monotonic() + self._rebuild_timeout_sec  # a slow store is tried again until then
            retry_store(lambda: store.mark(epoch, what, rank), deadline=deadline, timeout_text=FINISHED_TIMEOUT_TEXT)

        if retires(rank=op.rank, cur=op.cur, new=op.new):
            self._group.retire()
            mark("finished", self._rank)
            self.round = None
            self._log(f"elastic EP {epoch}: rank {self._rank} retired")
            self._emit({"ev": "eep_committed", "ok": True, "retired": True})
            return
        placement = self._group.join_resized_group(
            epoch, new=op.new, num_redundant_experts=op.num_redundant_experts, slots_per_rank=op.slots_per_rank
        )
        mark("finished", self._rank)
        if self._rank == 0:
            await_old_ranks(
                store, epoch=epoch, what="finished", cur=op.cur, deadline=time.monotonic() + self._rebuild_timeout_sec,
                timeout_text=FINISHED_TIMEOUT_TEXT, poll_sec=0.01,
            )  # fmt: skip
            mark("completed")
        self.round = None
        self._emit({"ev": "eep_committed", "ok": True, "placement": placement.describe()})

    def join_scale_up(self, *, handshake_timeout_sec: float) -> None:
        """A rank launched with ``VLLM_ELASTIC_EP_SCALE_UP_LAUNCH=1``: wait (``handshake_timeout_sec``, vLLM's
        5 minutes, ``v1/engine/core.py`` L1593-1598) for rank 0's bootstrap, get ready, wait for the old ranks'
        commit and join the new group with the bootstrap's layout (``core.py`` L1601-1629)."""
        deadline = time.monotonic() + handshake_timeout_sec
        timeout_text = f"Did not receive response from front-end process within {handshake_timeout_sec / 60:g} minutes"
        try:
            self._group.connect_launch_store(handshake_timeout_sec)
            store = self._store()
            self._log(f"elastic EP: launched rank {self._rank} waits for rank 0's scale-up handshake")
            epoch, boot = await_scale_up_bootstrap(store, rank=self._rank, deadline=deadline)
        except (TimeoutError, RuntimeError, StoreTimeoutError) as exc:
            raise RebuildError(timeout_text) from exc
        commit_deadline = time.monotonic() + max(handshake_timeout_sec, self._rebuild_timeout_sec)
        retry_store(
            lambda: store.mark(epoch, "ready", self._rank),
            deadline=commit_deadline,
            timeout_text=ELASTIC_EP_PREPARE_TIMEOUT_TEXT,
        )
        self._log(f"elastic EP {epoch}: launched rank {self._rank} ready, waiting for the old ranks' commit")
        await_old_ranks_commit(store, epoch=epoch, cur=boot.cur, deadline=commit_deadline)
        self.active_epoch = epoch
        # the old ranks run no probe collective after their switch: the group's creation is the rendezvous
        self._group.join_resized_group(
            epoch, new=boot.new, num_redundant_experts=boot.num_redundant_experts, slots_per_rank=boot.slots_per_rank
        )
