"""Streaming requests through the Coordinator: 200 kept in flight, a rank dying under them, then a burst of 2,000.

Real processes (``tests/load/streams.py`` has the set-up and the reasons for it): ``heteroflow coordinator`` in
front of a DP-4 ``heteroflow engine-sim`` instance (torch workers in a gloo group); the controller's part of the
scale-down round is played with its calls in its order (survivors unhealthy → DEL of the instance's view →
``scale_down`` applied to the survivors → survivors healthy → ADD of the survivors). Phases, one instance, one
Coordinator:

1. baseline  - ``--streams`` (default 200) streaming chat completions kept in flight for ``--seconds``: each of
               the client's lanes sends its next request as soon as the previous one ends;
2. scale-down - the same load for ``--seconds``; a third of the way in, rank 2's processes are killed (SIGKILL)
               and the round runs;
3. management - the same load while ``--ops`` rounds of SET, DEL and ADD (one after the other, sent from a
               process of its own, as the controller's) go to the management listener for a second instance
               (``probe``, another model, one endpoint on an engine): how long each takes from the request sent
               to its answer, which the Coordinator gives once the change is in force for routing
               (``docs/coordinator.md``), checked against the views the answer returns;
4. overload  - ``--burst`` (default 2,000) requests at once against the Coordinator's concurrency bound
               (``--max-concurrent``, default: the Coordinator's default, 1000).

Per phase: requests started, how they ended (``done``: ``[DONE]`` received; ``error_event``: an error event ended
the stream; ``http_<status>``: an error answer; ``transport:…``/``cut``: the client got no clear answer),
completion rate (done / started), done per second, latency p50/p95 of the completed streams and time to the
first byte, the Coordinator's RSS (start/peak/end, VmRSS sampled every 0.5 s) and CPU, the most requests it had
in progress at once, and the load generator's CPU. For the scale-down phase also: requests started after the DEL
returned that reached a withdrawn endpoint (must be 0), how the requests on the dying rank ended, and the round's
timeline. Ratios are against the baseline phase of the same run. The requests' endpoints come from the
``X-HeteroFlow-Endpoint`` answer header and the Coordinator's ``coordinator.upstream_failed`` log lines. Usage::

    .venv/bin/python bench/load_streams.py [--streams 200] [--seconds 20] [--max-tokens 32] [--burst 2000]
                                           [--max-concurrent N] [--ops 30]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from heteroflow.http.tls import client_tls

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shared scenario lives with the tests

from tests.load.streams import Load, Record, Round, Stack, Verdict, judge, percentile, running, sample_rss

from heteroflow.contracts.serving import COORDINATOR_ADD_PATH, COORDINATOR_DEL_PATH, COORDINATOR_SET_PATH

DEAD_RANK = 2
PROBE_INSTANCE = "probe"
PROBE_MODEL = "heteroflow-probe"
"""A model no load request names: the management operations on it change no route the load takes."""


@dataclass
class Phase:
    name: str
    records: list[Record] = field(default_factory=list)
    seconds: float = 0.0
    rss: list[float] = field(default_factory=list)
    coordinator_cpu_sec: float = 0.0
    client_cpu_sec: float = 0.0
    peak_in_progress: int = 0
    verdict: Verdict | None = None
    round: Round | None = None
    management_ms: dict[str, list[float]] = field(default_factory=dict)
    """Per operation (SET, DEL, ADD): milliseconds from the request sent to its answer."""

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome for r in self.records)

    @property
    def done(self) -> list[Record]:
        return [r for r in self.records if r.outcome == "done"]

    @property
    def completion(self) -> float:
        return len(self.done) / max(1, len(self.records))

    @property
    def rate(self) -> float:
        return len(self.done) / self.seconds if self.seconds else 0.0

    def latency_ms(self, q: float) -> float:
        return percentile([r.seconds for r in self.done], q) * 1000

    def first_byte_ms(self, q: float) -> float:
        return percentile([(r.first_byte or r.started) - r.started for r in self.done], q) * 1000


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(stack: Stack, phase: Phase, load: Load, work: Awaitable[object]) -> Phase:
    assert stack.coordinator is not None
    first = len(load.records)
    stop_rss = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(stack, phase.rss, stop_rss))
    cpu, client_cpu, started = cpu_seconds(stack.coordinator.pid), time.process_time(), time.perf_counter()
    await work
    phase.seconds = time.perf_counter() - started
    phase.coordinator_cpu_sec = cpu_seconds(stack.coordinator.pid) - cpu
    phase.client_cpu_sec = time.process_time() - client_cpu
    stop_rss.set()
    await sampler
    phase.records = load.records[first:]
    phase.peak_in_progress = (await stack.coordinator_status()).get("in_progress_peak", 0)
    return phase


async def kept(load: Load, streams: int, seconds: float) -> None:
    stop = asyncio.Event()
    lanes = asyncio.create_task(load.keep(streams, stop))
    await asyncio.sleep(seconds)
    stop.set()
    await lanes


async def kept_through_a_round(stack: Stack, load: Load, phase: Phase, streams: int, seconds: float) -> None:
    stop = asyncio.Event()
    lanes = asyncio.create_task(load.keep(streams, stop))
    began = time.monotonic()
    await asyncio.sleep(seconds / 3)
    phase.round = await stack.scale_down(DEAD_RANK)
    await asyncio.sleep(max(0.0, seconds - (time.monotonic() - began)))
    stop.set()
    await lanes


def management_ops(base_url: str, headers: dict[str, str], engine_port: int, ops: int) -> dict[str, list[float]]:
    """``ops`` rounds of SET → DEL → ADD on the probe instance, one after the other, each timed (ms per op).

    Run in a process of its own, as the controller is: a thread of the load generator would share its
    interpreter lock with the 200 streams' event loop, and that wait is not the Coordinator's. Each answer must
    already show the change (the probe's endpoint published after SET and ADD, withdrawn after DEL): the
    Coordinator answers once the views routing reads have changed. The DEL carries the round's generation and
    the ADD the next one, as the controller sends them.
    """
    timings: dict[str, list[float]] = {}
    endpoint = {"id": 0, "ip": "127.0.0.1", "port": engine_port}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30, verify=client_tls()) as client:
        for i in range(ops):
            generation = 2 * i
            steps = (
                ("SET", COORDINATOR_SET_PATH, {"endpoints": [endpoint], "model": PROBE_MODEL}, generation, True),
                ("DEL", COORDINATOR_DEL_PATH, {"endpoint_ids": [0]}, generation, False),
                ("ADD", COORDINATOR_ADD_PATH, {"endpoints": [endpoint], "model": PROBE_MODEL}, generation + 1, True),
            )
            for op, path, fields, gen, published in steps:
                body = {"instance_id": PROBE_INSTANCE, "request_id": f"probe-{i}", "generation": gen, **fields}
                started = time.perf_counter()
                answer = client.post(path, json=body)
                elapsed_ms = (time.perf_counter() - started) * 1000
                answer.raise_for_status()
                views = {v["instance_id"]: v for v in answer.json()["instances"]}
                shown = [e["id"] for e in views[PROBE_INSTANCE]["endpoints"]]
                if shown != ([0] if published else []):
                    raise RuntimeError(f"{op} answered before its change was in force: probe endpoints {shown}")
                timings.setdefault(op, []).append(elapsed_ms)
            time.sleep(0.1)  # spread over the phase: each round meets the load at another moment
    return timings


async def kept_through_management(stack: Stack, load: Load, phase: Phase, streams: int, ops: int) -> None:
    stop = asyncio.Event()
    lanes = asyncio.create_task(load.keep(streams, stop))
    await asyncio.sleep(1.0)  # the lanes are all in flight
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            args = (str(stack.manage.base_url), dict(stack.manage.headers), stack.cluster.ports[0], ops)
            phase.management_ms = await asyncio.get_running_loop().run_in_executor(pool, management_ops, *args)
    finally:
        stop.set()
        await lanes


async def run(args: argparse.Namespace, workdir: Path) -> list[Phase]:
    env = {"HETEROFLOW_COORDINATOR_MAX_CONCURRENT_REQUESTS": str(args.max_concurrent)} if args.max_concurrent else {}
    async with running(workdir, coordinator_env=env) as stack:
        load = Load(stack.url, concurrency=max(args.streams, args.burst), max_tokens=args.max_tokens, timeout_sec=600)
        try:
            baseline = await measure(stack, Phase("baseline, no fault"), load, kept(load, args.streams, args.seconds))
            fault = Phase(f"scale-down of rank {DEAD_RANK}")
            await measure(stack, fault, load, kept_through_a_round(stack, load, fault, args.streams, args.seconds))
            assert fault.round is not None
            fault.verdict = judge(fault.records, stack.failed_attempts(), fault.round)
            manage = Phase("management ops")
            await measure(stack, manage, load, kept_through_management(stack, load, manage, args.streams, args.ops))
            overload = await measure(stack, Phase(f"burst of {args.burst}"), load, load.burst(args.burst, tag="b"))
            alive = stack.coordinator_alive()
        finally:
            await load.aclose()
    print(f"Coordinator alive at the end: {alive}")
    return [baseline, fault, manage, overload]


def report(phases: list[Phase], args: argparse.Namespace) -> None:
    print(
        f"streaming chat completions through the Coordinator, DP-4 engine-sim instance, {args.streams} kept in "
        f"flight, max_tokens {args.max_tokens}, {os.cpu_count()} CPUs shared by everything; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"{'phase':<24} {'started':>7} {'done %':>6} {'done/s':>6} {'p50 ms':>7} {'p95 ms':>7} {'ttfb p50':>8} "
        f"{'peak in prog':>12} {'coord RSS MiB start/peak/end':>28} {'coord cpu %':>11} {'client cpu %':>12}  outcomes"
    )
    for p in phases:
        rss = f"{p.rss[0]:.0f}/{max(p.rss):.0f}/{p.rss[-1]:.0f}" if p.rss else "-"
        print(
            f"{p.name:<24} {len(p.records):>7} {p.completion * 100:>6.1f} {p.rate:>6.1f} {p.latency_ms(0.5):>7.0f} "
            f"{p.latency_ms(0.95):>7.0f} {p.first_byte_ms(0.5):>8.0f} {p.peak_in_progress:>12} {rss:>28} "
            f"{p.coordinator_cpu_sec / p.seconds * 100:>11.0f} {p.client_cpu_sec / p.seconds * 100:>12.0f}  "
            f"{dict(p.outcomes)}"
        )
    base, fault = phases[0], phases[1]
    for p in phases[1:]:
        print(
            f"{p.name} vs {base.name}: completion x{p.completion / base.completion:.2f}, done/s "
            f"x{p.rate / base.rate:.2f}, p95 x{p.latency_ms(0.95) / base.latency_ms(0.95):.2f}"
        )
    if fault.verdict is not None and fault.round is not None:
        print(f"round (seconds after the kill): {fault.round.timeline()}")
        print(
            f"requests started after the DEL returned that reached a withdrawn endpoint: "
            f"{len(fault.verdict.routed_after_withdrawal)} {fault.verdict.routed_after_withdrawal[:5]}"
        )
        print(
            f"requests on the dying rank: {dict(fault.verdict.on_dying_rank)}, of which moved to another endpoint "
            f"by the retry: {fault.verdict.retried_off_dying_rank}"
        )
    for op, values in phases[2].management_ms.items():
        print(
            f"management {op} under {args.streams} streams, request sent -> in force (ms), {len(values)} ops: "
            f"p50 {percentile(values, 0.5):.1f} p95 {percentile(values, 0.95):.1f} max {max(values):.1f}"
        )
    refused = [r for r in phases[3].records if r.overloaded]
    print(
        f"burst: refused by the concurrency bound {len(refused)} (Retry-After "
        f"{dict(Counter(r.retry_after for r in refused))})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the baseline and scale-down phases")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--max-concurrent", type=int, default=None, help="the Coordinator's concurrency bound")
    parser.add_argument("--ops", type=int, default=30, help="rounds of SET, DEL and ADD in the management phase")
    args = parser.parse_args()
    phases = asyncio.run(run(args, Path(tempfile.mkdtemp(prefix="hf-streams-"))))
    report(phases, args)


if __name__ == "__main__":
    main()
