"""Heartbeat ingestion throughput: dedup on (steady counters) versus writing every beat.

Starts a real ``heteroflow server`` process, registers nodes, then drives the real HTTP heartbeat route
(8 GPU stats per beat) from this process in three phases:

1. baseline  - every beat changes a counter on every card, so every beat writes 8 rows;
2. dedup     - the same load with steady counters: the dedup cache skips the database;
3. target    - an open loop at a fixed rate (default 600/s = 3,000 nodes at 5 s) with steady counters.

Closed-loop phases run ``--concurrency`` workers for ``--seconds`` each. SQL statements per beat come from
the server's own ``heteroflow_db_statements_total`` counter. Ratios are against the baseline measured in
the same run. Usage::

    .venv/bin/python bench/ingest.py [--nodes 3000] [--seconds 15] [--concurrency 32] [--rate 600]
                                     [--database-url postgresql://…]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx

from heteroflow.storage.testing import free_port


@dataclass
class PhaseResult:
    name: str
    beats: int
    errors: int
    seconds: float
    latencies: list[float]
    statements: float

    @property
    def rate(self) -> float:
        return self.beats / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def heteroflow(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "heteroflow", *args], capture_output=True, text=True, check=True, env=env
    )
    return result.stdout.strip().splitlines()[-1]


def stats(step: int, *, changing: bool) -> list[dict[str, Any]]:
    corrected = step if changing else 10
    return [
        {
            "index": index,
            "uuid": f"GPU-{index:02d}",
            "temperature_c": 40,
            "utilization_pct": 50,
            "memory_used_mib": 1000,
            "memory_total_mib": 81920,
            "ecc_uncorrected_total": 0,
            "ecc_corrected_total": corrected,
            "retired_pages": 0,
            "remapped_rows_pending": 0,
            "remapped_rows_failure": 0,
        }
        for index in range(8)
    ]


async def statement_count(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("heteroflow_db_statements_total "):
            return float(line.split()[1])
    raise RuntimeError("heteroflow_db_statements_total missing from /metrics")


async def closed_loop(
    client: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    nodes: list[str],
    *,
    name: str,
    seconds: float,
    concurrency: int,
    changing: bool,
) -> PhaseResult:
    before = await statement_count(admin)
    latencies: list[float] = []
    errors = 0
    counter = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors, counter
        while time.perf_counter() < deadline:
            counter += 1
            step = counter
            node = nodes[step % len(nodes)]
            started = time.perf_counter()
            response = await client.post(
                f"/api/v1/nodes/{node}/heartbeat", json={"gpu_stats": stats(step, changing=changing)}
            )
            latencies.append(time.perf_counter() - started)
            if response.status_code != 200:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await asyncio.sleep(1.0)  # let the server's writer finish this phase's backlog before counting
    after = await statement_count(admin)
    return PhaseResult(name, len(latencies), errors, elapsed, latencies, (after - before) / max(1, len(latencies)))


async def open_loop(
    client: httpx.AsyncClient, admin: httpx.AsyncClient, nodes: list[str], *, seconds: float, rate: float
) -> PhaseResult:
    before = await statement_count(admin)
    latencies: list[float] = []
    errors = 0

    async def one(step: int) -> None:
        nonlocal errors
        started = time.perf_counter()
        response = await client.post(
            f"/api/v1/nodes/{nodes[step % len(nodes)]}/heartbeat", json={"gpu_stats": stats(step, changing=False)}
        )
        latencies.append(time.perf_counter() - started)
        if response.status_code != 200:
            errors += 1

    tasks: list[asyncio.Task[None]] = []
    total = int(seconds * rate)
    start = time.perf_counter()
    for step in range(total):
        delay = start + step / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(step)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    after = await statement_count(admin)
    return PhaseResult(
        f"target {rate:.0f}/s", len(latencies), errors, elapsed, latencies, (after - before) / max(1, total)
    )


async def run(args: argparse.Namespace, url: str, agent_token: str, admin_token: str) -> list[PhaseResult]:
    limits = httpx.Limits(max_connections=args.concurrency * 2, max_keepalive_connections=args.concurrency * 2)
    async with (
        httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {agent_token}"}, limits=limits, timeout=30
        ) as client,
        httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30) as admin,
    ):
        nodes: list[str] = []
        for start in range(0, args.nodes, 100):
            batch = await asyncio.gather(
                *(
                    client.post(
                        "/api/v1/nodes/register",
                        json={"hostname": f"bench-{i:05d}", "vendor": "nvidia", "model": "H100", "gpu_count": 8},
                    )
                    for i in range(start, min(args.nodes, start + 100))
                )
            )
            nodes.extend(r.json()["node_id"] for r in batch)
        # every card gets its first row, and the server's caches warm, before anything is measured
        for start in range(0, len(nodes), 100):
            await asyncio.gather(
                *(
                    client.post(f"/api/v1/nodes/{node}/heartbeat", json={"gpu_stats": stats(0, changing=False)})
                    for node in nodes[start : start + 100]
                )
            )
        await asyncio.sleep(2.0)
        baseline = await closed_loop(
            client,
            admin,
            nodes,
            name="baseline: every beat writes",
            seconds=args.seconds,
            concurrency=args.concurrency,
            changing=True,
        )
        await asyncio.sleep(2.0)
        # re-prime: the last baseline values become the stored rows, then counters stay put
        for start in range(0, len(nodes), 100):
            await asyncio.gather(
                *(
                    client.post(f"/api/v1/nodes/{node}/heartbeat", json={"gpu_stats": stats(0, changing=False)})
                    for node in nodes[start : start + 100]
                )
            )
        await asyncio.sleep(2.0)
        dedup = await closed_loop(
            client,
            admin,
            nodes,
            name="dedup: steady counters",
            seconds=args.seconds,
            concurrency=args.concurrency,
            changing=False,
        )
        target = await open_loop(client, admin, nodes, seconds=args.seconds, rate=args.rate)
        return [baseline, dedup, target]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--cache-entries", type=int, default=0, help="dedup cache size (default nodes x 8)")
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="hf-bench-")
    database_url = args.database_url or f"sqlite:///{workdir}/bench.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")}
    agent_token = heteroflow("admin", "create-token", "--scopes", "agent", "--database-url", database_url, env=env)
    admin_token = heteroflow("admin", "create-token", "--scopes", "admin", "--database-url", database_url, env=env)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "heteroflow", "server", "--port", str(port), "--database-url", database_url],
        env={
            **env,
            "HETEROFLOW_LOG_LEVEL": "warning",
            # sized to the fleet, as docs/operations.md says: nodes x 8 cards
            "HETEROFLOW_GPU_HEALTH_DEDUP_CACHE_ENTRIES": str(args.cache_entries or args.nodes * 8),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {agent_token}"}).status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
        results = asyncio.run(run(args, url, agent_token, admin_token))
    finally:
        server.terminate()
        server.wait(15)

    backend = database_url.split(":", 1)[0]
    print(
        f"heartbeat ingestion, 8 GPUs per beat, {args.nodes} nodes, {backend}, {os.cpu_count()} CPUs "
        f"(load generator and server share them)"
    )
    print(f"{'phase':<30} {'beats/s':>9} {'x base':>7} {'p50 ms':>8} {'p99 ms':>8} {'stmts/beat':>11} {'errors':>7}")
    base = results[0].rate
    for r in results:
        print(
            f"{r.name:<30} {r.rate:>9.0f} {r.rate / base:>7.2f} {r.percentile(0.50):>8.1f} "
            f"{r.percentile(0.99):>8.1f} {r.statements:>11.3f} {r.errors:>7}"
        )
    print(f"median latency, all phases: {statistics.median([x for r in results for x in r.latencies]) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
