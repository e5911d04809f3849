"""CPU per heartbeat in one process, without sockets: the platform server's ASGI app against the floor app.

Both apps are called directly with the same ASGI messages (the agent's own bodies from ``bench/ingest.py``: 8
cards, ~3.4 KB, fresh sample times, steady counters), so the kernel, the HTTP parser and the load generator
cost nothing and what is left is the route itself: middleware, authentication, validation, the side paths'
in-memory work. The two are measured in alternating rounds (a busy neighbour slows both alike); the minimum
and median of the rounds are printed, with the ratio to the floor (``bench/floor_app.py``: token check, JSON
decode, the ``Heartbeat`` schema). ``bench/ingest.py`` measures the same over HTTP. Usage::

    .venv/bin/python bench/heartbeat_cpu.py [--beats 500] [--rounds 7] [--nodes 50]
                                            [--profile 40 [--profile-sort tottime]] [--stages]

``--stages`` wraps the route's stages (the credential check, the body read and screen, decode and validation, the
per-card parse, the side paths, the answer) with wall-clock timers and prints each one's time per beat over one
more round of the server.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import inspect
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.ingest, bench.floor_app
from bench.ingest import AgentNode, agent_nodes
from heteroflow.core import request_body
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform.nodes import NODE_CREDENTIAL_HEADER
from heteroflow.platform_server import assembly
from heteroflow.platform_server.assembly import build_context, create_app
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.routes import nodes as node_routes
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.token_store import SqlTokenStore

Message = MutableMapping[str, Any]
App = Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


async def beat(app: App, *, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
    """One heartbeat through ``app``; its status."""
    scope: Message = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 40000),
        "headers": [*headers, (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "state": {},
    }
    delivered = False
    answered: list[Message] = []

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        answered.append(message)

    await app(scope, receive, send)
    status: int = answered[0]["status"]
    return status


async def rounds(
    *,
    server: App,
    floor: App,
    ctx: ServerContext,
    token: str,
    nodes: list[tuple[str, str]],
    agents: list[AgentNode],
    args: Any,
) -> tuple[list[float], list[float]]:
    """CPU ms per beat of each round, server (over ``ctx``) and floor alternating."""
    bearer = (b"authorization", f"Bearer {token}".encode())

    beats: int = args.beats

    async def drive(app: App) -> float:
        started = time.process_time()
        for n in range(beats):
            node_id, credential = nodes[n % len(nodes)]
            headers = [bearer, (NODE_CREDENTIAL_HEADER.lower().encode(), credential.encode())]
            path = f"/api/v1/nodes/{node_id}/heartbeat"
            status = await beat(app, path=path, headers=headers, body=agents[n % len(agents)].body(None))
            if status != 200:
                raise RuntimeError(f"a beat was answered {status}")
        return (time.process_time() - started) / beats * 1000

    await drive(server)  # warm: caches filled, first rows written
    await drive(floor)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        await drive(server)
        profiler.disable()
        pstats.Stats(profiler).sort_stats(args.profile_sort).print_stats(args.profile)
    measured: tuple[list[float], list[float]] = ([], [])
    for _ in range(args.rounds):
        measured[0].append(await drive(server))
        measured[1].append(await drive(floor))
    if args.stages:  # last: the timers stay
        spent = timed_stages(ctx)
        started = time.perf_counter()
        await drive(server)
        total = time.perf_counter() - started
        print(f"stages of the server's beat, wall time per beat of one round ({beats} beats):")
        print(f"  {'everything':<34} {total / beats * 1e6:7.1f} us")
        for name, seconds in spent.items():
            print(f"  {name:<34} {seconds / beats * 1e6:7.1f} us  {seconds / total * 100:5.1f} %")
    return measured


def timed_stages(ctx: ServerContext) -> dict[str, float]:
    """Wrap the heartbeat route's stages with wall-clock timers (for the rest of the process); their totals."""
    spent: dict[str, float] = {}

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        spent[name] = 0.0  # printed in this order
        if inspect.iscoroutinefunction(function):

            async def waited(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await function(*args, **kwargs)
                finally:
                    spent[name] += time.perf_counter() - started

            return waited

        def called(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - started

        return called

    for module, attribute, name in (
        (assembly, "check_before_work", "credential check"),
        (request_body.BodyLimit, "_read_within_deadline", "body read (with its deadline)"),
        (request_body, "check_body", "body screen (size, depth, text)"),
        (node_routes, "decoded_heartbeat", "decode + validate"),
        (node_routes, "record_beat", "record_beat (the rows below)"),
        (node_routes, "beat_readings", "  per-card parse (beat_readings)"),
        (node_routes, "accepted_json", "  the answer's JSON"),
    ):
        setattr(module, attribute, timed(name, getattr(module, attribute)))
    for owner, attribute, name in (
        (ctx.ingestor, "offer", "  health dedup (ingestor)"),
        (ctx.metrics_recorder, "offer", "  metrics recorder"),
        (ctx.liveness, "beat", "  liveness"),
        (ctx.xid_collection, "record", "  XID collection state"),
    ):
        setattr(owner, attribute, timed(name, getattr(owner, attribute)))
    return spent


async def main(args: argparse.Namespace) -> None:
    folder = tempfile.mkdtemp(prefix="hf-bench-")
    ctx = build_context(
        settings=ServerSettings.load(database_url=f"sqlite:///{folder}/bench.db", log_level="warning"),
        health_settings=HealthStorageSettings.load(dedup_cache_entries=args.nodes * 8),
    )
    server = create_app(ctx, run_worker=False)
    agents = agent_nodes(args.nodes)
    async with server.router.lifespan_context(server):  # the schema is made on start
        _, token = SqlTokenStore(ctx.engine).create_token(
            name="bench", scopes=parse_scopes("agent"), tenant_id=None, now=datetime.now(UTC)
        )
        os.environ["FLOOR_TOKEN"] = token
        from bench import floor_app  # the floor reads its token at import

        transport = httpx.ASGITransport(app=server)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            nodes = []
            for agent in agents:
                answer = await client.post(
                    "/api/v1/nodes/register", json=agent.registration, headers={"Authorization": f"Bearer {token}"}
                )
                registered = answer.raise_for_status().json()
                nodes.append((registered["node_id"], registered["node_credential"]))
        ours, floor = await rounds(
            server=server, floor=floor_app.app, ctx=ctx, token=token, nodes=nodes, agents=agents, args=args
        )
    print(f"heartbeat CPU in one process, {args.beats} beats x {args.rounds} rounds, {args.nodes} nodes x 8 cards")
    print(f"{'app':<28} {'min ms/beat':>11} {'median ms/beat':>14}")
    for name, values in (("heteroflow server", ours), ("floor: decode + validate", floor)):
        print(f"{name:<28} {min(values):>11.3f} {statistics.median(values):>14.3f}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"server / floor: x{min(ours) / min(floor):.2f} (min), "
        f"x{statistics.median(ours) / statistics.median(floor):.2f} (median); load average {load}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beats", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--profile", type=int, default=0, help="print this many cProfile rows of one server round")
    parser.add_argument("--profile-sort", default="cumulative", help="the rows' order: cumulative, tottime, calls")
    parser.add_argument("--stages", action="store_true", help="time the route's stages over one more server round")
    asyncio.run(main(parser.parse_args()))
