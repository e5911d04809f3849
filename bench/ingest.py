"""Heartbeat ingestion throughput: dedup on (steady counters) versus writing every beat, against the floor.

Starts a real ``heteroflow server`` process, registers nodes, then drives the real HTTP heartbeat route with the
agent's own bodies (``SimulatedCollector`` + ``heartbeat_body``: 8 cards with health counters and telemetry,
~3.4 KB, fresh ``sampled_at``/``telemetry_at`` on every beat) in five phases:

1. baseline  - every beat changes a counter on every card, so every beat writes 8 rows;
2. dedup     - the same closed-loop load with steady counters: the dedup cache skips the database;
3. target    - an open loop at a fixed rate (default 600/s = 3,000 nodes at 5 s) with steady counters;
               latency is measured from each request's scheduled time, so queueing is not hidden;
4. floor     - the dedup phase's load against ``bench/floor_app.py`` (bare Starlette on the same uvicorn:
               token check, JSON decode, the project's ``Heartbeat`` schema, nothing else): what no heartbeat
               route on this stack can avoid. The dedup phase's CPU per beat is printed as a ratio of it.
               ``--floor-decoder typed`` makes it decode with the server's own typed decoder instead;
5. same load - the server and the floor each offered the same open loop at each of ``--equal-rates`` (default
               600/s and 2,000/s), alternating, twice: CPU per beat at one load. Either app's CPU per beat
               falls as its own rate rises (more requests per turn of the event loop), so phases 2 and 4, each
               as fast as it goes, compare the server at its rate with the floor at two or three times it.

With ``--connection-per-beat``, a phase after the target phase offers the same open loop with each beat on a
connection of its own, opened for it and closed after its answer: what an agent costs the server when its idle
connection expires between two beats.

The load generator is a minimal HTTP/1.1 keep-alive client on asyncio streams with pre-built requests: on a
2-core machine a general-purpose client would spend more CPU per request than the server does and measure
itself. The server's own CPU time per beat (from /proc: user and system, and of it the system time), its write
system calls per beat (``syscw`` of /proc/PID/io: a socket write is one) and its SQL statements per beat (its
``heteroflow_db_statements_total`` counter) are reported for each phase; ratios are against the baseline
measured in the same run. Usage::

    .venv/bin/python bench/ingest.py [--nodes 3000] [--seconds 15] [--concurrency 16] [--rate 600]
                                     [--postgres | --database-url postgresql://…] [--no-floor]
                                     [--floor-decoder schema|typed]
                                     [--connection-per-beat]
                                     [--profile FILE]   # py-spy (on PATH), --gil: dedup phase; FILE.floor: floor
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.agent.runner import registration_for
from heteroflow.agent.simulated import SimulatedCollector
from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.storage.testing import PostgresServer

# placeholders in the pre-rendered agent bodies, replaced per request (cheaper than a json.dumps per beat)
TIME_MARK = "1999-01-01T00:00:00+00:00"
COUNTER_MARK = 987654321


@dataclass
class PhaseResult:
    name: str
    beats: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statements: float = 0.0
    server_cpu: float = 0.0
    server_system: float = 0.0
    """The part of ``server_cpu`` spent in the kernel (system time)."""
    server_writes: int = 0
    """Write system calls the server made over the phase."""
    beside_cpu: float = 0.0
    """The platform server's CPU seconds over a floor phase, while it sat idle beside the floor."""

    @property
    def rate(self) -> float:
        return self.beats / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms_per_beat(self) -> float:
        return self.server_cpu / max(1, self.beats) * 1000

    @property
    def system_ms_per_beat(self) -> float:
        return self.server_system / max(1, self.beats) * 1000

    @property
    def writes_per_beat(self) -> float:
        return self.server_writes / max(1, self.beats)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


