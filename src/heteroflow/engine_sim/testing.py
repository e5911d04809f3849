"""Test doubles of the engine simulator, shipped for this package's tests and for its consumers'.

- :class:`FakeEngineCluster` — N engines in this process (the real engine core and HTTP app over
  :class:`~heteroflow.engine_sim.fake.FakeWorkerBackend`), reached through ``httpx`` without sockets.
- :class:`SimProcessCluster` — N real ``heteroflow engine-sim`` processes (torch, gloo) on loopback; every
  process it starts runs in its own session and is killed (SIGKILL to the session) by :meth:`close`.

Both implement :class:`EngineClusterHarness`, which the conformance suite
(:mod:`heteroflow.engine_sim.conformance`) is written against.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from heteroflow.contracts.engine_protocol import PROFILES, ProfileName, profile
from heteroflow.core.clock import Clock
from heteroflow.core.testing import FakeClock, free_port
from heteroflow.engine_sim.assembly import create_app
from heteroflow.engine_sim.backend import FaultKind
from heteroflow.engine_sim.elastic import SCALE_UP_LAUNCH_ENV, ElasticEpConfig
from heteroflow.engine_sim.engine import EngineCore, EngineTimeouts
from heteroflow.engine_sim.fake import FakeGroup, FakeWorkerBackend
from heteroflow.engine_sim.placement import launch_slots_per_rank
from heteroflow.engine_sim.state import initial_state
from heteroflow.http.tls import client_tls

TEST_CLUSTER_TOKEN = "engine-sim-test-token"  # noqa: S105 - a fixture value, not a secret


class EngineClusterHarness(Protocol):
    """What the conformance suite needs from an instance of N engines."""

    dp_size: int
    prefix: str
    cluster_token: str
    profile_name: ProfileName

    def client(self, rank: int) -> httpx.AsyncClient:
        """A client whose base URL is the rank's API server."""
        ...

    async def eventually(self, check: Callable[[], Awaitable[bool]], *, within: float, what: str) -> None:
        """Poll ``check`` until it is true; raise ``TimeoutError`` naming ``what`` at the deadline."""
        ...

    async def let_time_pass(self, seconds: float) -> None:
        """Let ``seconds`` of engine time pass (to observe that nothing happens meanwhile)."""
        ...

    def free_port(self) -> int: ...

    @property
    def collective_timeout(self) -> float: ...


class ElasticEpHarness(EngineClusterHarness, Protocol):
    """An instance whose operator can launch ranks for an elastic EP scale-up and remove retired ones."""

    def launch_scale_up(self, rank: int, *, new_dp_size: int) -> None:
        """Start ``rank`` with ``VLLM_ELASTIC_EP_SCALE_UP_LAUNCH=1`` and ``--dp-size new_dp_size``."""
        ...

    def stop(self, rank: int) -> None:
        """Kill one rank's processes (a retired rank, once the resize completed)."""
        ...

    def log_text(self, rank: int) -> str:
        """What one rank's processes (API server and worker) wrote so far."""
        ...


def auth_headers(token: str) -> dict[str, str]:
    """The header the engine's OpenAI, FT and sim routes want when a cluster token is configured."""
    return {"Authorization": f"Bearer {token}"} if token else {}


class _UnreachableTransport(httpx.AsyncBaseTransport):
    """ASGI transport that fails like a dead process once its engine exited or was killed."""

    def __init__(self, app: Any, is_gone: Callable[[], bool]) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self._is_gone = is_gone

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._is_gone():
            raise httpx.ConnectError("connection refused (engine process is gone)", request=request)
        return await self._inner.handle_async_request(request)


