"""The worker subprocess of one simulated DP rank: model shard, gloo group, forward steps, rebuilds.

Run as ``python -m heteroflow.engine_sim.worker '<json config>'`` by
:class:`~heteroflow.engine_sim.process_backend.ProcessWorkerBackend`. Commands arrive as JSON lines on
stdin, events leave as JSON lines on stdout (logs go to stderr). If stdin closes (the API server died) the
worker exits at once, so a killed rank never leaves an orphan in the group.

Lockstep like vLLM's DP engines: all ranks step together while any rank has work (a *wave*), idle ranks
run empty steps, and every step is a collective, so a dead or hung peer is noticed only under traffic.
A rank that gets work while idle bumps a wave counter in the TCP store; idle ranks poll it and join. Each
step all-reduces every rank's tokens and counts (the final step, with no work anywhere, ends the wave for
all ranks at once and agrees on the counter), then all-reduces the MoE outputs: every logical expert is
computed on its one active replica.

How a collective fails early when a peer leaves (the ``<group>fault`` key, the store host's death), why every
store call has a deadline and how a group left with a running collective is let go: :mod:`.collectives`.
vLLM 0.34's elastic EP (the prepare and commit commands, the operation advanced from the loop, a scale-up-launched
rank's start) is :mod:`.elastic_worker`, which gets the worker's group through its ``ResizableGroup`` port.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, ReduceOp, TCPStore

from heteroflow.contracts.engine_protocol import checkin_failure_text
from heteroflow.engine_sim.collectives import (
    BoundedStore,
    CheckinError,
    PeerLeftError,
    RebuildError,
    StoreTimeoutError,
    release_when_finished,
    wait_collective,
)
from heteroflow.engine_sim.elastic_worker import ElasticEpRank
from heteroflow.engine_sim.model import D_MODEL, ExpertShard, TinyMoE
from heteroflow.engine_sim.placement import (
    ExpertPlacement,
    InsufficientExpertSlotsError,
    initial_placement,
    remove_ranks,
)

_out_lock = threading.Lock()

IDLE_POLL_STORE_TIMEOUT_SEC = 0.5
"""Deadline of the idle wave poll. An unreachable store while idle is not a fault, so the poll only has to give
the loop back soon enough to pick up commands (a request, a rebuild) at this pace."""
ANNOUNCE_STORE_TIMEOUT_SEC = 0.5
"""Deadline of announcing a fault (both store calls together): best effort, the fault is reported anyway."""


def emit(event: dict[str, Any]) -> None:
    line = json.dumps(event, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def log(message: str) -> None:
    sys.stderr.write(f"[engine-sim worker pid={os.getpid()}] {message}\n")
    sys.stderr.flush()


@dataclass
class Generation:
    rid: str
    h: torch.Tensor
    max_tokens: int
    produced: int = 0


@dataclass(frozen=True)
class WorkerConfig:
    rank: int
    dp_size: int
    master_addr: str
    master_port: int
    bind_host: str
    num_experts: int
    num_redundant_experts: int
    slots_per_rank: int
    collective_timeout_sec: float
    startup_timeout_sec: float
    rebuild_timeout_sec: float
    seed: int
    max_batch: int
    idle_poll_interval_sec: float
    scale_up_launch: bool = False
    handshake_timeout_sec: float = 300.0

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        raw = json.loads(text)
        return cls(**raw)


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.cfg = config
        self.commands: queue.Queue[dict[str, Any]] = queue.Queue()
        self.model = TinyMoE(seed=config.seed, num_experts=config.num_experts)
        # a scale-up-launched rank holds no expert until rank 0's bootstrap tells it the layout
        self.placement: ExpertPlacement = (
            ExpertPlacement(num_experts=config.num_experts, slots_per_rank=1, slots=())
            if config.scale_up_launch
            else initial_placement(
                dp_size=config.dp_size,
                num_experts=config.num_experts,
                num_redundant_experts=config.num_redundant_experts,
                slots_per_rank=config.slots_per_rank,
            )
        )
        self.num_redundant_experts = config.num_redundant_experts
        self.world_size = config.dp_size
        """The group's current size (the launch size until an elastic EP resize commits)."""
        self.elastic = ElasticEpRank(
            self, rank=config.rank, rebuild_timeout_sec=config.rebuild_timeout_sec, emit=emit, log=log
        )
        self.shard = ExpertShard(self.model, self.placement, config.rank)
        self.members = tuple(range(config.dp_size))
        self.store: BoundedStore | None = None
        self.pg: Any = None
        self.group_id = "init"
        self.wave_ended = 0
        self.wave_counter = 0
        self.in_wave = False
        self.pending: deque[Generation] = deque()
        self.active: dict[str, Generation] = {}
        self.transient_pending = False
        self.slow_rebuild_sec = 0.0
        self.last_poll_error: str | None = None
        self.unfinished: Any = None
        """The collective a :class:`PeerLeftError` left running in the current group (gloo still waits in it)."""

    def _set_wave(self, active: bool) -> None:
        """Enter or leave a wave; the API server learns it, so that tests can wait for a truly idle rank."""
        if active != self.in_wave:
            self.in_wave = active
            emit({"ev": "wave", "active": active})

    # -- group plumbing --------------------------------------------------------------------------------
    @property
    def dense_rank(self) -> int:
        return self.members.index(self.cfg.rank)

    def _host_store(self, host: str, port: int, timeout: float) -> Any:
        # listen on exactly the given address (TCPStore alone would bind every interface)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        return TCPStore(
            host,
            port,
            None,
            True,
            datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
            master_listen_fd=sock.detach(),
            use_libuv=False,
        )

    def _connect_store(self, host: str, port: int, timeout: float) -> Any:
        return TCPStore(host, port, None, False, datetime.timedelta(seconds=timeout))

    def connect_launch_store(self, timeout: float) -> None:
        """Use the store of the launch (``master_addr:master_port``), hosted by another rank."""
        self._use_store(self._connect_store(self.cfg.master_addr, self.cfg.master_port, timeout))

    @property
    def bounded_store(self) -> BoundedStore:
        assert self.store is not None, "the worker uses the store only after start()"
        return self.store

    def _use_store(self, raw: Any) -> None:
        if self.store is not None:
            self.store.close()  # a call stuck on the old store's host must not hold the new one up
        self.store = BoundedStore(raw)

    def _barrier(self, key: str, count: int, timeout: float) -> None:
        """Wait until ``count`` members arrived at ``key`` (polling the store; every call within the deadline)."""
        store = self.bounded_store
        deadline = time.monotonic() + timeout
        try:
            store.add(key, 1, timeout=deadline - time.monotonic())
            while store.add(key, 0, timeout=deadline - time.monotonic()) < count:
                if time.monotonic() > deadline:
                    raise RebuildError(f"peers did not all arrive within {timeout} s at {key}")
                time.sleep(0.01)
        except StoreTimeoutError as exc:
            raise RebuildError(f"the store did not answer within {timeout} s at {key}") from exc

    def _make_group(self, prefix: str, timeout: float, *, arrive_timeout: float | None = None) -> None:
        self._barrier(f"{prefix}arrive", len(self.members), timeout if arrive_timeout is None else arrive_timeout)
        # the gloo transport binds the configured address only; the public stub lacks the options overload
        gloo: Any = ProcessGroupGloo
        opts = gloo._Options()
        opts._devices = [ProcessGroupGloo.create_device(hostname=self.cfg.bind_host)]
        opts._timeout = datetime.timedelta(seconds=self.cfg.collective_timeout_sec)
        raw = self.bounded_store.raw  # gloo uses the store itself while it creates the group
        self.pg = ProcessGroupGloo(PrefixStore(prefix, raw), self.dense_rank, len(self.members), opts)
        self.group_id = prefix
        self.wave_ended = 0
        self._set_wave(False)

    def drop_group(self) -> None:
        # closing our side makes peers blocked on us fail fast ("Connection closed by peer"); the collection
        # frees a transport that a reference cycle (a failed operation's traceback) would otherwise keep open.
        # A group with a collective still running in it closes only when that one ends (gloo waits for it):
        # it is let go of off the loop, and its peers learn of our leaving from the store's fault key
        pg, unfinished = self.pg, self.unfinished
        self.pg = self.unfinished = None
        if pg is not None and unfinished is not None and not unfinished.is_completed():
            release_when_finished(pg, unfinished)
            return
        del pg, unfinished
        gc.collect()

    def _announce_fault(self) -> None:
        """Tell the group's peers that this rank left it (best effort within :data:`ANNOUNCE_STORE_TIMEOUT_SEC`:
        the store may be gone or hung too, and the fault is reported either way)."""
        store = self.bounded_store
        deadline = time.monotonic() + ANNOUNCE_STORE_TIMEOUT_SEC
        with contextlib.suppress(Exception):
            store.set(f"{self.group_id}fault", str(self.cfg.rank), timeout=deadline - time.monotonic())
        with contextlib.suppress(Exception):  # and pull idle peers into a wave: they fail it at once
            store.add(f"{self.group_id}wave", 1, timeout=deadline - time.monotonic())

    def _wait(self, work: Any) -> None:
        try:
            wait_collective(work, self.bounded_store, f"{self.group_id}fault")
        except PeerLeftError:
            self.unfinished = work  # still running in gloo: the group must not be destroyed on this thread
            raise

    def start(self) -> None:
        cfg = self.cfg
        if cfg.scale_up_launch:
            self.elastic.join_scale_up(handshake_timeout_sec=cfg.handshake_timeout_sec)
            return
        if cfg.rank == self.members[0]:
            self._use_store(self._host_store(cfg.master_addr, cfg.master_port, cfg.startup_timeout_sec))
        else:
            self.connect_launch_store(cfg.startup_timeout_sec)
        self._make_group("init/", cfg.startup_timeout_sec)
        probe = torch.ones(1)
        self._wait(self.pg.allreduce([probe]))
        if int(probe.item()) != len(self.members):
            raise RebuildError(f"first all-reduce gave {probe.item()}, expected {len(self.members)}")

    # -- elastic EP switch (the operation itself: :mod:`.elastic_worker`) ------------------------------
    def retire(self) -> None:
        """A scale-down retired this rank (its group already dropped): it belongs to no group any more."""
        self.members = ()

    def join_resized_group(
        self, epoch: str, *, new: int, num_redundant_experts: int, slots_per_rank: int
    ) -> ExpertPlacement:
        """Join the group over ``range(new)`` and load this rank's experts of the new layout: ``slots_per_rank``
        physical experts per rank as before, ``num_redundant_experts`` replicas (``(E + R) * new // cur - E``)."""
        self.members = tuple(range(new))
        self._make_group(f"eep/{epoch}/", self.cfg.rebuild_timeout_sec)
        placement = initial_placement(
            dp_size=new,
            num_experts=self.cfg.num_experts,
            num_redundant_experts=num_redundant_experts,
            slots_per_rank=slots_per_rank,
        )
        loaded = self.shard.load(placement)
        self.placement = placement
        self.num_redundant_experts = num_redundant_experts
        self.world_size = new
        log(f"elastic EP {epoch}: members {list(self.members)}, loaded experts {loaded}")
        return placement

    # -- commands --------------------------------------------------------------------------------------
    def handle(self, cmd: dict[str, Any]) -> None:
        op = cmd.get("op")
        if op == "submit":
            h = self.model.prefill(tuple(cmd["tokens"]))
            self.pending.append(Generation(rid=cmd["rid"], h=h, max_tokens=int(cmd["max_tokens"])))
        elif op == "cancel":
            self.active.pop(cmd["rid"], None)
            self.pending = deque(s for s in self.pending if s.rid != cmd["rid"])
        elif op == "cancel_all":
            self.active.clear()
            self.pending.clear()
        elif op == "transient":
            # only a rank that is in a group can fail it; a faulted rank has nothing left to break
            self.transient_pending = self.pg is not None
        elif op == "slow_rebuild":
            self.slow_rebuild_sec = float(cmd.get("delay_sec", 0.0))
        elif op == "rebuild":
            self.rebuild(cmd["plan"])
        elif op == "shutdown":
            os._exit(0)
        elif op == "eep_prepare":
            self.elastic.prepare(cmd)
        elif op == "eep_commit":
            self.elastic.commit(float(cmd["timeout_sec"]))

    def drain(self, block_for: float) -> None:
        try:
            cmd = self.commands.get(timeout=block_for) if block_for > 0 else self.commands.get_nowait()
        except queue.Empty:
            return
        self.handle(cmd)
        while True:
            try:
                self.handle(self.commands.get_nowait())
            except queue.Empty:
                return

    # -- main loop -------------------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            self.elastic.poll(in_wave=self.in_wave)
            if self.pg is None:
                self.drain(block_for=0.2)  # faulted: wait for a command
                continue
            self.drain(block_for=0)
            if self.pg is None:
                continue
            if self.transient_pending:
                self.transient_pending = False
                self._inject_transient()
                continue
            try:
                if self.in_wave or self._should_start_wave():
                    self.step()
                else:
                    self.drain(block_for=self.cfg.idle_poll_interval_sec)
            except Exception as exc:  # every collective failure is a fault to report
                self._fault(exc)

    def _should_start_wave(self) -> bool:
        store = self.bounded_store
        key = f"{self.group_id}wave"
        if self.pending or self.active:
            # a failure here is a fault (we have traffic), and a store that does not answer fails as late as
            # the collective it stands for would
            self.wave_counter = store.add(key, 1, timeout=self.cfg.collective_timeout_sec)
            self._set_wave(True)
            return True
        try:
            counter = store.add(key, 0, timeout=IDLE_POLL_STORE_TIMEOUT_SEC)
        except Exception as exc:  # idle: an unreachable or hung store is not a collective failure
            if str(exc) != self.last_poll_error:
                log(f"idle store poll failed: {exc}")
                self.last_poll_error = str(exc)
            return False
        if counter > self.wave_ended:
            self.wave_counter = counter
            self._set_wave(True)
            return True
        return False

    def step(self) -> None:
        cfg = self.cfg
        n, batch, d = len(self.members), cfg.max_batch, D_MODEL
        while self.pending and len(self.active) < batch:
            seq = self.pending.popleft()
            self.active[seq.rid] = seq
        rows = list(self.active.values())
        me = self.dense_rank
        x = torch.zeros(n, batch, d + 2, dtype=torch.float64)
        for i, seq in enumerate(rows):
            x[me, i, :d] = seq.h
            x[me, i, d] = 1.0
        x[me, 0, d + 1] = float(len(self.active) + len(self.pending))
        x[me, 1, d + 1] = float(self.wave_counter)
        self._wait(self.pg.allreduce([x]))
        if float(x[:, 0, d + 1].sum()) == 0.0:
            # nobody had work at this step: every rank sees the same sums, so the wave ends everywhere
            self.wave_ended = int(x[:, 1, d + 1].max())
            self._set_wave(False)
            return
        out = torch.zeros(n, batch, d, dtype=torch.float64)
        for r in range(n):
            for i in range(batch):
                if x[r, i, d] == 1.0:
                    out[r, i] = self.shard.contribution(x[r, i, :d])
        self._wait(self.pg.allreduce([out]))
        for i, seq in enumerate(rows):
            if seq.rid not in self.active:
                continue
            y = seq.h + out[me, i]
            token = self.model.next_token(y)
            seq.produced += 1
            emit({"ev": "token", "rid": seq.rid, "token": token})
            if seq.produced >= seq.max_tokens:
                del self.active[seq.rid]
                emit({"ev": "done", "rid": seq.rid, "finish_reason": "length"})
            else:
                seq.h = self.model.advance(seq.h, token)

    def _mask(self) -> list[int]:
        return [1 if r in self.members else 0 for r in range(self.world_size)]

    def _fault(self, exc: BaseException) -> None:
        log(f"collective failed: {type(exc).__name__}: {exc}")
        self._announce_fault()
        self.drop_group()
        self.active.clear()
        self.pending.clear()
        self._set_wave(False)
        emit({"ev": "fault", "fault_info": type(exc).__name__, "mask": self._mask(), "detail": str(exc)[:500]})

    def _inject_transient(self) -> None:
        # leave the group as a failed collective would: idle peers are pulled into a wave and fail it
        self._fault(RuntimeError("transient collective failure injected"))

    # -- rebuild ---------------------------------------------------------------------------------------
    def rebuild(self, plan: dict[str, Any]) -> None:
        request_id = plan["request_id"]
        try:
            placement = self._rebuild(plan)
        except CheckinError as exc:  # not every survivor joined in time: failed before the vote (retryable)
            log(f"rebuild {request_id} failed its check-in: {exc}")
            self.drop_group()
            emit({"ev": "rebuilt", "request_id": request_id, "ok": False, "error": str(exc), "checkin_failed": True})
            return
        except Exception as exc:  # any failure fails this round, reported to the API server
            log(f"rebuild {request_id} failed: {type(exc).__name__}: {exc}")
            self.drop_group()
            emit({"ev": "rebuilt", "request_id": request_id, "ok": False, "error": str(exc)[:500]})
            return
        emit({"ev": "rebuilt", "request_id": request_id, "ok": True, "placement": placement.describe()})

    def _rebuild(self, plan: dict[str, Any]) -> ExpertPlacement:
        cfg = self.cfg
        received = time.monotonic()
        checkin = plan.get("checkin_timeout_sec")
        if self.slow_rebuild_sec > 0:
            delay, self.slow_rebuild_sec = self.slow_rebuild_sec, 0.0
            time.sleep(delay)  # the injected slowness itself, not a synchronisation
        self.drop_group()
        members = tuple(plan["members"])
        new_store = plan.get("new_store")
        # vLLM 0.34: every survivor must check in to the round within its check-in, counted from the command
        arrive_timeout = (
            cfg.rebuild_timeout_sec if checkin is None else max(0.01, float(checkin) - (time.monotonic() - received))
        )
        try:
            if new_store is not None:
                host, port = new_store["host"], int(new_store["port"])
                if members[0] == cfg.rank:
                    self._use_store(self._host_store(host, port, cfg.rebuild_timeout_sec))
                else:
                    self._use_store(self._connect_store(host, port, min(cfg.rebuild_timeout_sec, arrive_timeout)))
            else:
                self.bounded_store.raw.set_timeout(datetime.timedelta(seconds=cfg.rebuild_timeout_sec))
        except Exception as exc:
            if checkin is not None:
                raise CheckinError(checkin_failure_text(plan["request_id"], float(checkin))) from exc
            raise
        old_members = self.members
        self.members = members
        if checkin is not None:
            arrive_timeout = max(0.01, float(checkin) - (time.monotonic() - received))
        try:
            self._make_group(f"ft/{plan['request_id']}/", cfg.rebuild_timeout_sec, arrive_timeout=arrive_timeout)
        except RebuildError as exc:
            self.members = old_members
            if checkin is not None and "arrive" in str(exc):
                raise CheckinError(checkin_failure_text(plan["request_id"], float(checkin))) from exc
            raise
        except Exception:
            self.members = old_members
            raise
        ok, error, placement = 1, None, self.placement
        if plan["instruction"] == "scale_down":
            removed = set(plan["newly_removed"]) & set(self.placement.ranks)
            try:
                placement = remove_ranks(self.placement, removed)
            except InsufficientExpertSlotsError as exc:
                ok, error = 0, str(exc)
        digest = int(plan["digest"])
        vote = torch.tensor([ok, digest, -digest], dtype=torch.int64)
        self._wait(self.pg.allreduce([vote], ReduceOp.MIN))
        if int(vote[0]) != 1:
            raise RebuildError(error or "a peer failed the rebuild (unanimous commit refused)")
        if int(vote[1]) != -int(vote[2]):
            raise RebuildError("survivors disagree on the round (members or dead set differ)")
        loaded = self.shard.load(placement)
        self.placement = placement
        log(f"rebuilt {plan['request_id']}: members {list(members)}, loaded experts {loaded}")
        return placement


def _read_commands(worker: Worker) -> None:
    for line in sys.stdin:
        line = line.strip()
        if line:
            worker.commands.put(json.loads(line))
    os._exit(0)  # the API server is gone: never outlive it


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main(argv: list[str]) -> int:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API server decides when this process ends
    torch.set_num_threads(1)
    config = WorkerConfig.from_json(argv[1])
    worker = Worker(config)
    threading.Thread(target=_read_commands, args=(worker,), daemon=True).start()
    try:
        worker.start()
    except Exception as exc:  # reported to the API server, which exits non-zero
        emit({"ev": "fatal", "error": f"{type(exc).__name__}: {exc}"[:500]})
        return 1
    emit(
        {
            "ev": "ready",
            "pid": os.getpid(),
            "placement": worker.placement.describe(),
            "num_redundant_experts": worker.num_redundant_experts,
        }
    )
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