class Connection:
    """One keep-alive HTTP/1.1 connection that sends pre-built requests and reads status + body."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, request: bytes) -> int:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


CREDENTIALS: dict[str, str] = {}
"""Node id → the node credential its registration issued (sent with each of its beats)."""


def request_bytes(port: int, token: str, node: str, body: bytes) -> bytes:
    head = (
        f"POST /api/v1/nodes/{node}/heartbeat HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nX-HeteroFlow-Node-Credential: {CREDENTIALS.get(node, '')}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass(frozen=True)
class AgentNode:
    """One simulated node: its registration and its heartbeat body as the agent renders it."""

    hostname: str
    registration: dict[str, Any]
    steady: bytes  # counters as collected; time placeholders
    changing: bytes  # every card's corrected counter replaced by COUNTER_MARK; time placeholders

    def body(self, step: int | None) -> bytes:
        """The body of one beat: fresh sample times; with ``step``, a corrected counter that changed."""
        now = datetime.now(UTC).isoformat().encode()
        if step is None:
            return self.steady.replace(TIME_MARK.encode(), now)
        return self.changing.replace(TIME_MARK.encode(), now).replace(str(COUNTER_MARK).encode(), str(step).encode())


def agent_nodes(count: int) -> list[AgentNode]:
    """``count`` nodes of 8 simulated cards each, their bodies built by the agent's own code."""
    clock = SystemClock()
    started = clock.now()
    nodes = []
    for i in range(count):
        hostname = f"bench-{i:05d}"
        collector = SimulatedCollector(clock=clock, count=8, seed=hostname, started_at=started)
        health, telemetry = collector.read_health(), collector.read_telemetry()
        registration = registration_for(hostname=hostname, source="simulated", health=health, telemetry=telemetry)
        body = heartbeat_body(health=health, telemetry=telemetry, xid_events=())
        for stat in body["gpu_stats"]:
            for key in ("sampled_at", "telemetry_at"):
                if key in stat:
                    stat[key] = TIME_MARK
        steady = json.dumps(body).encode()
        for stat in body["gpu_stats"]:
            stat["ecc_corrected_total"] = COUNTER_MARK
        nodes.append(AgentNode(hostname, asdict(registration), steady, json.dumps(body).encode()))
    return nodes


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process, seconds, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")


def write_calls(pid: int) -> int:
    """The write system calls a process made so far (``syscw`` of /proc/PID/io: a socket's ``write``/``send``
    among them)."""
    with open(f"/proc/{pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("syscw:"))


def heteroflow(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "heteroflow", *args], capture_output=True, text=True, check=True, env=env
    )
    return result.stdout.strip().splitlines()[-1]


class Bench:
    """Drives one HTTP server (the project's, or the floor app) with the agent bodies of ``agents``."""

    def __init__(
        self,
        *,
        port: int,
        token: str,
        admin: httpx.AsyncClient | None,
        node_ids: list[str],
        agents: list[AgentNode],
        server_pid: int,
    ) -> None:
        self.port = port
        self.token = token
        self.admin = admin
        self.node_ids = node_ids
        self.agents = agents
        self.server_pid = server_pid

    def request(self, node: int, step: int | None) -> bytes:
        return request_bytes(self.port, self.token, self.node_ids[node], self.agents[node].body(step))

    async def statements(self) -> float:
        if self.admin is None:
            return 0.0
        text = (await self.admin.get("/metrics")).text
        for line in text.splitlines():
            if line.startswith("heteroflow_db_statements_total "):
                return float(line.split()[1])
        raise RuntimeError("heteroflow_db_statements_total missing from /metrics")

    async def drain(self) -> None:
        """Wait until the server's health writer has no backlog (so one phase never bills the next)."""
        if self.admin is None:
            return
        deadline = time.monotonic() + 300
        while (await self.admin.get("/api/v1/server/status")).json()["health_ingest"]["pending_readings"]:
            if time.monotonic() > deadline:
                raise RuntimeError("the server's health writer did not drain within 300 s")
            await asyncio.sleep(0.2)

    async def prime(self) -> None:
        """One steady beat per node: first rows written, caches warm, before anything is measured."""
        connections = [await Connection.open(self.port) for _ in range(16)]
        for start in range(0, len(self.node_ids), len(connections)):
            await asyncio.gather(
                *(
                    c.send(self.request(node, None))
                    for c, node in zip(connections, range(start, len(self.node_ids)), strict=False)
                )
            )
        for c in connections:
            c.close()
        await self.drain()

    async def measure(self, result: PhaseResult, load: Any) -> PhaseResult:
        await self.drain()
        statements, (user, system), writes = (
            await self.statements(),
            cpu_split(self.server_pid),
            write_calls(self.server_pid),
        )
        await load(result)
        await self.drain()  # the writer's work for this phase is billed to it
        user_after, system_after = cpu_split(self.server_pid)
        result.server_cpu = user_after + system_after - user - system
        result.server_system = system_after - system
        result.server_writes = write_calls(self.server_pid) - writes
        result.statements = (await self.statements() - statements) / max(1, result.beats)
        return result

    async def closed_loop(self, result: PhaseResult, *, seconds: float, concurrency: int, changing: bool) -> None:
        deadline = time.perf_counter() + seconds
        counter = 0

        async def worker() -> None:
            nonlocal counter
            connection = await Connection.open(self.port)
            try:
                while time.perf_counter() < deadline:
                    counter += 1
                    request = self.request(counter % len(self.node_ids), counter if changing else None)
                    started = time.perf_counter()
                    status = await connection.send(request)
                    result.latencies.append(time.perf_counter() - started)
                    result.beats += 1
                    result.errors += status != 200
            finally:
                connection.close()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.seconds = time.perf_counter() - started

    async def open_loop(
        self, result: PhaseResult, *, seconds: float, rate: float, connections: int, fresh: bool = False
    ) -> None:
        """Beats at ``rate`` over a pool of ``connections`` keep-alive connections (``fresh``: each beat on a
        connection of its own, opened for it and closed after its answer)."""
        pool: asyncio.Queue[Connection] = asyncio.Queue()
        for _ in range(0 if fresh else connections):
            pool.put_nowait(await Connection.open(self.port))

        async def one(step: int, scheduled: float) -> None:
            connection = await (Connection.open(self.port) if fresh else pool.get())
            try:
                status = await connection.send(self.request(step % len(self.node_ids), None))
            finally:
                if fresh:
                    connection.close()
                else:
                    pool.put_nowait(connection)
            # from the scheduled time: waiting for a free connection is latency too
            result.latencies.append(time.perf_counter() - scheduled)
            result.beats += 1
            result.errors += status != 200

        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        for step in range(int(seconds * rate)):
            scheduled = start + step / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(step, scheduled)))
        await asyncio.gather(*tasks)
        result.seconds = time.perf_counter() - start
        while not pool.empty():
            pool.get_nowait().close()


