"""Recovery latency of DP scale-down, stage by stage, against the whole-instance reconfiguration path; and the
status-poll overhead on serving latency. Everything on real processes (a local cluster, simulated engines).

Three clusters run one after the other (DP 4 over 2 pods each), the same run measuring every figure it compares:

1. ``off``     - ``enable_dp_scale_down: false``: the baseline of serving latency.
2. ``default`` - scale-down on, every poll interval at its default (NodeManager FT poll 1 s, controller round
                 polls 1 s).
3. ``fast``    - scale-down on, both poll intervals 0.2 s (``HETEROFLOW_ENGINE_FT_POLL_INTERVAL_SEC`` for the
                 NodeManagers, ``dp_scale_down_config.poll_interval_sec`` for the controller).

On each: ``--requests`` sequential completions through the Coordinator with no fault (p50/p99 latency; the
control plane's CPU over that phase, controller + NodeManagers, from /proc). On ``default`` and ``fast`` then
``--rounds`` scale-down rounds, each killing one rank's worker under traffic, with its stages from the
injection to the survivors' view published (ADD), read from the controller's round timeline and the logs of the
controller and the engines (every line carries a timestamp):

    detect   injection -> first fault report at the controller
    collect  first report -> decision (complete UNHEALTHY + DEAD snapshot; survivors are reported by the
             NodeManagers' FT poll, so this is where its interval shows)
    ready    decision -> DEL (write-ahead, guards, first survivor poll: apply-ready)
    apply    DEL -> the last apply accepted (HTTP 202)
    rebuild  last apply -> every survivor healthy as the controller polls it
    commit   all healthy -> ADD (completion probes, finalize, persist, ADD)
    engine   the engines' own time: injection -> the last survivor's failed collective, plus the first apply
             accepted by an engine -> the last survivor's rebuild finished
    control  total - engine: what the control plane adds

Two ranks can go before the survivors run out of expert slots (4 experts + 4 redundant replicas over 4 ranks),
so after every second round the instance is restored by the whole-instance reconfiguration path, and that
restore is the comparison: an unmappable hardware fault (F-12: no correlation window, straight to
InstanceReconfiguration) → every engine terminated and relaunched → published again. With scale-down off the
controller reconfigures nothing (phase DISABLED); in production the NodeManager's suicide and the pod's
recreation take over, which a local cluster does not do, so that baseline path cannot be timed here.

Usage::

    .venv/bin/python bench/recovery.py [--rounds 5] [--requests 200] [--settings off,default,fast]
                                       [--kill-order 2,1,3,0] [--data-dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from heteroflow.local import ClusterOptions, ClusterState, LocalCluster
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.faults import KillMode, kill

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the polling helper lives with the tests

from tests.support.polling import until

POLL_SEC = 0.05
"""The polling period of the waits that time a step: the figures are exact to it."""

INSTANCE = "inst-1"
STAGES = ("detect", "collect", "ready", "apply", "rebuild", "commit", "total", "engine", "control")
KILL_ORDER = (2, 1, 3, 0)
"""Ranks killed in turn; two per restore (the second round moves the master when it removes rank 0)."""
TARGET_CONTROL_P50 = {"default": 1.5, "fast": 0.5}
"""The targets: seconds the control plane may add to recovery at p50."""


@dataclass(frozen=True)
class Setting:
    name: str
    scale_down: bool
    poll_sec: float | None
    """``None``: every poll interval at its default."""


SETTINGS = (Setting("off", False, None), Setting("default", True, None), Setting("fast", True, 0.2))


@dataclass
class Latency:
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    control_plane_cpu_ms_per_s: float


@dataclass
class RoundStages:
    setting: str
    rank: int
    request_id: str
    seconds: dict[str, float]
    controller: dict[str, float] = field(default_factory=dict)
    """The controller's own stage timings of the round (``stage_seconds`` of its timeline: decided -> guard,
    -> apply_ready, -> apply, -> recovered, -> probe, -> commit, -> publish)."""
    dispatch: dict[str, float] = field(default_factory=dict)
    """The apply dispatch: ``last_ack`` and ``spread`` as the controller measured them (its ``dispatch`` event),
    and ``engine_spread``: the first to the last survivor engine accepting the round's command (engine logs) —
    what vLLM 0.34's ten-second check-in is about."""