class FakeEngineCluster:
    """N in-process engines sharing a :class:`FakeGroup` and a :class:`FakeClock`."""

    def __init__(
        self,
        *,
        dp_size: int = 4,
        num_experts: int = 4,
        num_redundant_experts: int = 4,
        slots_per_rank: int | None = None,
        engine_recovery_timeout_sec: float = 120.0,
        rebuild_timeout_sec: float = 30.0,
        exit_linger_sec: float = 5.0,
        prefix: str | None = None,
        cluster_token: str = TEST_CLUSTER_TOKEN,
        clock: FakeClock | None = None,
        profile_name: str = "vllm-0.34",
        engine_clock: Clock | None = None,
        diagnosing_sec: float = 0.0,
        enable_elastic_ep: bool = False,
    ) -> None:
        """``diagnosing_sec`` 0 skips vLLM 0.34's ``diagnosing`` (the fake clock would have to move past it)."""
        self.dp_size = dp_size
        self.profile_name: ProfileName = profile(profile_name).name
        self.enable_elastic_ep = enable_elastic_ep
        self.prefix = PROFILES[self.profile_name].route_prefix if prefix is None else prefix
        self.cluster_token = cluster_token
        self.clock = clock or FakeClock()
        #: the engines' time: the fake clock a test moves, or (``engine_clock``) another one such as the event
        #: loop's own on virtual time, where nothing needs moving and only :meth:`tick` fires the engines' timeouts
        self.engine_clock: Clock = engine_clock or self.clock
        # the layout a release starts with, refused as vLLM refuses it (PlacementError)
        slots = launch_slots_per_rank(
            dp_size=dp_size,
            num_experts=num_experts,
            num_redundant_experts=num_redundant_experts,
            slots_per_rank=slots_per_rank,
        )
        self.group = FakeGroup(
            dp_size=dp_size,
            clock=self.engine_clock,
            num_experts=num_experts,
            num_redundant_experts=num_redundant_experts,
            slots_per_rank=slots,
            rebuild_timeout_sec=rebuild_timeout_sec,
        )
        self.cores: dict[int, EngineCore] = {}
        self.backends: dict[int, FakeWorkerBackend] = {}
        self._gone: set[int] = set()
        self._clients: dict[int, httpx.AsyncClient] = {}
        timeouts = EngineTimeouts(
            engine_recovery_timeout_sec=engine_recovery_timeout_sec,
            exit_linger_sec=exit_linger_sec,
            diagnosing_sec=diagnosing_sec,
        )
        for rank in range(dp_size):
            backend = FakeWorkerBackend(rank=rank, group=self.group)
            self.backends[rank] = backend
            self.cores[rank] = EngineCore(
                initial=initial_state(rank=rank, dp_size=dp_size, profile_name=self.profile_name),
                backend=backend,
                clock=self.engine_clock,
                timeouts=timeouts,
                hard_exit=functools.partial(self._hard_exit, rank),
                elastic=ElasticEpConfig(
                    num_experts=num_experts, num_redundant_experts=num_redundant_experts, max_dp_size=dp_size
                )
                if enable_elastic_ep
                else None,
            )

    async def start(self) -> None:
        for rank, core in self.cores.items():
            await core.start()
            app = create_app(
                core,
                model_name="heteroflow-sim-moe",
                ft_path_prefix=self.prefix,
                profile=PROFILES[self.profile_name],
                cluster_token=self.cluster_token,
                max_tokens_limit=256,
                enable_elastic_ep=self.enable_elastic_ep,
            )
            transport = _UnreachableTransport(app, functools.partial(self.is_gone, rank))
            self._clients[rank] = httpx.AsyncClient(
                transport=transport,
                base_url=f"http://engine-{rank}",
                headers=auth_headers(self.cluster_token),
                verify=client_tls(),
            )

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        for core in self.cores.values():
            await core.close()

    def _hard_exit(self, rank: int) -> None:
        self.backends[rank].kill()
        self._gone.add(rank)

    def is_gone(self, rank: int) -> bool:
        core = self.cores.get(rank)
        return rank in self._gone or core is None or core.exit_requested.is_set()

    def client(self, rank: int) -> httpx.AsyncClient:
        if rank not in self._clients:
            raise KeyError(f"rank {rank} was not started")
        return self._clients[rank]

    def tick(self) -> None:
        for core in self.cores.values():
            core.tick()

    async def settle(self) -> None:
        """Let every scheduled callback run (events are delivered with ``call_soon``)."""
        for _ in range(50):
            await asyncio.sleep(0)
        self.tick()
        for _ in range(50):
            await asyncio.sleep(0)

    async def eventually(self, check: Callable[[], Awaitable[bool]], *, within: float, what: str) -> None:
        # engine time is the fake clock: each attempt lets callbacks run and moves the clock a little
        waited = 0.0
        while True:
            await self.settle()
            if await check():
                return
            if waited >= within:
                raise TimeoutError(f"not within {within} s (fake clock): {what}")
            self.clock.advance(0.1)
            waited += 0.1

    async def let_time_pass(self, seconds: float) -> None:
        steps = max(1, int(seconds / 0.5))
        for _ in range(steps):
            self.clock.advance(seconds / steps)
            await self.settle()

    def free_port(self) -> int:
        return free_port()

    @property
    def collective_timeout(self) -> float:
        return 1.0

    def kill_worker(self, rank: int) -> None:
        self.backends[rank].inject(FaultKind.KILL_WORKER)