async def run(
    args: argparse.Namespace, port: int, agent_token: str, admin_token: str, pid: int, agents: list[AgentNode]
) -> tuple[list[PhaseResult], list[str]]:
    url = f"http://127.0.0.1:{port}"
    async with (
        httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {agent_token}"}, timeout=30, verify=client_tls()
        ) as client,
        httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30, verify=client_tls()
        ) as admin,
    ):
        node_ids: list[str] = []
        for start in range(0, len(agents), 50):
            batch = await asyncio.gather(
                *(
                    client.post("/api/v1/nodes/register", json=agent.registration)
                    for agent in agents[start : start + 50]
                )
            )
            node_ids.extend(r.raise_for_status().json()["node_id"] for r in batch)
            CREDENTIALS.update((r.json()["node_id"], r.json()["node_credential"]) for r in batch)
        bench = Bench(port=port, token=agent_token, admin=admin, node_ids=node_ids, agents=agents, server_pid=pid)
        await bench.prime()
        baseline = await bench.measure(
            PhaseResult("baseline: every beat writes"),
            lambda r: bench.closed_loop(r, seconds=args.seconds, concurrency=args.concurrency, changing=True),
        )
        await bench.prime()  # counters settle back: the stored rows are steady again
        profiler = start_profiler(args.profile, pid, args.seconds, gil=True) if args.profile else None
        dedup = await bench.measure(
            PhaseResult("dedup: steady counters"),
            lambda r: bench.closed_loop(r, seconds=args.seconds, concurrency=args.concurrency, changing=False),
        )
        if profiler is not None:
            profiler.wait(60)
        target = await bench.measure(
            PhaseResult(f"target {args.rate:.0f}/s (open loop)"),
            lambda r: bench.open_loop(r, seconds=args.seconds, rate=args.rate, connections=args.concurrency * 4),
        )
        fresh = (
            [
                await bench.measure(
                    PhaseResult(f"{args.rate:.0f}/s, a connection per beat"),
                    lambda r: bench.open_loop(
                        r, seconds=args.seconds, rate=args.rate, connections=args.concurrency * 4, fresh=True
                    ),
                )
            ]
            if args.connection_per_beat
            else []
        )
        return [baseline, dedup, target, *fresh], node_ids


