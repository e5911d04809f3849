"""Heartbeats of a simulated fleet against one platform server, at the agent's cadence, then past saturation.

Starts a real ``heteroflow server`` process, registers N nodes of 8 simulated cards each and drives their
heartbeats from asyncio. Registrations and heartbeat bodies come from the agent's own code: each node is a
:class:`~heteroflow.agent.simulated.SimulatedCollector` (seeded by its hostname, so the fleet is the same run
after run), registered with :func:`~heteroflow.agent.runner.registration_for` and beating
:func:`~heteroflow.agent.heartbeat.heartbeat_body` — health counters re-read every 60 s, as the agent's
scheduler does. A node's body is built in full (collector read, ``heartbeat_body``, JSON) when it re-reads its
health counters; the beats between send that body again with the send time as each card's ``telemetry_at``
(the same telemetry values for up to a minute, where the agent reads fresh ones: the server's side paths cost
the same for any value). A full build costs the load generator about as much CPU as the server spends on the
beat, and a fleet's agents do not run on the server's cores; ``--live-bodies`` builds every beat in full. Like
the agent, a node never has two beats in flight: a beat that is due while the node's previous one is unanswered
is skipped (and counted).

Phases, one server, one run:

1. baseline    - ``--baseline-nodes`` (default 300) nodes at the agent's cadence (one beat per node per 5 s);
2. first beats - every one of the ``--nodes`` nodes sends one beat, spread evenly over ``--warmup-seconds``
                 (default 30; 0 skips the phase): a node's first beat writes its 8 cards' first rows, the burst a
                 fleet new to a server makes, kept apart from the steady state it would otherwise hide;
3. fleet       - ``--nodes`` (default 3,000) nodes at the same cadence: 600 beats/s for 3,000 nodes; after the
                 first-beat phase, the steady state (change-only rows and the 5-minute keepalive rows);
4. overload    - the fleet's beats back to back (closed loop) from ``--overload-concurrency`` connections, far
                 above what the server can answer within the agent's 5 s timeout.

While a phase runs the bench reads the server's ``/metrics`` every ``--scrape-every`` seconds (default 15, as a
Prometheus server scraping the platform would; 0: never): at fleet scale the per-GPU series are most of what the
server writes (3,000 nodes: 24,000 cards, 240,000 lines), and the phase reports the scrapes' count and worst time.

The client: ``--concurrency`` lanes (the bound on beats in flight). ``--client raw`` (the default) sends each
beat over a minimal keep-alive HTTP/1.1 connection; ``--client httpx`` uses ``httpx.AsyncClient`` as the agent
does (several small pools: ``httpx`` scans its pool on every request). On two shared cores ``httpx`` costs more
CPU per beat than the server spends on it, so it measures itself before the server; the overload phase always
uses raw connections with requests built before its clock starts.

Latency is measured from each beat's scheduled time (open loop), so queueing in the client is not hidden; the
client waits at most the agent's 5 s (in all) for an answer. Each phase prints: beats/s answered 2xx, latency
p50/p95/p99 (and the p99 without each node's first beat of the phase, which writes the node's first rows),
answers by status (``timeout`` and exception names for the client's own errors), Retry-After values of the
refusals, the server's RSS at the start and end of the phase (VmRSS) and its peak (VmHWM), the server's CPU per
beat, health rows written per 2xx beat (the write policy turns most beats into no row), the liveness probe's
worst latency, the admission gate's peak in-flight count, the phase's peak event-loop lag (the server's peak
when it rose in the phase, else the highest of the twice-a-second samples of the current lag) and refusals, and
the load generator's own CPU. Ratios are against the baseline phase of the same run. A phase longer than
``--report-every`` seconds (default 60) also prints one line per such window while it runs (answered beats,
p50/p99, the server's CPU per beat, also as a multiple of the load generator's, and RSS, and what shared the
cores in the window: the CPU of the load generator, the server and PostgreSQL in cores, the hypervisor's steal,
PostgreSQL's checkpoints and autovacuum runs), so a long run (``--seconds 1200``) shows growth and what came with
it; with six windows or more the last third of them is compared with the first: the server's CPU per beat against
the load generator's, whose work per beat is fixed, so that the machine slowing is told from the server. Usage::

    .venv/bin/python bench/load_heartbeats.py [--nodes 3000] [--seconds 60] [--baseline-nodes 300]
        [--baseline-seconds 20] [--warmup-seconds 30] [--report-every 60]
        [--concurrency 64] [--client raw|httpx] [--live-bodies] [--overload-concurrency 1024]
        [--overload-seconds 15] [--max-in-flight N] [--max-in-flight-per-peer N] [--shed-lag S] [--scrape-every 15]
        [--gc-young-threshold N] [--switch-interval-ms 0.5]
        [--postgres | --database-url postgresql://…] [--workers N] [--profile FILE]

``--profile FILE`` records the server's stacks over the fleet phase with py-spy (on PATH), only while the server
holds the interpreter lock (``--gil``), so that the shares are of its Python CPU and not of threads waiting for
the lock or for the database; folded stacks, one ``frames count`` line each.

Every beat of the bench comes from one address (127.0.0.1), where a fleet's come from one address per node: the
server's per-address bound (``HETEROFLOW_SERVER_MAX_IN_FLIGHT_PER_PEER``, default 128) would answer the overload
phase 429 before the heartbeat gate's 503, which is what the phase measures. The run raises it above its own
connection count (``--max-in-flight-per-peer``; default: the larger concurrency plus 64).

With ``--workers N`` the server runs N worker processes on its port (PostgreSQL only); CPU and RSS are then the
sums over the supervisor and its workers, and the status-derived columns (rows per beat, peak in flight, lag)
are those of the worker that answered the status request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.ingest
from bench.ingest import start_profiler
from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.agent.readings import HealthCollection
from heteroflow.agent.runner import registration_for
from heteroflow.agent.simulated import SimulatedCollector
from heteroflow.core.clock import Clock, SystemClock
from heteroflow.core.ids import NodeId
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls
from heteroflow.storage.testing import PostgresServer

AGENT_TIMEOUT_SEC = 5.0
"""The agent's HTTP timeout (``HttpPlatformClient``): a beat not answered within it is a failed beat."""
HEALTH_INTERVAL_SEC = 60.0
"""The agent's health-counter period; telemetry rides every beat."""
POOL_SIZE = 32
"""Connections per ``httpx`` client of the load generator."""
SIMULATED_SPEED = 60.0
"""Simulated hours of the cards' error counters per real hour (the agent's ``simulate_speed`` default)."""
SCRAPER = """
import os, sys
import httpx
from heteroflow.http.tls import client_tls
headers = {"Authorization": "Bearer " + os.environ["HF_SCRAPE_TOKEN"]}
with httpx.Client(base_url=os.environ["HF_SCRAPE_URL"], headers=headers, timeout=60, verify=client_tls()) as client:
    for _ in sys.stdin:
        try:
            client.get("/metrics").raise_for_status()
            print("ok", flush=True)
        except httpx.HTTPError as exc:
            print(type(exc).__name__, flush=True)
"""
"""The bench's Prometheus: one scrape of ``/metrics`` per line on its stdin, ``ok`` or the error's name per line."""
SLOW_BEAT_SEC = 0.05
"""A beat slower than this (the p99 target at fleet load) is counted and held against the scrapes and the minute."""
STOP_WAIT_SEC = 300.0
"""How long the server may take to stop when told to (it writes what it holds first) before it is killed."""


