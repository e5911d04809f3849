"""What a round of heartbeats leaves in the server's memory: RSS and the Python heap, between rounds.

The platform server's ASGI app, in this process, is driven like ``tests/load/test_heartbeat_load.py`` drives the
real server (``--nodes`` nodes of 8 cards, the agent's own ``SimulatedCollector`` bodies, a fresh reading per
beat, the dedup cache sized to the fleet): registration, then ``--rounds`` rounds in which every node beats once.
After each phase the background writers are given time to drain, then RSS, the traced Python heap and the sizes
of the side paths' in-memory state are printed, and with ``--top N`` the N source lines whose retained memory
grew most over the last round (a ``tracemalloc`` snapshot diff). Usage::

    .venv/bin/python bench/heartbeat_memory.py [--nodes 3000] [--rounds 3] [--top 15]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.heartbeat_cpu
from bench.heartbeat_cpu import beat
from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.agent.runner import registration_for
from heteroflow.agent.simulated import SimulatedCollector
from heteroflow.contracts import counters
from heteroflow.core.clock import SystemClock
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform.nodes import NODE_CREDENTIAL_HEADER
from heteroflow.platform_server.assembly import build_context, create_app
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.token_store import SqlTokenStore

CARDS = 8


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def held(ctx: ServerContext) -> dict[str, Any]:
    """Sizes of the in-memory state a beat adds to."""
    return {
        "minute_buckets": len(ctx.metrics_recorder._aggregator),
        "interned_counters": len(counters._INTERNED),
        "metric_rows_pending": ctx.metrics_recorder.status().pending_rows,
        "health_pending": ctx.ingestor.status().pending_readings,
        "dedup_entries": ctx.ingestor.status().cache_entries,
    }


async def main(args: argparse.Namespace) -> None:
    folder = tempfile.mkdtemp(prefix="hf-bench-")
    ctx = build_context(
        # one agent token registers the whole fleet: its quotas raised to the fleet (their defaults stop at 5,000
        # nodes and 40,000 cards), as bench/load_heartbeats.py does
        settings=ServerSettings.load(
            database_url=f"sqlite:///{folder}/bench.db",
            log_level="warning",
            max_nodes_per_token=max(5_000, args.nodes),
            max_cards_per_token=max(40_000, args.nodes * CARDS),
        ),
        health_settings=HealthStorageSettings.load(dedup_cache_entries=args.nodes * CARDS),
    )
    app = create_app(ctx, run_worker=False)
    clock = SystemClock()
    collectors = [SimulatedCollector(clock=clock, count=CARDS, seed=f"mem-{i:05d}") for i in range(args.nodes)]
    if args.top:
        tracemalloc.start(args.frames)
    snapshots: list[tracemalloc.Snapshot] = []

    async def settle(what: str) -> None:
        await asyncio.sleep(args.settle)  # the writers drain their queues in the background
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] / 2**20 if args.top else float("nan")
        print(f"{what:<14} RSS {rss_mib():7.1f} MiB  traced {traced:7.1f} MiB  {held(ctx)}", flush=True)
        if args.top:
            snapshots.append(tracemalloc.take_snapshot())

    async with app.router.lifespan_context(app):
        _, token = SqlTokenStore(ctx.engine).create_token(
            name="bench", scopes=parse_scopes("agent"), tenant_id=None, now=datetime.now(UTC)
        )
        bearer = (b"authorization", f"Bearer {token}".encode())
        nodes: list[tuple[str, str]] = []
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            for i, collector in enumerate(collectors):
                reg = registration_for(
                    hostname=f"mem-{i:05d}",
                    source="simulated",
                    health=collector.read_health(),
                    telemetry=collector.read_telemetry(),
                )
                registration = {"hostname": reg.hostname, "vendor": reg.vendor, "model": reg.model,
                                "gpu_count": reg.gpu_count, "source": reg.source}  # fmt: skip
                answer = await client.post(
                    "/api/v1/nodes/register", json=registration, headers={"Authorization": f"Bearer {token}"}
                )
                registered = answer.raise_for_status().json()
                nodes.append((registered["node_id"], registered["node_credential"]))
        await settle("registered")
        for round_ in range(args.rounds):
            for (node_id, credential), collector in zip(nodes, collectors, strict=True):
                body = heartbeat_body(
                    health=collector.read_health(), telemetry=collector.read_telemetry(), xid_events=()
                )
                headers = [bearer, (NODE_CREDENTIAL_HEADER.lower().encode(), credential.encode())]
                path = f"/api/v1/nodes/{node_id}/heartbeat"
                status = await beat(app, path=path, headers=headers, body=json.dumps(body).encode())
                if status != 200:
                    raise RuntimeError(f"a beat was answered {status}")
                await asyncio.sleep(0)  # a served beat yields to the loop: the background tasks run between
            await settle(f"round {round_ + 1}")
            if args.top and len(snapshots) >= 2:
                print(f"  grew most over round {round_ + 1}:")
                for stat in snapshots[-1].compare_to(snapshots[-2], "lineno")[: args.top]:
                    print(f"    {stat}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds the writers get after each phase")
    parser.add_argument("--top", type=int, default=0, help="trace the heap; print this many lines that grew")
    parser.add_argument("--frames", type=int, default=1, help="traceback frames kept per allocation")
    asyncio.run(main(parser.parse_args()))