async def run_floor(
    args: argparse.Namespace,
    *,
    token: str,
    floor: tuple[int, int],
    server: tuple[int, int],
    agents: list[AgentNode],
    node_ids: list[str],
) -> tuple[PhaseResult, dict[float, dict[str, float]]]:
    """The floor's closed-loop phase, then both apps at each of ``--equal-rates``: ``floor`` and ``server`` are
    (port, pid), the platform server idle during the floor's phases."""
    benches = {
        name: Bench(port=port, token=token, admin=None, node_ids=node_ids, agents=agents, server_pid=pid)
        for name, (port, pid) in (("server", server), ("floor", floor))
    }
    await benches["floor"].prime()
    profiler = start_profiler(f"{args.profile}.floor", floor[1], args.seconds, gil=True) if args.profile else None
    beside = cpu_seconds(server[1])
    closed = await benches["floor"].measure(
        PhaseResult("floor: typed decode" if args.floor_decoder == "typed" else "floor: decode + validate"),
        lambda r: benches["floor"].closed_loop(r, seconds=args.seconds, concurrency=args.concurrency, changing=False),
    )
    closed.beside_cpu = cpu_seconds(server[1]) - beside
    if profiler is not None:
        profiler.wait(60)
    return closed, await equal_load(args, benches)


async def equal_load(args: argparse.Namespace, benches: dict[str, Bench]) -> dict[float, dict[str, float]]:
    """CPU ms per beat of each app at each rate of ``--equal-rates``: the same open loop offered to each, the apps
    alternating, twice; the lower of each app's two is kept (a busy neighbour only adds)."""
    measured: dict[float, dict[str, float]] = {}
    for rate in args.equal_rates:
        cpu: dict[str, list[float]] = {name: [] for name in benches}
        for _ in range(2):
            for name, bench in benches.items():
                load = functools.partial(
                    bench.open_loop, seconds=args.seconds, rate=rate, connections=args.concurrency * 4
                )
                result = await bench.measure(PhaseResult(f"{name} at {rate:.0f}/s"), load)
                if result.errors:
                    raise RuntimeError(f"{result.name}: {result.errors} beats not answered 200")
                cpu[name].append(result.cpu_ms_per_beat)
        measured[rate] = {name: min(values) for name, values in cpu.items()}
    return measured


def start_profiler(path: str, pid: int, seconds: float, *, gil: bool = False) -> subprocess.Popen[bytes]:
    """py-spy sampling the server for ``seconds``, written as folded stacks (one ``frames count`` line each);
    with ``gil``, only the samples of the thread holding the interpreter lock."""
    command = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)), "--format", "raw"]
    command += ["--gil"] if gil else []
    return subprocess.Popen([*command, "--output", path, "--nonblocking"], stdout=subprocess.DEVNULL)


