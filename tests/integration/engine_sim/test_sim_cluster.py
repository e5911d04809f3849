"""The real engine simulator: 4 processes per instance, torch gloo on loopback.

Instances reused across scenarios to keep the run short on two cores: the first walks the conformance
suite and the fault chain (A1, A3, A4 and the slot shortage); the second is the relaunch of the survivors
of a lost rank as a smaller contiguous world (3 ranks, redundant experts recomputed: a release cannot be
launched with ranks already dead) and covers the signal path, a hung worker, the loss of the new world's
master, the idle row (A2), kill_process and the engine recovery timeout; the third moves the master
0 → 1 → 2 over consecutive rounds (F-56); the fourth runs vLLM 0.34's facts point by point.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from heteroflow.core.testing import free_port
from heteroflow.engine_sim import conformance, v034_conformance
from heteroflow.engine_sim.testing import SimProcessCluster, rss_kib, session_pids
from heteroflow.http.tls import client_tls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# greedy outputs of conformance.PROMPTS for the default seed (1234) and 4 experts + 4 redundant
GOLDEN = ["aed,a3t3t3t3", "a-3ea!-t!?de", "vl02d,levmuh", ",v'a3m-3,3,2", "g,uyy4dn\ne:m"]


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[list[SimProcessCluster]]:
    started: list[SimProcessCluster] = []
    yield started
    for cluster in started:
        pids = cluster.pids()
        cluster.close()
        leftovers = {rank: session_pids(pid) for rank, pid in pids.items() if session_pids(pid)}
        assert leftovers == {}, f"processes left behind: {leftovers}"


def start(factory: list[SimProcessCluster], tmp_path: Path, **kwargs: object) -> SimProcessCluster:
    cluster = SimProcessCluster(log_dir=tmp_path / "logs", **kwargs)  # type: ignore[arg-type]
    factory.append(cluster)
    cluster.start()
    return cluster


def listening_addresses(pids: list[int]) -> set[str]:
    """Local addresses of every TCP socket in LISTEN state owned by ``pids`` (Linux /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir() if fd_dir.exists() else []:
            try:
                target = fd.readlink().as_posix()
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                hex_ip = fields[1].split(":")[0]
                if len(hex_ip) == 8:
                    found.add(".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0)))
                else:
                    found.add(f"ipv6:{hex_ip}")
    return found


def test_fault_chain_on_four_ranks(cluster_factory: list[SimProcessCluster], tmp_path: Path) -> None:
    began = time.monotonic()
    cluster = start(cluster_factory, tmp_path, dp_size=4)
    started = time.monotonic() - began
    session = [p for pid in cluster.pids().values() for p in session_pids(pid)]
    assert len(session) == 8  # an API server and a worker per rank
    assert listening_addresses(session) == {"127.0.0.1"}
    # the cluster token guards the OpenAI and FT routes (it is set for this cluster); liveness stays open
    assert httpx.get(f"{cluster.url(0)}/v1/models", timeout=5, verify=client_tls()).status_code == 401
    assert httpx.get(f"{cluster.url(0)}/v1/fault_tolerance/status", timeout=5, verify=client_tls()).status_code == 401
    assert httpx.get(f"{cluster.url(0)}/health", timeout=5, verify=client_tls()).status_code == 200
    memory = {rank: sum(rss_kib(p) or 0 for p in session_pids(pid)) for rank, pid in cluster.pids().items()}
    assert all(kib < 800 * 1024 for kib in memory.values()), memory

    async def scenario() -> None:
        try:
            baseline = await conformance.healthy_contract(cluster, range(4))
            assert baseline == GOLDEN
            await conformance.apply_validation(cluster, 1)
            await conformance.transient_retry(cluster, range(4), baseline, slow_rank=2)
            await conformance.scale_down_chain(cluster, baseline)
        finally:
            await cluster.aclose_clients()

    asyncio.run(scenario())
    assert cluster.processes[1].wait(timeout=30) == 1  # the terminal scale_down failure exits non-zero
    print(f"start-up {started:.1f} s, RSS per rank (KiB, API server + worker): {memory}")


def test_relaunch_signals_hang_idle_and_timeouts(cluster_factory: list[SimProcessCluster], tmp_path: Path) -> None:
    # rank 0 of 4 was lost: the survivors relaunch as a smaller contiguous world, as a release can (no
    # "dead ranks" at launch): 3 ranks with the same 2 slots each, 3 x 2 - 4 = 2 redundant experts
    cluster = start(
        cluster_factory,
        tmp_path,
        dp_size=3,
        num_experts=4,
        num_redundant_experts=2,
        slots_per_rank=2,
        engine_recovery_timeout_sec=15.0,
    )

    async def scenario() -> None:
        try:
            # renumbered 0..2, master 0, no dead set, the same greedy outputs as the 4-rank instance
            assert await conformance.healthy_contract(cluster, [0, 1, 2]) == GOLDEN
            info = await conformance.sim_info(cluster, 2)
            assert (info["dp_size"], info["members"], info["dead_ranks"], info["store_master"]) == (3, [0, 1, 2], [], 0)
            # signal path: SIGUSR2 = transient fault on every rank, retry recovers
            cluster.signal(1, signal.SIGUSR2)
            await conformance.wait_status(cluster, [0, 1, 2], "unhealthy", within=15.0)
            for rank in (0, 1, 2):
                await conformance.apply(cluster, rank, {"instruction": "retry", "request_id": "sig-retry"})
            await conformance.wait_status(cluster, [0, 1, 2], "healthy", within=30.0, ft_state_absent=True)
            # a hung worker: busy survivors time out in their collective
            await conformance.hang_detected(cluster, 2, [0, 1])
            await conformance.inject(cluster, 2, "resume")
            # signal path: SIGUSR1 kills the worker of the new world's master (rank 0) → dead; the survivors
            # scale it down and move the store to the next master, rank 1
            cluster.signal(0, signal.SIGUSR1)
            await conformance.wait_status(cluster, [0], "dead", within=15.0)
            await conformance.traffic(cluster, [1, 2])
            await conformance.wait_status(cluster, [1, 2], "unhealthy", within=15.0)
            port = cluster.free_port()
            for rank in (1, 2):
                body = {
                    "instruction": "scale_down",
                    "request_id": "drop-0",
                    "params": {"removed_dp_ranks": [0], "dp_master_ip": "127.0.0.1", "dp_store_port": port},
                }
                assert (await conformance.apply(cluster, rank, body)).status_code == 202
            await conformance.wait_status(cluster, [1, 2], "healthy", within=30.0, ft_state_absent=True)
            info = await conformance.sim_info(cluster, 2)
            assert (info["members"], info["dead_ranks"], info["store_master"]) == ([1, 2], [0], 1)
            assert await conformance.outputs(cluster, 2) == GOLDEN
            # the RFC's idle row: without traffic the survivor stays healthy
            await conformance.idle_kill(cluster, 2, [1])
            # kill_process: the whole rank disappears
            await conformance.inject(cluster, 1, "kill_process")
            assert cluster.processes[1].wait(timeout=15) == 137
        finally:
            await cluster.aclose_clients()

    asyncio.run(scenario())
    # the dead ranks got no command: each exits once engine_recovery_timeout_sec has passed
    assert cluster.processes[0].wait(timeout=30) == 1
    assert cluster.processes[2].wait(timeout=30) == 1


def test_a_launch_vllm_refuses_exits_before_it_starts() -> None:
    """No "dead ranks" at launch (an unknown option, as in a release) and vLLM 0.34's layout check."""
    base = [
        sys.executable, "-m", "heteroflow.cli.main", "engine-sim", "--dp-size", "4", "--dp-rank", "1",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--port", str(free_port()),
    ]  # fmt: skip
    dead = subprocess.run([*base, "--dead-ranks", "0"], capture_output=True, text=True, timeout=90)
    assert dead.returncode == 2
    assert "No such option: --dead-ranks" in dead.stderr
    uneven = subprocess.run(
        [*base, "--num-experts", "4", "--num-redundant-experts", "3"], capture_output=True, text=True, timeout=90
    )
    assert uneven.returncode == 2
    assert "Got 7 experts and 4 EP ranks." in uneven.stderr


def test_master_relocation_round_after_round(cluster_factory: list[SimProcessCluster], tmp_path: Path) -> None:
    cluster = start(cluster_factory, tmp_path, dp_size=4)

    async def scenario() -> None:
        try:
            await conformance.master_relocation(cluster, GOLDEN)
        finally:
            await cluster.aclose_clients()

    asyncio.run(scenario())


def test_vllm_034_point_by_point_on_real_processes(cluster_factory: list[SimProcessCluster], tmp_path: Path) -> None:
    """Every fault fact of the ``vllm-0.34`` profile on real ranks: the worker's ten-second check-in (a survivor
    left out of a round), the vote, the terminal failure; ``diagnosing`` held 3 s so a loaded machine sees it."""
    cluster = start(cluster_factory, tmp_path, dp_size=4, diagnosing_sec=3.0)

    async def scenario() -> dict[str, object]:
        try:
            await v034_conformance.v034_routes_and_errors(cluster, 1)
            return await v034_conformance.v034_round(cluster)
        finally:
            await cluster.aclose_clients()

    seen = asyncio.run(scenario())
    assert seen["statuses"] == ["diagnosing", "unhealthy"]
    partial = seen["partial_dispatch"]
    assert isinstance(partial, dict)
    assert partial["ft_error"].startswith("[FT] Not all engines joined recovery round")


def test_a_rank_whose_peers_never_come_exits_non_zero(tmp_path: Path) -> None:
    master, http = free_port(), free_port()
    cmd = [
        sys.executable, "-m", "heteroflow.cli.main", "engine-sim",
        "--dp-size", "2", "--dp-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(master),
        "--port", str(http), "--startup-timeout-sec", "3",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # while it waits for its peers the HTTP port is already claimed (gloo's ephemeral sockets cannot take
        # it) but not accepting: a probe is refused rather than left hanging
        deadline = time.monotonic() + 60
        while port_is_free(http):
            assert proc.poll() is None, "the rank exited before claiming its HTTP port"
            assert time.monotonic() < deadline, "the rank never claimed its HTTP port"
            time.sleep(0.05)
        assert proc.poll() is None
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{http}/health", timeout=5, verify=client_tls())
        assert proc.wait(timeout=90) == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_an_occupied_http_port_is_a_clear_start_failure() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http = taken.getsockname()[1]
        cmd = [
            sys.executable, "-m", "heteroflow.cli.main", "engine-sim",
            "--dp-size", "1", "--dp-rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            "--port", str(http),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 1
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    failure = next(event for event in events if event["event"] == "engine.port_unavailable")
    assert failure["port"] == http
    assert "in use" in failure["error"]


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