@dataclass
class Reconfiguration:
    setting: str
    to_reconfiguring: float
    to_relaunched: float
    """Report -> NORMAL again (every engine relaunched and ready)."""
    to_serving: float
    """Report -> the Coordinator publishes every rank and a completion answers."""


@dataclass
class Results:
    machine: dict[str, Any]
    latency: dict[str, Latency] = field(default_factory=dict)
    rounds: list[RoundStages] = field(default_factory=list)
    reconfigurations: list[Reconfiguration] = field(default_factory=list)


# == helpers ======================================================================================================


def ts(text: str) -> float:
    """An ISO timestamp of a log line or a timeline event, as seconds since the epoch."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def json_lines(path: Path, event: str) -> list[dict[str, Any]]:
    found = []
    with contextlib.suppress(OSError), path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if f'"{event}"' in line:
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict) and record.get("event") == event:
                        found.append(record)
    return found


def status(state: ClusterState) -> dict[str, Any] | None:
    with ClusterClient(state, timeout_sec=5) as client:
        try:
            return client.instance_status(INSTANCE)
        except ClusterUnreachableError:
            return None


def serving(state: ClusterState, ranks: list[int], *, within: float = 240) -> None:
    def check() -> bool:
        entry = status(state)
        if entry is None or not entry["can_serve"] or entry["published_endpoints"] != ranks:
            return False
        with ClusterClient(state, timeout_sec=30) as client:
            try:
                return client.published(INSTANCE) == ranks and bool(client.completion("ready?"))
            except ClusterUnreachableError:
                return False

    until(check, within=within, what=f"serving {ranks}", period=POLL_SEC)


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@contextlib.contextmanager
def traffic(state: ClusterState) -> Iterator[None]:
    """Completions in a background thread: survivors meet a dead peer only in a collective, under traffic."""
    stop = threading.Event()
    answered = threading.Event()

    def run() -> None:
        with ClusterClient(state, timeout_sec=30) as client:
            while not stop.is_set():
                try:
                    client.completion("traffic keeps the ranks in their collectives")
                    answered.set()
                except ClusterUnreachableError:
                    stop.wait(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        if not answered.wait(30):
            raise TimeoutError("no completion under traffic")
        yield
    finally:
        stop.set()
        thread.join(timeout=60)


# == phases =======================================================================================================
def start_cluster(setting: Setting, data_dir: Path) -> LocalCluster:
    ft: dict[str, Any] = {"enable_dp_scale_down": setting.scale_down}
    # every second round ends in a deliberate whole-instance reconfiguration: more than the controller's 3 per 30
    # minutes, after which it would stop relaunching (INTERVENTION_REQUIRED) and the bench would wait for nothing
    env: dict[str, str] = {"HETEROFLOW_FT_FALLBACK_MAX_ATTEMPTS": "100"}
    if setting.poll_sec is not None:
        ft["dp_scale_down_config"] = {"poll_interval_sec": setting.poll_sec}
        env["HETEROFLOW_ENGINE_FT_POLL_INTERVAL_SEC"] = str(setting.poll_sec)
    config = data_dir / f"{setting.name}.yaml"
    config.write_text(yaml.safe_dump({"fault_tolerance_config": ft}))
    options = ClusterOptions(
        data_dir=data_dir / setting.name,
        server_port=0,
        controller_port=0,
        coordinator_port=0,
        controller_config=config,
        extra_env=env,
    )
    cluster = LocalCluster(options)
    cluster.start()
    try:
        if setting.scale_down:
            cluster.wait_ready(timeout_sec=300)
        else:  # with scale-down off can_serve stays false (F-40): readiness is "published, and answers"
            until(
                lambda: (e := status(cluster.state)) is not None and e["published_endpoints"] == [0, 1, 2, 3],
                within=300,
                what="the baseline view published",
                period=0.25,
            )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def measure_latency(cluster: LocalCluster, requests: int) -> Latency:
    pids = [p.pid for p in cluster.processes if p.name.split(":")[0] in ("controller", "node-manager")]
    latencies: list[float] = []
    errors = 0
    with ClusterClient(cluster.state, timeout_sec=30) as client:
        for _ in range(10):  # warm-up: connections, caches
            with contextlib.suppress(ClusterUnreachableError):
                client.completion("warm up")
        cpu_before, wall_before = cpu_seconds(pids), time.monotonic()
        for n in range(requests):
            started = time.perf_counter()
            try:
                client.completion(f"request {n} of the latency phase", max_tokens=8)
                latencies.append(time.perf_counter() - started)
            except ClusterUnreachableError:
                errors += 1
        cpu = cpu_seconds(pids) - cpu_before
        wall = time.monotonic() - wall_before
    return Latency(
        requests=requests,
        errors=errors,
        p50_ms=percentile(latencies, 0.5) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        mean_ms=statistics.fmean(latencies) * 1000 if latencies else float("nan"),
        control_plane_cpu_ms_per_s=cpu / wall * 1000,
    )


def one_round(cluster: LocalCluster, setting: Setting, rank: int, dead: list[int]) -> RoundStages:
    state = cluster.state
    inst = state.instance(INSTANCE)
    log_dir = Path(state.log_dir)
    survivors = sorted(set(range(4)) - set(dead) - {rank})
    with traffic(state), ClusterClient(state, timeout_sec=10) as client:
        injected = time.time()
        kill(client, inst, rank, mode=KillMode.WORKER)
        committed = sorted([*dead, rank])

        def done() -> dict[str, Any] | None:
            entry = status(state)
            if entry is None or entry["phase"] != "SCALED_DOWN_RUNNING" or entry["dead_committed"] != committed:
                return None
            return entry if entry["can_serve"] else None

        entry = until(done, within=120, what=f"rank {rank} removed", period=POLL_SEC)
        timeline = client.round(str(entry["request_id"]))
    request_id = str(timeline["request_id"])
    at = {e["kind"]: ts(e["at"]) for e in reversed(timeline["events"])}  # first occurrence of each kind
    applies = [ts(e["at"]) for e in timeline["events"] if e["kind"] == "apply"]
    healthy = next(ts(e["at"]) for e in timeline["events"] if e["kind"] == "phase" and e["to"] == "POST_SCALE_CLEANUP")
    reports = [
        ts(r["timestamp"])
        for r in json_lines(log_dir / "controller.log", "controller.fault_reported")
        if ts(r["timestamp"]) >= injected
    ]
    failed_collectives, accepted, rebuilt = [], [], []
    for survivor in survivors:
        engine_log = log_dir / INSTANCE / f"engine-{survivor}.log"
        failed = [ts(r["timestamp"]) for r in json_lines(engine_log, "engine.collective_failed")]
        failed_collectives.append(min(t for t in failed if t >= injected))
        accepted += [
            ts(r["timestamp"])
            for r in json_lines(engine_log, "engine.ft_command")
            if r.get("request_id") == request_id and r.get("accepted")
        ]
        rebuilt += [
            ts(r["timestamp"])
            for r in json_lines(engine_log, "engine.rebuild_finished")
            if r.get("request_id") == request_id and r.get("ok")
        ]
    total = at["coordinator_add"] - injected
    engine = (max(failed_collectives) - injected) + (max(rebuilt) - min(accepted))
    seconds = {
        "detect": min(reports) - injected,
        "collect": at["decided"] - min(reports),
        "ready": at["coordinator_del"] - at["decided"],
        "apply": max(applies) - at["coordinator_del"],
        "rebuild": healthy - max(applies),
        "commit": at["coordinator_add"] - healthy,
        "total": total,
        "engine": engine,
        "control": total - engine,
    }
    controller = {str(k): float(v) for k, v in (timeline.get("stage_seconds") or {}).items()}
    dispatch_events = [e for e in timeline["events"] if e["kind"] == "dispatch" and e.get("ok")]
    dispatch = {"engine_spread": round(max(accepted) - min(accepted), 4)}
    if dispatch_events:
        dispatch |= {"last_ack": dispatch_events[0]["last_ack_sec"], "spread": dispatch_events[0]["spread_sec"]}
    return RoundStages(
        setting.name, rank, request_id, {k: round(v, 4) for k, v in seconds.items()}, controller, dispatch
    )


def reconfigure(cluster: LocalCluster, setting: Setting) -> Reconfiguration:
    """Restore every rank through InstanceReconfiguration, timing it (an unmappable hardware fault goes there
    at once, without a correlation window)."""
    state = cluster.state
    node = state.instance(INSTANCE).pods[0].node_name
    with ClusterClient(state, timeout_sec=10) as client:
        reported = time.monotonic()
        client.report_hardware_fault(
            {"node_name": node, "card": "slot 4 / left", "fault_code": "XID79", "level": 5, "source": "bench"}
        )
    until(
        lambda: (e := status(state)) is not None and e["phase"] == "RECONFIGURING",
        within=60,
        what="reconfiguring",
        period=POLL_SEC,
    )
    to_reconfiguring = time.monotonic() - reported
    until(
        lambda: (e := status(state)) is not None and e["phase"] == "NORMAL" and e["dead_committed"] == [],
        within=300,
        what="relaunched",
        period=POLL_SEC,
    )
    to_relaunched = time.monotonic() - reported
    serving(state, [0, 1, 2, 3])
    to_serving = time.monotonic() - reported
    return Reconfiguration(setting.name, round(to_reconfiguring, 3), round(to_relaunched, 3), round(to_serving, 3))


# == report =======================================================================================================
def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def report(results: Results) -> None:
    print(f"machine: {json.dumps(results.machine)}")
    base = results.latency.get("off")
    print("\nserving latency, no fault (sequential completions through the Coordinator, 8 tokens)")
    print("| setting | requests | errors | p50 ms | x off | p99 ms | x off | control-plane CPU ms/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, lat in results.latency.items():
        r50 = lat.p50_ms / base.p50_ms if base else float("nan")
        r99 = lat.p99_ms / base.p99_ms if base else float("nan")
        print(
            f"| {name} | {lat.requests} | {lat.errors} | {lat.p50_ms:.1f} | {r50:.2f} | {lat.p99_ms:.1f} | "
            f"{r99:.2f} | {lat.control_plane_cpu_ms_per_s:.1f} |"
        )
    reconf = {s: [r for r in results.reconfigurations if r.setting == s] for s in ("default", "fast")}
    for name in ("default", "fast"):
        rounds = [r for r in results.rounds if r.setting == name]
        if not rounds:
            continue
        print(f"\nscale-down rounds, setting {name} (seconds; p50 and max over {len(rounds)} rounds)")
        print("| round | rank | " + " | ".join(STAGES) + " |")
        print("|---|---|" + "---|" * len(STAGES))
        for n, r in enumerate(rounds, 1):
            print(f"| {n} | {r.rank} | " + " | ".join(f"{r.seconds[s]:.3f}" for s in STAGES) + " |")
        p50 = {s: statistics.median(r.seconds[s] for r in rounds) for s in STAGES}
        p95 = {s: percentile([r.seconds[s] for r in rounds], 0.95) for s in STAGES}
        top = {s: max(r.seconds[s] for r in rounds) for s in STAGES}
        print("| p50 | | " + " | ".join(f"{p50[s]:.3f}" for s in STAGES) + " |")
        print("| p95 | | " + " | ".join(f"{p95[s]:.3f}" for s in STAGES) + " |")
        print("| max | | " + " | ".join(f"{top[s]:.3f}" for s in STAGES) + " |")
        restores = reconf[name]
        if restores:
            serve = statistics.median(r.to_serving for r in restores)
            relaunch = statistics.median(r.to_relaunched for r in restores)
            print(
                f"whole-instance reconfiguration ({len(restores)} times): report → RECONFIGURING p50 "
                f"{statistics.median(r.to_reconfiguring for r in restores):.2f} s, → relaunched p50 {relaunch:.2f} s, "
                f"→ serving again p50 {serve:.2f} s"
            )
            print(
                f"scale-down total p50 {p50['total']:.2f} s = {p50['total'] / serve:.3f} x the reconfiguration "
                f"path (serving again), {p50['total'] / relaunch:.3f} x its relaunch alone"
            )
        print(f"\napply dispatch, setting {name} (seconds; vLLM 0.34 fails a round not joined by all within 10 s)")
        print("| round | rank | last NodeManager ack | ack spread | engine receive spread |")
        print("|---|---|---|---|---|")
        for n, r in enumerate(rounds, 1):
            d = r.dispatch
            print(
                f"| {n} | {r.rank} | {d.get('last_ack', float('nan')):.4f} | {d.get('spread', float('nan')):.4f} | "
                f"{d['engine_spread']:.4f} |"
            )
        target = TARGET_CONTROL_P50[name]
        verdict = "met" if p50["control"] <= target else "NOT met"
        print(f"target: control plane adds ≤ {target} s at p50 — measured {p50['control']:.3f} s: {verdict}")
        strict = p95["control"] <= 0.5 and top["control"] <= 1.0 and p95["total"] <= 1.5
        print(
            f"target: control p95 ≤ 0.5 s and max ≤ 1 s, total p95 ≤ 1.5 s — measured control p95 "
            f"{p95['control']:.3f} s, max {top['control']:.3f} s, total p95 {p95['total']:.3f} s: "
            f"{'met' if strict else 'NOT met'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="scale-down rounds per setting (default 5)")
    parser.add_argument("--requests", type=int, default=200, help="completions per latency phase (default 200)")
    parser.add_argument("--data-dir", type=Path, default=None, help="where the clusters keep data and logs")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    parser.add_argument(
        "--settings",
        default="off,default,fast",
        help="comma-separated settings to run, of off, default, fast (default all three)",
    )
    parser.add_argument(
        "--kill-order",
        default=",".join(str(r) for r in KILL_ORDER),
        help="comma-separated ranks killed in turn, two per restore (default 2,1,3,0; 3,0 times rank 0, the "
        "store host, in every second round)",
    )
    args = parser.parse_args()
    chosen = [s for s in SETTINGS if s.name in args.settings.split(",")]
    kill_order = [int(r) for r in args.kill_order.split(",")]
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="heteroflow-bench-recovery-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    results = Results(machine=machine())
    print(f"data and logs under {data_dir}", flush=True)
    for setting in chosen:
        print(f"[{setting.name}] starting a cluster", flush=True)
        cluster = start_cluster(setting, data_dir)
        try:
            results.latency[setting.name] = measure_latency(cluster, args.requests)
            print(f"[{setting.name}] latency: {asdict(results.latency[setting.name])}", flush=True)
            if setting.scale_down:
                dead: list[int] = []
                for n in range(args.rounds):
                    rank = kill_order[n % len(kill_order)]
                    stages = one_round(cluster, setting, rank, dead)
                    results.rounds.append(stages)
                    dead = sorted([*dead, rank])
                    print(f"[{setting.name}] round {n + 1} rank {rank}: {stages.seconds}", flush=True)
                    print(f"[{setting.name}]   controller stages: {stages.controller}", flush=True)
                    if len(dead) == 2 or n == args.rounds - 1:
                        restore = reconfigure(cluster, setting)
                        results.reconfigurations.append(restore)
                        dead = []
                        print(f"[{setting.name}] reconfiguration: {asdict(restore)}", flush=True)
        finally:
            cluster.stop()
    results.machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print()
    report(results)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(results), indent=2) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