def wait_answering(url: str, token: str, *, what: str, status: int | None = 200) -> None:
    """Poll ``url`` until it answers (with ``status``, unless None), for at most 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            answer = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, verify=client_tls())
            if status is None or answer.status_code == status:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer within 30 s")
        time.sleep(0.1)


def start_floor(token: str, env: dict[str, str], decoder: str) -> tuple[subprocess.Popen[bytes], int]:
    """The floor app on the same uvicorn (and HTTP parser) the platform server runs on."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "floor_app:app",
            "--app-dir",
            str(Path(__file__).parent),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env={**env, "FLOOR_TOKEN": token, "FLOOR_DECODER": decoder},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_answering(f"http://127.0.0.1:{port}/", token, what="the floor app", status=None)
    return process, port


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--postgres", action="store_true", help="start a private PostgreSQL server and use it")
    parser.add_argument("--cache-entries", type=int, default=0, help="dedup cache size (default nodes x 8)")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor phases")
    parser.add_argument(
        "--floor-decoder",
        choices=("schema", "typed"),
        default="schema",
        help="the floor's decode: json.loads and the Heartbeat schema (default), or the server's own typed decoder of "
        "the common agent body (bench/floor_app.py)",
    )
    parser.add_argument(
        "--connection-per-beat",
        action="store_true",
        help="after the target phase, the same open loop with each beat on a new connection (what an agent does "
        "whose idle connection expired between two beats)",
    )
    parser.add_argument(
        "--equal-rates",
        type=lambda text: [float(rate) for rate in text.split(",") if rate],
        default=[600.0, 2000.0],
        help="offered rates (beats/s, comma-separated) at which the server and the floor are also driven alike, "
        "open loop, to compare their CPU per beat at one load ('' for none; default 600,2000)",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="record the server's stacks with py-spy (on PATH) during the dedup phase into FILE, and the "
        "floor's into FILE.floor (folded stacks; only while it holds the interpreter lock: shares of its Python CPU)",
    )
    args = parser.parse_args()
    cache_entries = args.cache_entries or args.nodes * 8

    workdir = tempfile.mkdtemp(prefix="hf-bench-")
    postgres = PostgresServer() if args.postgres else None
    if postgres is not None:
        postgres.start()
    database_url = postgres.create_database() if postgres else args.database_url or f"sqlite:///{workdir}/bench.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")}
    agent_token = heteroflow("admin", "create-token", "--scopes", "agent", "--database-url", database_url, env=env)
    admin_token = heteroflow("admin", "create-token", "--scopes", "admin", "--database-url", database_url, env=env)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "heteroflow", "server", "--port", str(port), "--database-url", database_url],
        env={
            **env,
            "HETEROFLOW_LOG_LEVEL": "warning",
            # sized to the fleet as docs/operations.md says: nodes x 8 cards
            "HETEROFLOW_GPU_HEALTH_DEDUP_CACHE_ENTRIES": str(cache_entries),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    agents = agent_nodes(args.nodes)
    floor: PhaseResult | None = None
    equal: dict[float, dict[str, float]] = {}
    try:
        wait_answering(f"http://127.0.0.1:{port}/healthz", agent_token, what="the server")
        results, node_ids = asyncio.run(run(args, port, agent_token, admin_token, server.pid, agents))
        if not args.no_floor:  # the platform server stays up, idle, beside the floor (its CPU meanwhile is printed)
            floor_process, floor_port = start_floor(agent_token, env, args.floor_decoder)
            try:
                floor, equal = asyncio.run(
                    run_floor(
                        args,
                        token=agent_token,
                        floor=(floor_port, floor_process.pid),
                        server=(port, server.pid),
                        agents=agents,
                        node_ids=node_ids,
                    )
                )
            finally:
                floor_process.terminate()
                floor_process.wait(15)
    finally:
        server.terminate()
        server.wait(15)
        if postgres is not None:
            postgres.close()

    backend = database_url.split(":", 1)[0]
    print(
        f"heartbeat ingestion, 8 GPUs per beat, {args.nodes} nodes, {backend}, dedup cache {cache_entries} entries, "
        f"{os.cpu_count()} CPUs shared by the load generator and the server"
    )
    print(
        f"{'phase':<30} {'beats/s':>8} {'x base':>7} {'p50 ms':>7} {'p99 ms':>7} {'stmts/beat':>10} "
        f"{'srv cpu ms/beat':>15} {'of it sys':>9} {'writes/beat':>11} {'errors':>6}"
    )
    base = results[0].rate
    for r in [*results, *([floor] if floor else [])]:
        print(
            f"{r.name:<30} {r.rate:>8.0f} {r.rate / base:>7.2f} {r.percentile(0.50):>7.1f} {r.percentile(0.99):>7.1f} "
            f"{r.statements:>10.3f} {r.cpu_ms_per_beat:>15.3f} {r.system_ms_per_beat:>9.3f} {r.writes_per_beat:>11.2f} "
            f"{r.errors:>6}"
        )

    body = sum(len(agent.body(None)) for agent in agents) / len(agents)
    print(f"mean agent body {body:.0f} B; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if floor is not None:
        dedup = results[1]
        print(
            f"dedup / floor: CPU per beat x{dedup.cpu_ms_per_beat / floor.cpu_ms_per_beat:.2f}, "
            f"throughput x{dedup.rate / floor.rate:.2f} (each as fast as it goes); the platform server, idle beside "
            f"the floor's phase, took {floor.beside_cpu / floor.seconds * 100:.1f} % of a core"
        )
    for rate, cpu in equal.items():
        print(
            f"same offered load {rate:.0f}/s (open loop, alternating, lower of two): server {cpu['server']:.3f}, "
            f"floor {cpu['floor']:.3f} ms/beat: CPU per beat x{cpu['server'] / cpu['floor']:.2f}"
        )


if __name__ == "__main__":
    main()
