"""How long a scrape of ``/metrics`` holds the server's event loop, with a fleet's cards in memory.

The platform server's ASGI app in this process (SQLite), its GPU metrics recorder holding ``--nodes`` nodes of 8
cards (each card's telemetry and health counters), scraped ``--scrapes`` times through the app while a task on
the same event loop ticks every millisecond. The longest gaps between ticks are the longest stretches in which
the loop answered nothing (a heartbeat arriving then waits as long); their mean is what a scrape adds to each
turn of the loop: a heartbeat gives the loop up at every socket read and write and waits that long again each
time, and a worker thread that holds the interpreter lock makes the loop wait for the lock after each tick, up
to the switch interval (the server's ``switch_interval_ms``, or ``--switch-interval``; Python's default is 5 ms).
Printed against two baselines measured in the same run: the gaps over the same time with no scrape, and what
joining the scrape's parts into one text on the loop takes (what the route did before it sent the parts one
after another). Usage::

    .venv/bin/python bench/scrape_stall.py [--nodes 3000] [--scrapes 5] [--switch-interval SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
from heteroflow.cli.server import tune_interpreter
from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.gpu_metrics import GpuMetrics, MetricReading
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform.nodes import NodeRecord
from heteroflow.platform_server.assembly import build_context, create_app
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.token_store import SqlTokenStore

CARDS = 8


def fill(ctx: ServerContext, nodes: int) -> None:
    """Every card's newest telemetry and counters, as the nodes' beats leave them in the recorder."""
    now = ctx.clock.now()
    for n in range(nodes):
        node = NodeRecord(
            id=NodeId(f"node-{n:05d}"), name=f"load-{n:05d}", vendor="nvidia", model="H100", gpu_count=CARDS,
            source="simulated", tenant_id=None, registered_at=now, last_heartbeat_at=None,
        )  # fmt: skip
        keys = [(CardKey(node.id, g, "simulated"), f"GPU-{n:08x}-{g:04x}-5e59-b77b-94d81dd87904") for g in range(CARDS)]
        metrics = [
            MetricReading(key, uuid, now, GpuMetrics(35.0 + g, float(n % 101), 1000.0 + n, 81559.0, 300.5))
            for g, (key, uuid) in enumerate(keys)
        ]
        health = [
            HealthReading(key, uuid, now, Counters(0, n % 13, 0, g % 2, 0), None, ())
            for g, (key, uuid) in enumerate(keys)
        ]
        ctx.metrics_recorder.offer(node, metrics=metrics, health=health)


async def get_metrics(app: Any, token: str) -> tuple[int, int]:
    """One ``GET /metrics`` through ``app``: its status and body size. The body's parts are counted and dropped,
    as a remote client's bytes would leave the process (an in-process client that joined them would hold the
    loop itself)."""
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": "/metrics", "raw_path": b"/metrics", "root_path": "", "query_string": b"",
        "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 40000),
        "headers": [(b"host", b"bench"), (b"authorization", f"Bearer {token}".encode())], "state": {},
    }  # fmt: skip
    status = size = 0
    requested, answered = False, asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await answered.wait()  # as a server's receive: nothing more until the client goes
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, size
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    await app(scope, receive, send)
    return status, size


async def longest_gaps(seconds: float | None, scrape: asyncio.Future[Any] | None = None) -> list[float]:
    """The gaps between 1 ms ticks, longest first, for ``seconds`` or until ``scrape`` is done."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    last = started = loop.time()
    while (scrape is not None and not scrape.done()) or (seconds is not None and last - started < seconds):
        await asyncio.sleep(0.001)
        now = loop.time()
        gaps.append(now - last)
        last = now
    return sorted(gaps, reverse=True)


async def main(args: argparse.Namespace) -> None:
    folder = tempfile.mkdtemp(prefix="hf-bench-")
    ctx = build_context(
        settings=ServerSettings.load(database_url=f"sqlite:///{folder}/bench.db", log_level="warning"),
        health_settings=HealthStorageSettings.load(),
    )
    app = create_app(ctx, run_worker=False)
    async with app.router.lifespan_context(app):
        _, token = SqlTokenStore(ctx.engine).create_token(
            name="bench", scopes=parse_scopes("metrics:read"), tenant_id=None, now=datetime.now(UTC)
        )
        fill(ctx, args.nodes)
        tune_interpreter(ctx.settings)  # as the server process does
        if args.switch_interval is not None:
            sys.setswitchinterval(args.switch_interval)
        for round_ in range(args.scrapes):
            started = time.perf_counter()
            get = asyncio.ensure_future(get_metrics(app, token))
            gaps = await longest_gaps(None, get)
            status, size = await get
            if status != 200:
                raise RuntimeError(f"/metrics answered {status}")
            took = time.perf_counter() - started
            quiet = await longest_gaps(took)  # baseline: the same time, no scrape
            parts = await ctx.metrics.scrape_parts()
            joined_at = time.perf_counter()
            _ = b"".join(parts)
            joined = time.perf_counter() - joined_at
            mean, quiet_mean = (sum(found) / len(found) * 1000 for found in (gaps, quiet))
            print(
                f"scrape {round_ + 1}: {size / 1e6:.1f} MB in {took * 1000:.0f} ms; longest loop gaps "
                f"{', '.join(f'{gap * 1000:.0f}' for gap in gaps[:3])} ms, mean {mean:.2f} ms; no scrape: "
                f"{quiet[0] * 1000:.0f} ms, mean {quiet_mean:.2f} ms (longest x{gaps[0] / quiet[0]:.1f}, mean "
                f"x{mean / quiet_mean:.1f}); joining the parts on the loop: {joined * 1000:.0f} ms",
                flush=True,
            )
    print(
        f"{args.nodes} nodes x {CARDS} cards; switch interval {sys.getswitchinterval() * 1000:g} ms; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="the interpreter's thread switch interval, seconds (default: the server's setting)",
    )
    uvloop.run(main(parser.parse_args()))