class SimProcessCluster:
    """N real engine-sim processes on loopback (one per DP rank), started and killed by this object."""

    def __init__(
        self,
        *,
        dp_size: int = 4,
        num_experts: int = 4,
        num_redundant_experts: int = 4,
        slots_per_rank: int | None = None,
        collective_timeout_sec: float = 3.0,
        engine_recovery_timeout_sec: float = 120.0,
        rebuild_timeout_sec: float = 15.0,
        exit_linger_sec: float = 3.0,
        prefix: str | None = None,
        cluster_token: str = TEST_CLUSTER_TOKEN,
        log_dir: Path | None = None,
        python: str = sys.executable,
        startup_timeout_sec: float = 90.0,
        profile_name: str = "vllm-0.34",
        diagnosing_sec: float | None = None,
        enable_elastic_ep: bool = False,
        elastic_ep_max_dp_size: int | None = None,
        elastic_ep_prepare_timeout_sec: float | None = None,
        elastic_ep_handshake_timeout_sec: float | None = None,
    ) -> None:
        """``diagnosing_sec``: ``--diagnosing-sec`` of every rank (``None``: the simulator's default, 1 s).
        ``enable_elastic_ep`` and the ``elastic_ep_*`` options: ``--enable-elastic-ep`` and its options on every
        rank, including the ones :meth:`launch_scale_up` starts later."""
        self.dp_size = dp_size
        self.profile_name: ProfileName = profile(profile_name).name
        self.prefix = PROFILES[self.profile_name].route_prefix if prefix is None else prefix
        self.cluster_token = cluster_token
        self.collective_timeout_sec = collective_timeout_sec
        self.master_port = free_port()
        self.ports = {r: free_port() for r in range(dp_size)}
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._clients: dict[int, httpx.AsyncClient] = {}
        self._log_dir = log_dir
        self._python = python
        self._startup_timeout = startup_timeout_sec
        self._args = [
            "--dp-size", str(dp_size),
            "--master-addr", "127.0.0.1",
            "--master-port", str(self.master_port),
            "--num-experts", str(num_experts),
            "--num-redundant-experts", str(num_redundant_experts),
            "--collective-timeout-sec", str(collective_timeout_sec),
            "--engine-recovery-timeout-sec", str(engine_recovery_timeout_sec),
            "--rebuild-timeout-sec", str(rebuild_timeout_sec),
            "--exit-linger-sec", str(exit_linger_sec),
            "--ft-path-prefix", self.prefix,
            "--ft-profile", self.profile_name,
            "--startup-timeout-sec", str(startup_timeout_sec),
        ]  # fmt: skip
        if slots_per_rank is not None:
            self._args += ["--slots-per-rank", str(slots_per_rank)]
        if diagnosing_sec is not None:
            self._args += ["--diagnosing-sec", str(diagnosing_sec)]
        if enable_elastic_ep:
            self._args.append("--enable-elastic-ep")
        for option, value in (
            ("--elastic-ep-max-dp-size", elastic_ep_max_dp_size),
            ("--elastic-ep-prepare-timeout-sec", elastic_ep_prepare_timeout_sec),
            ("--elastic-ep-handshake-timeout-sec", elastic_ep_handshake_timeout_sec),
        ):
            if value is not None:
                self._args += [option, str(value)]

    def _spawn(self, rank: int, args: list[str], *, extra_env: dict[str, str] | None = None) -> None:
        env = {
            **os.environ,
            "HETEROFLOW_CLUSTER_TOKEN": self.cluster_token,
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        cmd = [
            self._python, "-m", "heteroflow.cli.main", "engine-sim",
            "--dp-rank", str(rank), "--port", str(self.ports[rank]), "--host", "127.0.0.1", *args,
        ]  # fmt: skip
        log: Any = subprocess.DEVNULL
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            log = (self._log_dir / f"engine-{rank}.log").open("ab")
        self.processes[rank] = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        if log is not subprocess.DEVNULL:
            log.close()

    def start(self) -> None:
        for rank in self.ports:
            self._spawn(rank, self._args)
        self.wait_serving(set(self.ports))

    def launch_scale_up(self, rank: int, *, new_dp_size: int) -> None:
        """Start rank ``rank`` as an operator launches a new rank for an elastic EP scale-up: env
        ``VLLM_ELASTIC_EP_SCALE_UP_LAUNCH=1``, ``--dp-size new_dp_size --dp-rank rank``, the old world's master
        address and port. It waits for rank 0's bootstrap and serves only once the resize committed
        (:meth:`wait_serving`). A rank that was retired before keeps its process until :meth:`stop`."""
        if rank in self.processes and self.processes[rank].poll() is None:
            raise RuntimeError(f"rank {rank} still runs")
        if rank not in self.ports:
            self.ports[rank] = free_port()
        args = list(self._args)
        args[args.index("--dp-size") + 1] = str(new_dp_size)
        if "--elastic-ep-max-dp-size" in args:  # vLLM's launch check needs it ≥ the size (rank 0's comes later)
            at = args.index("--elastic-ep-max-dp-size") + 1
            args[at] = str(max(int(args[at]), new_dp_size))
        self._spawn(rank, args, extra_env={SCALE_UP_LAUNCH_ENV: "1"})

    def log_text(self, rank: int) -> str:
        """``engine-{rank}.log`` so far; empty without a log directory or before the rank wrote anything."""
        if self._log_dir is None:
            return ""
        path = self._log_dir / f"engine-{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, rank: int) -> None:
        """SIGKILL one rank's session (an orchestrator removing a retired rank) and wait for it."""
        proc = self.processes[rank]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def wait_serving(self, ranks: set[int], *, within: float | None = None) -> None:
        """Block until every rank of ``ranks`` answers ``/health`` 200; a rank that exits fails at once."""
        deadline = time.monotonic() + (self._startup_timeout if within is None else within)
        pending = set(ranks)
        while pending:
            for rank in sorted(pending):
                proc = self.processes[rank]
                if proc.poll() is not None:
                    raise RuntimeError(f"engine {rank} exited during start-up with code {proc.returncode}")
                try:
                    if httpx.get(f"{self.url(rank)}/health", timeout=1.0, verify=client_tls()).status_code == 200:
                        pending.discard(rank)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"engines {sorted(pending)} not ready within {self._startup_timeout} s")
            if pending:
                time.sleep(0.2)  # polling with a deadline above

    def url(self, rank: int) -> str:
        return f"http://127.0.0.1:{self.ports[rank]}"

    def client(self, rank: int) -> httpx.AsyncClient:
        # one client per rank and event loop user; the suite runs one loop per scenario
        client = self._clients.get(rank)
        if client is None or client.is_closed:
            client = httpx.AsyncClient(
                base_url=self.url(rank),
                timeout=httpx.Timeout(30.0, connect=2.0),
                verify=client_tls(),
                headers=auth_headers(self.cluster_token),
            )
            self._clients[rank] = client
        return client

    async def aclose_clients(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    async def eventually(self, check: Callable[[], Awaitable[bool]], *, within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while True:
            if await check():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {within} s: {what}")
            await asyncio.sleep(0.1)

    async def let_time_pass(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def free_port(self) -> int:
        return free_port()

    @property
    def collective_timeout(self) -> float:
        return self.collective_timeout_sec

    def pids(self) -> dict[int, int]:
        return {rank: proc.pid for rank, proc in self.processes.items()}

    def signal(self, rank: int, sig: signal.Signals) -> None:
        self.processes[rank].send_signal(sig)

    def close(self) -> None:
        """SIGKILL every session this cluster started (API servers and their workers) and wait for them."""
        for proc in self.processes.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        deadline = time.monotonic() + 10.0
        while any(session_pids(pid) for pid in self.pids().values()) and time.monotonic() < deadline:
            for pid in self.pids().values():
                for orphan in session_pids(pid):  # a worker whose API server died first
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(orphan, signal.SIGKILL)
            time.sleep(0.05)  # polling with a deadline


def rss_kib(pid: int) -> int | None:
    """Resident memory of a process in KiB (Linux ``/proc``), ``None`` when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def session_pids(pid: int) -> Sequence[int]:
    """Every live (non-zombie) process of the session led by ``pid`` (the API server and its worker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == pid and fields[0] != "Z":  # after ')': state, ppid, pgrp, session
            found.append(int(entry.name))
    return found