class SimulatedNode:
    """One agent's payloads: a seeded simulated collector, read the way the agent's scheduler reads it."""

    def __init__(
        self, hostname: str, *, cards: int, clock: Clock, started_at: datetime, speed: float = SIMULATED_SPEED
    ) -> None:
        self.hostname = hostname
        self.node_id: NodeId | None = None
        self.credential = ""
        self.collector = SimulatedCollector(clock=clock, count=cards, seed=hostname, started_at=started_at, speed=speed)
        self._clock = clock
        self._health: HealthCollection | None = None
        self._health_read = -HEALTH_INTERVAL_SEC
        self._template: list[bytes] | None = None
        self.in_flight = False

    def registration(self) -> dict[str, Any]:
        health, telemetry = self.collector.read_health(), self.collector.read_telemetry()
        reg = registration_for(hostname=self.hostname, source="simulated", health=health, telemetry=telemetry)
        return {
            "hostname": reg.hostname,
            "vendor": reg.vendor,
            "model": reg.model,
            "gpu_count": reg.gpu_count,
            "source": reg.source,
        }

    def body(self, *, live: bool = False) -> bytes:
        """The agent's body for a beat sent now.

        Built in full — the collector read, :func:`heartbeat_body`, ``json.dumps`` — whenever the agent re-reads
        the health counters (every 60 s), and every beat with ``live``. Between full builds a beat is the last
        build's bytes with the send time as each card's ``telemetry_at``: the agent's body with telemetry values
        repeated for up to a minute (the server's side paths treat any value alike), for a fraction of the
        load generator's CPU (docs/benchmarks.md).
        """
        now = self._clock.monotonic()
        if live or now - self._health_read >= HEALTH_INTERVAL_SEC or self._template is None:
            if now - self._health_read >= HEALTH_INTERVAL_SEC:
                self._health, self._health_read = self.collector.read_health(), now
            telemetry = self.collector.read_telemetry()
            body = json.dumps(heartbeat_body(health=self._health, telemetry=telemetry, xid_events=())).encode()
            # each card's telemetry time, once per card: the points where a later beat puts its send time
            parts = body.split(_telemetry_at(telemetry.collected_at))
            self._template = parts if len(parts) == len(telemetry.gpus) + 1 else None
            return body
        return _telemetry_at(self._clock.now()).join(self._template)


def _telemetry_at(at: datetime) -> bytes:
    """A card's ``telemetry_at`` member as ``json.dumps`` writes it in a body."""
    return b'"telemetry_at": ' + json.dumps(at.isoformat()).encode()


