"""Capacity back: how long a restore of a scaled-down instance to its configured size takes, and what the clients
see meanwhile. Real processes: a local cluster (simulated engines speaking vLLM 0.34), DP 4 over 2 pods per
instance.

Each round kills rank 2's worker of ``inst-1`` under traffic (a committed DP scale-down to 3 ranks), then asks the
controller for a restore (``POST /controller/fault_tolerance/instances/inst-1/restore``, what ``heteroflow restore``
sends) and times, from the request:

    reconfiguring  -> the phase RECONFIGURING (the view withdrawn, the relaunch begins)
    relaunched     -> NORMAL with nothing retired (every engine relaunched at full size and ready)
    serving        -> the Coordinator publishes [0, 1, 2, 3] for the instance and a completion answers

and the restore's own ``seconds`` (its timeline: request to published). Traffic runs throughout, sequential
completions through the Coordinator to the model with no retries of the client's own: every failed request is
counted. With ``--instances 2`` the model has a second instance (``inst-2``), which serves it while ``inst-1`` is
relaunched; with ``--instances 1`` the Coordinator holds the model's requests until the instance is published again
(up to the client deadline, 30 s).

With ``--mode shrink`` each round instead reports a standing L6 hardware fault on rank 2's card that no engine
confirms (acceptance row A12): the correlation window expires, the whole-instance fallback relaunches the others
without rank 2 as a smaller, contiguous world of 3 (engine ranks 0, 1, 2: no released engine starts with ranks
already dead), and it times

    relaunch       -> the fallback's own timeline: decided to serving resumed (stop, start 3 engines, publish)
    published      -> the report to [0, 1, 3] published and a completion answering (includes the window)

then clears the fault and restores the instance to 4 ranks for the next round (its ``serving`` is timed too).
``BENCH_DEBUG=1`` prints each fallback's times and events.

Usage::

    .venv/bin/python bench/restore.py [--mode restore|shrink] [--instances 2] [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from heteroflow.local import ClusterOptions, ClusterState, LocalCluster
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.faults import KillMode, kill
from heteroflow.local.hardware import inject

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the polling helper lives with the tests

from tests.support.polling import until

POLL_SEC = 0.05
DEBUG = bool(os.environ.get("BENCH_DEBUG"))
INSTANCE = "inst-1"


@dataclass
class Traffic:
    state: ClusterState
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    slowest_sec: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with ClusterClient(self.state, timeout_sec=60) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    client.completion("traffic through a restore", max_tokens=4)
                    self.ok += 1
                except ClusterUnreachableError as exc:
                    self.failed.append(str(exc)[:200])
                self.slowest_sec = max(self.slowest_sec, time.monotonic() - started)


@contextlib.contextmanager
def traffic(state: ClusterState) -> Iterator[Traffic]:
    load = Traffic(state)
    thread = threading.Thread(target=load.run, daemon=True)
    thread.start()
    try:
        until(lambda: load.ok > 0, within=60, what="the first completion under traffic")
        yield load
    finally:
        load.stop.set()
        thread.join(timeout=90)


@dataclass
class Restore:
    reconfiguring: float
    relaunched: float
    serving: float
    controller_seconds: float
    requests_ok: int
    requests_failed: int
    slowest_request_sec: float


def status(client: ClusterClient) -> dict[str, Any] | None:
    try:
        return client.instance_status(INSTANCE)
    except ClusterUnreachableError:
        return None


def one_round(cluster: LocalCluster) -> Restore:
    state = cluster.state
    inst = state.instance(INSTANCE)
    with traffic(state) as load, ClusterClient(state, timeout_sec=10) as client:
        kill(client, inst, 2, mode=KillMode.WORKER)
        until(
            lambda: (
                (e := status(client)) is not None
                and e["phase"] == "SCALED_DOWN_RUNNING"
                and e["dead_committed"] == [2]
                and e["can_serve"]
                and e["restorable"] == "ready"
            ),
            within=120,
            what="rank 2 committed dead",
            period=POLL_SEC,
        )
        before_ok = load.ok
        asked = time.monotonic()
        request_id = client.restore(INSTANCE)["request_id"]
        until(
            lambda: (e := status(client)) is not None and e["phase"] == "RECONFIGURING",
            within=60,
            what="reconfiguring",
            period=POLL_SEC,
        )
        reconfiguring = time.monotonic() - asked
        until(
            lambda: (e := status(client)) is not None and e["phase"] == "NORMAL" and e["dead_committed"] == [],
            within=300,
            what="relaunched",
            period=POLL_SEC,
        )
        relaunched = time.monotonic() - asked
        until(
            lambda: (
                (e := status(client)) is not None
                and e["published_endpoints"] == [0, 1, 2, 3]
                and e["can_serve"]
                and client.published(INSTANCE) == [0, 1, 2, 3]
            ),
            within=120,
            what="serving at full size",
            period=POLL_SEC,
        )
        serving = time.monotonic() - asked
        until(lambda: load.ok > before_ok, within=60, what="a completion after the restore")
        entry = status(client) or {}
        restore = entry.get("restore") or {}
        assert restore.get("request_id") == request_id, restore
        assert restore.get("state") == "succeeded", restore
    return Restore(
        reconfiguring=round(reconfiguring, 3),
        relaunched=round(relaunched, 3),
        serving=round(serving, 3),
        controller_seconds=float(restore["seconds"]),
        requests_ok=load.ok,
        requests_failed=len(load.failed),
        slowest_request_sec=round(load.slowest_sec, 3),
    )


@dataclass(frozen=True)
class Shrink:
    relaunch: float
    published: float
    restore_serving: float
    requests_ok: int
    requests_failed: int
    slowest_request_sec: float


def _seconds_between(times: dict[str, Any], start: str, end: str) -> float:
    return (datetime.fromisoformat(times[end]) - datetime.fromisoformat(times[start])).total_seconds()


def one_shrink_round(cluster: LocalCluster) -> Shrink:
    state = cluster.state
    inst = state.instance(INSTANCE)
    with traffic(state) as load, ClusterClient(state, timeout_sec=10) as client:
        earlier = {r["request_id"] for r in client.rounds(INSTANCE)}
        asked = time.monotonic()
        inject(client, inst, 2, level=6)
        entry = until(
            lambda: (
                (e := status(client)) is not None
                and e["phase"] == "SCALED_DOWN_RUNNING"
                and e["dead_committed"] == [2]
                and (e["relaunch"] or {}).get("kind") == "WITHOUT_RANKS"
                and e["can_serve"]
                and client.published(INSTANCE) == [0, 1, 3]
                and e
            ),
            within=300,
            what="relaunched without rank 2",
            period=POLL_SEC,
        )
        before_ok = load.ok
        until(lambda: load.ok > before_ok, within=60, what="a completion after the relaunch")
        published = time.monotonic() - asked
        worlds = {(r["rank"], r["engine_rank"], r["engine_dp_size"]) for p in entry["pods"] for r in p["ranks"]}
        assert {(0, 0, 3), (1, 1, 3), (3, 2, 3)} <= worlds, worlds  # the engines' own, renumbered world
        (fallback,) = [r for r in client.rounds(INSTANCE) if r["kind"] == "fallback" and r["request_id"] not in earlier]
        timeline = client.round(fallback["request_id"])
        times = timeline["times"]
        if DEBUG:
            print(json.dumps({"times": times, "events": [(e.get("at"), e["kind"]) for e in timeline["events"]]}))
        relaunch = _seconds_between(times, "decided_at", "serving_resumed_at")
        inject(client, inst, 2, level=6, cleared=True)
        until(lambda: (e := status(client)) is not None and e["restorable"] == "ready", within=60, what="restorable")
        restored_at = time.monotonic()
        client.restore(INSTANCE)
        until(
            lambda: (
                (e := status(client)) is not None
                and e["phase"] == "NORMAL"
                and client.published(INSTANCE) == [0, 1, 2, 3]
            ),
            within=300,
            what="restored to 4 ranks",
            period=POLL_SEC,
        )
        restore_serving = time.monotonic() - restored_at
    return Shrink(
        relaunch=round(relaunch, 3),
        published=round(published, 3),
        restore_serving=round(restore_serving, 3),
        requests_ok=load.ok,
        requests_failed=len(load.failed),
        slowest_request_sec=round(load.slowest_sec, 3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("restore", "shrink"), default="restore")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="heteroflow-restore-") as tmp:
        data_dir = args.data_dir or Path(tmp)
        options = ClusterOptions(
            data_dir=data_dir / "cluster",
            server_port=0,
            controller_port=0,
            coordinator_port=0,
            instances=args.instances,
        )
        cluster = LocalCluster(options)
        cluster.start()
        results: list[Restore | Shrink] = []
        measure: Callable[[LocalCluster], Restore | Shrink] = one_shrink_round if args.mode == "shrink" else one_round
        try:
            cluster.wait_ready(timeout_sec=600)
            for n in range(args.rounds):
                result = measure(cluster)
                results.append(result)
                print(f"round {n + 1}: {asdict(result)}", flush=True)
        finally:
            cluster.stop()
    print(
        f"mode {args.mode}, instances {args.instances}, {len(results)} rounds, "
        f"load average {Path('/proc/loadavg').read_text()}"
    )
    keys = (
        ("relaunch", "published", "restore_serving")
        if args.mode == "shrink"
        else ("reconfiguring", "relaunched", "serving", "controller_seconds")
    )
    for key in keys:
        values = [getattr(r, key) for r in results]
        print(f"  {key:20s} p50 {statistics.median(values):.2f} s  min {min(values):.2f}  max {max(values):.2f}")
    print(f"  requests: {sum(r.requests_ok for r in results)} ok, {sum(r.requests_failed for r in results)} failed")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