@dataclass
class Phase:
    name: str
    nodes: int
    offered: float = 0.0
    """Beats scheduled per second (0 for the closed loop)."""
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    repeat_latencies: list[float] = field(default_factory=list)
    """Latencies of every beat but each node's first of the phase (which may write the node's first rows)."""
    answers: Counter[str] = field(default_factory=Counter)
    skipped: int = 0
    retry_after: Counter[str] = field(default_factory=Counter)
    rss_start_kib: int = 0
    rss_end_kib: int = 0
    rss_peak_kib: int = 0
    """The server's VmHWM at the end of the phase: its peak since it started."""
    server_cpu_sec: float = 0.0
    client_cpu_sec: float = 0.0
    rows_written: int = 0
    readings_offered: int = 0
    probe_worst_sec: float = 0.0
    probe_failures: int = 0
    scrapes: list[float] = field(default_factory=list)
    """How long each of the phase's answered ``/metrics`` scrapes took, seconds (``--scrape-every``)."""
    scrape_failures: Counter[str] = field(default_factory=Counter)
    """The phase's scrapes that got no 200, by exception name."""
    scrape_spans: list[tuple[float, float]] = field(default_factory=list)
    """When each scrape was sent and answered (``perf_counter``): what a slow beat is held against."""
    slow_beats: list[tuple[float, float]] = field(default_factory=list)
    windows: list[tuple[float, float, float]] = field(default_factory=list)
    """Each report window's server and load-generator CPU per beat and p99, ms (``--report-every``)."""
    """When each beat slower than :data:`SLOW_BEAT_SEC` was scheduled and answered (``perf_counter``)."""
    peak_in_flight: int = 0
    """The server's own count: the most heartbeats it worked on at once (since it started)."""
    peak_lag_sec: float = 0.0
    """The server's event-loop lag at its worst in this phase (see the module docstring)."""
    sampled_lag_sec: float = 0.0
    """The highest of the server's current-lag values read twice a second during the phase."""
    first_beats: bool = False
    """Every node sends its first beat in this phase: all its latencies count as first beats."""
    refused: dict[str, int] = field(default_factory=dict)
    """Heartbeats the server's admission gate refused in this phase, by reason."""
    full_collections: int = 0
    """The server's full garbage collections in this phase (``heteroflow_gc_pause_seconds``, generation 2)."""
    gc_pause_sec: float = 0.0
    """How long the server's garbage collections of every generation held it in this phase, seconds."""

    @property
    def beats(self) -> int:
        return sum(self.answers.values())

    @property
    def ok(self) -> int:
        return sum(n for status, n in self.answers.items() if status.startswith("2"))

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def percentile(self, q: float, *, repeats_only: bool = False) -> float:
        ordered = sorted(self.repeat_latencies if repeats_only else self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


class RawConnection:
    """One keep-alive HTTP/1.1 connection sending pre-built requests; reads the status and Retry-After."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> RawConnection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, request: bytes) -> tuple[int, str | None]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length, retry_after = 0, None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"retry-after":
                retry_after = value.strip().decode()
        await self.reader.readexactly(length)
        return int(head[9:12]), retry_after

    def close(self) -> None:
        self.writer.close()


def beat_request(port: int, authorization: str, node: SimulatedNode, *, live: bool = False) -> bytes:
    body = node.body(live=live)
    head = (
        f"POST /api/v1/nodes/{node.node_id}/heartbeat HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: {authorization}\r\nX-HeteroFlow-Node-Credential: {node.credential}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants now (``--workers``: the supervisor and its worker processes), from /proc."""
    pids, pending = [], [pid]
    while pending:
        current = pending.pop()
        pids.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as children:
                pending.extend(int(child) for child in children.read().split())
        except FileNotFoundError:
            continue
    return pids


def proc_status_kib(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` size in KiB (``VmRSS``, ``VmHWM``), summed over the process and its children."""
    total = 0
    for member in process_tree(pid):
        with open(f"/proc/{member}/status") as status:
            for line in status:
                if line.startswith(f"{key}:"):
                    total += int(line.split()[1])
                    break
            else:
                raise RuntimeError(f"{key} missing from /proc/{member}/status")
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its living children, from /proc (Linux)."""
    total = 0
    for member in process_tree(pid):
        try:
            with open(f"/proc/{member}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended since the tree was read (PostgreSQL's backends and autovacuum workers come and go)
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> tuple[int, int]:
    """All CPUs' time since boot and the part of it the hypervisor took (steal), in ticks, from ``/proc/stat``."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    return sum(fields[:8]), fields[7]


def postgres_activity(postgres: PostgresServer, database_url: str) -> dict[str, float]:
    """PostgreSQL's CPU seconds (every process, ended backends included), checkpoints and autovacuum runs so far."""
    with open(postgres.data_dir / "postmaster.pid") as pidfile:
        postmaster = int(pidfile.readline())
    with open(f"/proc/{postmaster}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ended = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # children waited for: ended backends
    with psycopg.connect(database_url, autocommit=True) as conn:
        try:
            checkpoints = conn.execute("SELECT num_timed + num_requested FROM pg_stat_checkpointer").fetchone()
        except psycopg.errors.UndefinedTable:  # before PostgreSQL 17
            checkpoints = conn.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").fetchone()
        vacuums = conn.execute(
            "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_all_tables"
        ).fetchone()
    return {
        "postgres": cpu_seconds(postmaster) + ended,
        "checkpoints": float(checkpoints[0] if checkpoints else 0),
        "autovacuum": float(vacuums[0] if vacuums else 0),
    }


def heteroflow(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "heteroflow", *args], capture_output=True, text=True, check=True, env=env
    )
    return result.stdout.strip().splitlines()[-1]


Lanes = asyncio.Semaphore | asyncio.Queue[RawConnection | None]


class Fleet:
    def __init__(
        self,
        *,
        url: str,
        agent_token: str,
        admin_token: str,
        pid: int,
        concurrency: int,
        client: str,
        live_bodies: bool = False,
        speed: float = SIMULATED_SPEED,
        scrape_every: float = 0.0,
        postgres: PostgresServer | None = None,
        database_url: str = "",
    ) -> None:
        self.pid = pid
        self.live_bodies = live_bodies
        self.speed = speed
        self.scrape_every = scrape_every
        self.postgres = postgres
        """The private PostgreSQL server of ``--postgres`` (its CPU and activity are reported per window)."""
        self.database_url = database_url
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.authorization = f"Bearer {agent_token}"
        self.client = client
        # Several small pools instead of one big one: httpx scans its whole pool for every request, which with
        # a thousand connections costs the load generator more CPU than the server spends on the beat.
        self.agents = [
            httpx.AsyncClient(
                base_url=url,
                headers={"Authorization": f"Bearer {agent_token}", "Content-Type": "application/json"},
                # idle connections expire before the server's keep-alive (30 s) closes them (no reuse race)
                limits=httpx.Limits(
                    max_connections=POOL_SIZE, max_keepalive_connections=POOL_SIZE, keepalive_expiry=2.0
                ),
                verify=client_tls(),
            )
            for _ in range(-(-concurrency // POOL_SIZE))
        ]
        self.admin = httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=60, verify=client_tls()
        )
        self.admin_token = admin_token
        self.scraper_command: list[str] = [sys.executable, "-c", SCRAPER]
        """The scraping process (:meth:`scrape`): a line on its stdin asks for one scrape; it answers ``ok`` or the
        error's name on a line of its own."""
        self.clock = SystemClock()
        self.started_at = self.clock.now()

    async def aclose(self) -> None:
        for agent in self.agents:
            await agent.aclose()
        await self.admin.aclose()

    def nodes(self, count: int, prefix: str) -> list[SimulatedNode]:
        return [
            SimulatedNode(f"{prefix}-{i:05d}", cards=8, clock=self.clock, started_at=self.started_at, speed=self.speed)
            for i in range(count)
        ]

    async def register(self, nodes: list[SimulatedNode]) -> None:
        for start in range(0, len(nodes), 32):
            batch = nodes[start : start + 32]
            answers = await asyncio.gather(
                *(self.agents[0].post("/api/v1/nodes/register", json=n.registration()) for n in batch)
            )
            for node, answer in zip(batch, answers, strict=True):
                answer.raise_for_status()
                node.node_id = NodeId(answer.json()["node_id"])
                node.credential = answer.json()["node_credential"]

    async def ingest_status(self) -> dict[str, Any]:
        body: dict[str, Any] = (await self.admin.get("/api/v1/server/status")).json()
        return body

    async def collections(self) -> dict[str, tuple[float, float]]:
        """The server's garbage collections so far: generation -> (count, seconds), from its /metrics."""
        text = (await self.admin.get("/metrics")).text
        found: dict[str, list[float]] = {}
        for line in text.splitlines():
            for part, slot in (("_count", 0), ("_sum", 1)):
                prefix = f'heteroflow_gc_pause_seconds{part}{{generation="'
                if line.startswith(prefix):
                    generation = line[len(prefix) :].split('"', 1)[0]
                    found.setdefault(generation, [0.0, 0.0])[slot] = float(line.rsplit(" ", 1)[1])
        return {generation: (count, seconds) for generation, (count, seconds) in found.items()}

    async def drain(self) -> None:
        deadline = time.monotonic() + 300
        while (await self.ingest_status())["health_ingest"]["pending_readings"]:
            if time.monotonic() > deadline:
                raise RuntimeError("the server's health writer did not drain within 300 s")
            await asyncio.sleep(0.2)

    async def node_count(self) -> int:
        total: int = (await self.admin.get("/api/v1/nodes", params={"limit": 1})).json()["total"]
        return total

    async def send(
        self, node: SimulatedNode, phase: Phase, *, scheduled: float, lanes: Lanes, lane: int, repeat: bool = False
    ) -> None:
        """One beat of ``node``, over a free lane (the concurrency bound); its answer is tallied in ``phase``."""
        node.in_flight = True
        try:
            if isinstance(lanes, asyncio.Semaphore):
                status, retry_after = await self._post_httpx(node, lanes, lane)
            else:
                status, retry_after = await self._post_raw(node, lanes)
        except TimeoutError:
            phase.answers["timeout"] += 1
            return
        except (httpx.TransportError, OSError, asyncio.IncompleteReadError) as exc:
            phase.answers[type(exc).__name__] += 1
            return
        finally:
            node.in_flight = False
        answered = time.perf_counter()
        phase.latencies.append(answered - scheduled)
        if answered - scheduled > SLOW_BEAT_SEC:
            phase.slow_beats.append((scheduled, answered))
        if repeat:
            phase.repeat_latencies.append(phase.latencies[-1])
        phase.answers[str(status)] += 1
        if status in (429, 503):
            phase.retry_after[retry_after or "none"] += 1

    async def _post_httpx(self, node: SimulatedNode, gate: asyncio.Semaphore, lane: int) -> tuple[int, str | None]:
        async with gate, asyncio.timeout(AGENT_TIMEOUT_SEC):
            answer = await self.agents[lane % len(self.agents)].post(
                f"/api/v1/nodes/{node.node_id}/heartbeat",
                content=node.body(live=self.live_bodies),
                headers={"X-HeteroFlow-Node-Credential": node.credential},
            )
        return answer.status_code, answer.headers.get("retry-after")

    async def _post_raw(self, node: SimulatedNode, pool: asyncio.Queue[RawConnection | None]) -> tuple[int, str | None]:
        connection = await pool.get()
        try:
            async with asyncio.timeout(AGENT_TIMEOUT_SEC):
                connection = connection or await RawConnection.open(self.port)
                answer = await connection.send(beat_request(self.port, self.authorization, node, live=self.live_bodies))
        except BaseException:
            if connection is not None:
                connection.close()  # a late answer must never be read as the next beat's
            pool.put_nowait(None)
            raise
        pool.put_nowait(connection)
        return answer

    async def probe(self, phase: Phase, stop: asyncio.Event) -> None:
        """The liveness route, twice a second, while the phase runs: its worst latency and its failures."""
        while not stop.is_set():
            started = time.perf_counter()
            try:
                ok = (await self.admin.get("/healthz", timeout=AGENT_TIMEOUT_SEC)).status_code == 200
            except httpx.HTTPError:
                ok = False
            phase.probe_worst_sec = max(phase.probe_worst_sec, time.perf_counter() - started)
            phase.probe_failures += not ok
            try:
                lag = (await self.ingest_status())["heartbeat_admission"]["lag_sec"]
                phase.sampled_lag_sec = max(phase.sampled_lag_sec, lag)
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)

    async def scrape(self, phase: Phase, stop: asyncio.Event) -> None:
        """``/metrics`` every ``scrape_every`` seconds while the phase runs (the first one a period in): each
        scrape's time, the body read whole, as a Prometheus server scraping the platform would — from a process of
        its own (:data:`SCRAPER`), as Prometheus is: read in this process, the 28 MB answer of a 3,000-node fleet
        took the load generator ~0.1 s of CPU per scrape, which delayed the beats it was sending meanwhile."""
        scraper = await asyncio.create_subprocess_exec(
            *self.scraper_command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "HF_SCRAPE_URL": self.url, "HF_SCRAPE_TOKEN": self.admin_token},
        )
        assert scraper.stdin is not None
        assert scraper.stdout is not None
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.scrape_every)
                if stop.is_set():
                    return
                started = time.perf_counter()
                try:
                    scraper.stdin.write(b"scrape\n")
                    await scraper.stdin.drain()
                    answer = (await scraper.stdout.readline()).decode().strip()
                except (BrokenPipeError, ConnectionResetError):
                    answer = ""  # the scraper is gone
                if answer != "ok":  # counted and reported: a scrape that fails is a finding, not a crash
                    phase.scrape_failures[answer or "scraper exited"] += 1
                    if not answer:
                        return
                    continue
                phase.scrapes.append(time.perf_counter() - started)
                phase.scrape_spans.append((started, started + phase.scrapes[-1]))
        finally:
            if scraper.returncode is None:
                scraper.stdin.close()
                await scraper.wait()

    async def windows(self, phase: Phase, every: float, stop: asyncio.Event) -> None:
        """One line per ``every`` seconds of the phase: its beats, latency, server CPU per beat and RSS.

        And what shares the cores with it over the same window: the CPU of the load generator, the server and
        PostgreSQL (its processes, those that ended included) in cores, the share of all CPUs' time the
        hypervisor took (steal, ``/proc/stat``), and with PostgreSQL its checkpoints and autovacuum/autoanalyze
        runs in the window.
        """
        started, seen = time.perf_counter(), 0
        usage = await asyncio.to_thread(self.usage)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
            if stop.is_set():
                return
            window, seen = sorted(phase.latencies[seen:]), len(phase.latencies)
            now = await asyncio.to_thread(self.usage)
            spent = {name: now[name] - usage[name] if name in usage else float("nan") for name in now}
            spent.update({name: float("nan") for name in usage.keys() - now.keys()})
            p50, p99 = (window[int(q * (len(window) - 1))] * 1000 if window else float("nan") for q in (0.5, 0.99))
            shared = (
                f"steal {spent['steal'] / max(1.0, spent['ticks']) * 100:3.0f} %, CPU cores client "
                f"{spent['client'] / every:4.2f} server {spent['server'] / every:4.2f}"
            )
            if self.postgres is not None:
                shared += (
                    f" postgres {spent['postgres'] / every:4.2f}, checkpoints {spent['checkpoints']:.0f}, "
                    f"autovacuum {spent['autovacuum']:.0f}"
                )
            server_ms, client_ms = (spent[party] / max(1, len(window)) * 1000 for party in ("server", "client"))
            phase.windows.append((server_ms, client_ms, p99))
            print(
                f"  {phase.name} +{time.perf_counter() - started:5.0f} s: {len(window) / every:6.0f} answered/s, "
                f"p50 {p50:7.1f} ms, p99 {p99:7.1f} ms, max {window[-1] * 1000 if window else float('nan'):7.1f} ms, "
                f"server CPU {server_ms:5.2f} ms/beat (x{server_ms / max(client_ms, 1e-9):4.2f} the load generator's), "
                f"RSS {proc_status_kib(self.pid, 'VmRSS') / 1024:5.0f} MiB; {shared}",
                flush=True,
            )
            usage = now

    def usage(self) -> dict[str, float]:
        """Counters read at a window's edges: CPU seconds by party, CPU ticks and steal, PostgreSQL's activity."""
        ticks, steal = cpu_ticks()
        found = {
            "ticks": float(ticks),
            "steal": float(steal),
            "client": time.process_time(),
            "server": cpu_seconds(self.pid),
        }
        if self.postgres is not None:
            try:
                found.update(postgres_activity(self.postgres, self.database_url))
            except (OSError, psycopg.Error) as exc:  # the window's line goes out without them, the run goes on
                print(f"  (PostgreSQL's activity not read: {type(exc).__name__}: {exc})", flush=True)
        return found

    async def measure(self, phase: Phase, load: Any, *, report_every: float = 0.0) -> Phase:
        await self.drain()
        before = await self.ingest_status()
        collections_before = await self.collections()
        phase.rss_start_kib = proc_status_kib(self.pid, "VmRSS")
        cpu, client_cpu = cpu_seconds(self.pid), time.process_time()
        stop = asyncio.Event()
        prober = asyncio.create_task(self.probe(phase, stop))
        scraper = asyncio.create_task(self.scrape(phase, stop)) if self.scrape_every > 0 else None
        reporter = asyncio.create_task(self.windows(phase, report_every, stop)) if report_every > 0 else None
        started = time.perf_counter()
        await load(phase)
        phase.seconds = time.perf_counter() - started
        stop.set()
        await prober
        if scraper is not None:
            await scraper
        if reporter is not None:
            await reporter
        phase.client_cpu_sec = time.process_time() - client_cpu
        phase.rss_end_kib = proc_status_kib(self.pid, "VmRSS")
        phase.rss_peak_kib = proc_status_kib(self.pid, "VmHWM")
        await self.drain()  # the writer's work for this phase is billed to it
        phase.server_cpu_sec = cpu_seconds(self.pid) - cpu
        after = await self.ingest_status()
        collections = await self.collections()
        phase.full_collections = round(collections.get("2", (0.0, 0.0))[0] - collections_before.get("2", (0.0, 0.0))[0])
        phase.gc_pause_sec = sum(seconds for _, seconds in collections.values()) - sum(
            seconds for _, seconds in collections_before.values()
        )
        phase.rows_written = after["health_ingest"]["written_total"] - before["health_ingest"]["written_total"]
        phase.readings_offered = after["health_ingest"]["offered_total"] - before["health_ingest"]["offered_total"]
        gate, gate_before = after["heartbeat_admission"], before["heartbeat_admission"]
        phase.peak_in_flight = gate["peak_in_flight"]
        # the server keeps its peak since it started: it is this phase's only when it rose in this phase
        rose = gate["peak_lag_sec"] > gate_before["peak_lag_sec"]
        phase.peak_lag_sec = gate["peak_lag_sec"] if rose else phase.sampled_lag_sec
        phase.refused = {
            why: gate[f"refused_{why}_total"] - gate_before[f"refused_{why}_total"] for why in ("busy", "lagging")
        }
        return phase

    async def cadence(
        self,
        phase: Phase,
        nodes: list[SimulatedNode],
        *,
        seconds: float,
        interval: float,
        concurrency: int,
    ) -> None:
        """Open loop: node i beats at i x interval / N, then every interval (the agents' phases are spread)."""
        lanes = self.lanes(concurrency)
        rate = len(nodes) / interval
        phase.offered = rate
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        for step in range(int(seconds * rate)):
            scheduled = start + step / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            node = nodes[step % len(nodes)]
            if node.in_flight:
                phase.skipped += 1  # the agent waits for its previous beat: this one is never sent
                continue
            task = asyncio.create_task(
                self.send(
                    node,
                    phase,
                    scheduled=scheduled,
                    lanes=lanes,
                    lane=step,
                    repeat=step >= len(nodes) and not phase.first_beats,
                )
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        if not isinstance(lanes, asyncio.Semaphore):
            while not lanes.empty():
                connection = lanes.get_nowait()
                if connection is not None:
                    connection.close()

    def lanes(self, concurrency: int) -> Lanes:
        """``concurrency`` lanes for beats: ``httpx`` pools behind a semaphore, or a pool of raw connections."""
        if self.client == "httpx":
            return asyncio.Semaphore(concurrency)
        pool: asyncio.Queue[RawConnection | None] = asyncio.Queue()
        for _ in range(concurrency):
            pool.put_nowait(None)  # opened on first use
        return pool

    async def closed_loop(self, phase: Phase, nodes: list[SimulatedNode], *, seconds: float, concurrency: int) -> None:
        """Every connection sends the next node's beat as soon as its previous one is answered.

        The requests are built once, before the clock starts, and sent over minimal keep-alive connections
        (:class:`RawConnection`): a general-purpose client spends more CPU per request than the server does, so
        on shared cores it would saturate itself long before the server.
        """
        port = self.port
        requests = [beat_request(port, self.authorization, node) for node in nodes]
        deadline = time.perf_counter() + seconds
        turn = 0

        async def worker() -> None:
            nonlocal turn
            connection: RawConnection | None = None
            while time.perf_counter() < deadline:
                turn += 1
                request = requests[turn % len(requests)]
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(AGENT_TIMEOUT_SEC):
                        connection = connection or await RawConnection.open(port)
                        status, retry_after = await connection.send(request)
                except TimeoutError:
                    phase.answers["timeout"] += 1
                    if connection is not None:
                        connection.close()  # its answer may still come: never read it as the next one's
                    connection = None
                    continue
                except (OSError, asyncio.IncompleteReadError) as exc:
                    phase.answers[type(exc).__name__] += 1
                    connection = None
                    continue
                phase.latencies.append(time.perf_counter() - started)
                phase.answers[str(status)] += 1
                if status in (429, 503):
                    phase.retry_after[retry_after or "none"] += 1
            if connection is not None:
                connection.close()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def run(
    args: argparse.Namespace,
    url: str,
    agent_token: str,
    admin_token: str,
    pid: int,
    *,
    postgres: PostgresServer | None,
    database_url: str,
) -> list[Phase]:
    concurrency = max(args.concurrency, args.overload_concurrency)
    fleet = Fleet(
        url=url,
        agent_token=agent_token,
        admin_token=admin_token,
        pid=pid,
        concurrency=concurrency,
        client=args.client,
        live_bodies=args.live_bodies,
        speed=args.simulated_speed,
        scrape_every=args.scrape_every,
        postgres=postgres,
        database_url=database_url,
    )
    try:
        nodes = fleet.nodes(args.nodes, "load")
        await fleet.register(nodes)
        few = nodes[: args.baseline_nodes]

        async def baseline(phase: Phase) -> None:
            await fleet.cadence(
                phase, few, seconds=args.baseline_seconds, interval=args.interval, concurrency=args.concurrency
            )

        async def first_beats(phase: Phase) -> None:
            # one beat per node, spread evenly: the interval is the phase's length
            await fleet.cadence(
                phase,
                nodes,
                seconds=args.warmup_seconds,
                interval=args.warmup_seconds,
                concurrency=args.concurrency,
            )

        async def everyone(phase: Phase) -> None:
            # py-spy, on PATH, samples the server only while it holds the interpreter: where its CPU goes
            profiler = start_profiler(args.profile, pid, args.seconds, gil=True) if args.profile else None
            await fleet.cadence(
                phase, nodes, seconds=args.seconds, interval=args.interval, concurrency=args.concurrency
            )
            if profiler is not None:
                profiler.wait(60)

        async def overload(phase: Phase) -> None:
            await fleet.closed_loop(phase, nodes, seconds=args.overload_seconds, concurrency=args.overload_concurrency)

        every = args.report_every
        phases = [await fleet.measure(Phase(f"baseline {len(few)} nodes", len(few)), baseline, report_every=every)]
        if args.warmup_seconds > 0:
            warm = Phase(f"first beats {len(nodes)} nodes", len(nodes), first_beats=True)
            phases.append(await fleet.measure(warm, first_beats, report_every=every))
        phases.append(await fleet.measure(Phase(f"fleet {len(nodes)} nodes", len(nodes)), everyone, report_every=every))
        if args.overload_seconds > 0:
            name = f"overload {args.overload_concurrency} conns"
            phases.append(await fleet.measure(Phase(name, len(nodes)), overload))
        known = await fleet.node_count()
        print(f"nodes known to the server after the run: {known} of {len(nodes)} registered")
        return phases
    finally:
        await fleet.aclose()


def report(phases: list[Phase], args: argparse.Namespace, backend: str) -> None:
    print(
        f"heartbeats at the agent's cadence ({args.interval:g} s), 8 simulated cards per node, {backend}, "
        f"{args.workers} server worker process(es), "
        f"{args.client} client on uvloop, concurrency {args.concurrency} (overload {args.overload_concurrency}), "
        f"bodies {'built in full every beat' if args.live_bodies else 'built in full once a minute per node'}, "
        f"simulated speed {args.simulated_speed:g}, /metrics scraped every {args.scrape_every:g} s, "
        f"per-address bound {args.max_in_flight_per_peer}, agent timeout {AGENT_TIMEOUT_SEC:g} s, "
        f"{os.cpu_count()} CPUs shared by the load generator and the server; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    head = (
        f"{'phase':<26} {'offered/s':>9} {'ok/s':>7} {'x base':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
        f"{'p99 repeat':>10} {'skipped':>7} {'rss MiB start/end/peak':>22} {'srv cpu ms/beat':>15} {'rows/beat':>9} "
        f"{'probe worst ms':>14} {'scrapes':>7} {'scrape worst ms':>15} {'peak in flight':>14} {'peak lag ms':>11} "
        f"{'client cpu %':>12} "
        f"{'full gc':>7} {'gc pause ms':>11}  answers"
    )
    print(head)
    base = phases[0]
    for p in phases:
        answers = " ".join(f"{status}:{n}" for status, n in sorted(p.answers.items()))
        retry = f" retry-after {dict(p.retry_after)}" if p.retry_after else ""
        retry += f" scrape failures {dict(p.scrape_failures)}" if p.scrape_failures else ""
        rss = f"{p.rss_start_kib / 1024:.0f}/{p.rss_end_kib / 1024:.0f}/{p.rss_peak_kib / 1024:.0f}"
        offered = f"{p.offered:.0f}" if p.offered else "closed"
        print(
            f"{p.name:<26} {offered:>9} {p.rate:>7.0f} {p.rate / base.rate:>6.2f} {p.percentile(0.5):>8.1f} "
            f"{p.percentile(0.95):>8.1f} {p.percentile(0.99):>8.1f} {p.percentile(0.99, repeats_only=True):>10.1f} "
            f"{p.skipped:>7} {rss:>22} "
            f"{p.server_cpu_sec / max(1, p.beats) * 1000:>15.2f} {p.rows_written / max(1, p.ok):>9.3f} "
            f"{p.probe_worst_sec * 1000:>14.0f} {len(p.scrapes):>7} {max(p.scrapes, default=0) * 1000:>15.0f} "
            f"{p.peak_in_flight:>14} {p.peak_lag_sec * 1000:>11.0f} "
            f"{p.client_cpu_sec / p.seconds * 100:>12.0f} {p.full_collections:>7} {p.gc_pause_sec * 1000:>11.0f}  "
            f"{answers}{retry} refused {p.refused}"
        )
    for p in phases:
        if p.slow_beats:
            print(slow_beats_line(p))
        if len(p.windows) >= DRIFT_WINDOWS:
            print(drift_line(p))
    for p in phases[1:]:
        cpu_ratio = (p.server_cpu_sec / max(1, p.beats)) / (base.server_cpu_sec / max(1, base.beats))
        print(
            f"{p.name} vs {base.name}: ok/s x{p.rate / base.rate:.2f}, "
            f"p99 x{p.percentile(0.99) / base.percentile(0.99):.2f}, server CPU/beat x{cpu_ratio:.2f}, "
            f"RSS end x{p.rss_end_kib / base.rss_end_kib:.2f}"
        )


DRIFT_WINDOWS = 6
"""Report windows a phase needs before its first and last thirds are compared (:func:`drift_line`)."""


def drift_line(phase: Phase) -> str:
    """Whether the server's CPU per beat and p99 grew over the phase, and whether the machine slowed with them.

    The first window is left out (the phase's start). Against the server's growth stands the load generator's CPU
    per beat: the same work for every beat (requests built once a minute, one response read), so its growth is
    the machine's (other tenants of the host, caches, clocks), and the ratio of the two is the server's own.
    """
    windows = phase.windows[1:]
    third = len(windows) // 3
    first, last = windows[:third], windows[-third:]

    def mean(rows: list[tuple[float, float, float]], column: int) -> float:
        return sum(row[column] for row in rows) / len(rows)

    def median_p99(rows: list[tuple[float, float, float]]) -> float:
        return sorted(row[2] for row in rows)[len(rows) // 2]

    server, client = (mean(last, c) / max(mean(first, c), 1e-9) for c in (0, 1))
    own = server / max(client, 1e-9)
    return (
        f"{phase.name}, last third of the windows against the first ({third} each): server CPU/beat x{server:.2f}, "
        f"the load generator's (the same work per beat) x{client:.2f}, the server's own x{own:.2f}; "
        f"median window p99 {median_p99(first):.1f} -> {median_p99(last):.1f} ms"
    )


def slow_beats_line(phase: Phase) -> str:
    """How many beats took longer than :data:`SLOW_BEAT_SEC`, and how many of them overlapped a scrape of
    ``/metrics``, against the share of the phase the scrapes took: where the tail comes from."""
    during = sum(
        1 for sent, done in phase.slow_beats if any(sent < end and start < done for start, end in phase.scrape_spans)
    )
    scraping = sum(end - start for start, end in phase.scrape_spans) / max(phase.seconds, 1e-9)
    # and by when in the wall-clock minute they were sent: the server's minute work (the closed minute's rows, the
    # new minute's buckets) starts at the minute
    wall = time.time() - time.perf_counter()
    tens = Counter(int((sent + wall) % 60 // 10) for sent, _ in phase.slow_beats)
    by_ten = " ".join(f"{ten * 10:02d}s:{tens[ten]}" for ten in range(6))
    return (
        f"{phase.name}: {len(phase.slow_beats)} beats over {SLOW_BEAT_SEC * 1000:.0f} ms, {during} of them during a "
        f"scrape of /metrics (scrapes took {scraping * 100:.1f} % of the phase); by second of the minute {by_ten}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--baseline-nodes", type=int, default=300)
    parser.add_argument("--baseline-seconds", type=float, default=20.0)
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=30.0,
        help="every node's first beat, spread over this long, before the fleet phase (0: none)",
    )
    parser.add_argument(
        "--report-every", type=float, default=60.0, help="a line per window of this many seconds (0: none)"
    )
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat period per node (agent default 5 s)")
    parser.add_argument("--concurrency", type=int, default=64, help="beats in flight at most (cadence phases)")
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="client of the cadence phases: minimal keep-alive connections (default), or httpx as the agent uses",
    )
    parser.add_argument(
        "--live-bodies",
        action="store_true",
        help="build every beat's body in full as the agent does (default: in full once a minute per node, when "
        "the agent re-reads its health counters; between, the same telemetry values with the send time)",
    )
    parser.add_argument(
        "--simulated-speed",
        type=float,
        default=SIMULATED_SPEED,
        help="simulated hours of the cards' error counters per real hour (default 60: 7 of every node's 8 cards "
        "follow a fault profile and most of them change every minute, a write-heavy fleet; 0: steady counters)",
    )
    parser.add_argument("--overload-concurrency", type=int, default=1024)
    parser.add_argument("--overload-seconds", type=float, default=15.0, help="0 skips the overload phase")
    parser.add_argument("--max-in-flight", type=int, default=None, help="the server's in-flight heartbeat bound")
    parser.add_argument(
        "--max-in-flight-per-peer",
        type=int,
        default=None,
        help="the server's per-address bound (default: above the run's connection count, all from one address)",
    )
    parser.add_argument("--shed-lag", type=float, default=None, help="the server's event-loop lag bound, seconds")
    parser.add_argument(
        "--scrape-every",
        type=float,
        default=15.0,
        help="read the server's /metrics this often while a phase runs, as Prometheus would (0: never)",
    )
    parser.add_argument(
        "--gc-young-threshold", type=int, default=None, help="the server's collector setting (0: CPython's defaults)"
    )
    parser.add_argument(
        "--switch-interval-ms", type=float, default=None, help="the server's thread switch interval (default 0.5)"
    )
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--postgres", action="store_true", help="start a private PostgreSQL server and use it")
    parser.add_argument("--workers", type=int, default=1, help="server worker processes (>1 needs PostgreSQL)")
    parser.add_argument("--profile", default=None, help="py-spy the server over the fleet phase into FILE")
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="hf-load-")
    postgres = PostgresServer() if args.postgres else None
    if postgres is not None:
        postgres.start()
    database_url = postgres.create_database() if postgres else args.database_url or f"sqlite:///{workdir}/load.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")}
    agent_token = heteroflow("admin", "create-token", "--scopes", "agent", "--database-url", database_url, env=env)
    admin_token = heteroflow(
        "admin", "create-token", "--scopes", "admin,metrics:read", "--database-url", database_url, env=env
    )
    port = free_port()
    server_env = {
        **env,
        "HETEROFLOW_LOG_LEVEL": "warning",
        # sized to the fleet as docs/operations.md says: nodes x 8 cards
        "HETEROFLOW_GPU_HEALTH_DEDUP_CACHE_ENTRIES": str(args.nodes * 8),
        # one agent token registers the whole fleet here: its node and card quotas (5,000 / 40,000 by default)
        # must not be what refuses a larger one
        "HETEROFLOW_MAX_NODES_PER_TOKEN": str(max(5_000, args.nodes)),
        "HETEROFLOW_MAX_CARDS_PER_TOKEN": str(max(40_000, args.nodes * 8)),
    }
    if args.max_in_flight is not None:
        server_env["HETEROFLOW_SERVER_MAX_IN_FLIGHT_HEARTBEATS"] = str(args.max_in_flight)
    # the bench is one address for the whole fleet: the per-address bound must not be what refuses its beats
    args.max_in_flight_per_peer = args.max_in_flight_per_peer or max(args.concurrency, args.overload_concurrency) + 64
    server_env["HETEROFLOW_SERVER_MAX_IN_FLIGHT_PER_PEER"] = str(args.max_in_flight_per_peer)
    if args.shed_lag is not None:
        server_env["HETEROFLOW_SERVER_HEARTBEAT_SHED_LAG_SECONDS"] = str(args.shed_lag)
    if args.gc_young_threshold is not None:
        server_env["HETEROFLOW_SERVER_GC_YOUNG_THRESHOLD"] = str(args.gc_young_threshold)
    if args.switch_interval_ms is not None:
        server_env["HETEROFLOW_SERVER_SWITCH_INTERVAL_MS"] = str(args.switch_interval_ms)
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "heteroflow", "server", "--port", str(port), "--database-url", database_url),
            *("--workers", str(args.workers)),
        ],
        env=server_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if (
                    httpx.get(
                        f"{url}/healthz", headers={"Authorization": f"Bearer {agent_token}"}, verify=client_tls()
                    ).status_code
                    == 200
                ):
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
        # the event loop the server's uvicorn picks ("auto": uvloop, installed with uvicorn[standard])
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            phases = runner.run(
                run(args, url, agent_token, admin_token, server.pid, postgres=postgres, database_url=database_url)
            )
        alive = server.poll() is None
    finally:
        stopping = time.perf_counter()
        server.terminate()
        try:
            server.wait(STOP_WAIT_SEC)
            stopped = f"stopped {time.perf_counter() - stopping:.1f} s after SIGTERM (its final flush)"
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            stopped = f"still running {STOP_WAIT_SEC:g} s after SIGTERM: killed"
        if postgres is not None:
            postgres.close()
    print(f"server process alive at the end: {alive}; {stopped}")
    report(phases, args, database_url.split(":", 1)[0])


if __name__ == "__main__":
    main()
