"""What a soak run (``bench/soak.py``) records, how its invariants are judged at the end, and its summary.

The checks here are pure functions over what the run collected — the request log, the round summaries and
timelines, the Coordinator's log lines, row counts — so each can be read (and tried) on its own; the run itself,
with the status sampler that checks as it goes, is in ``bench/soak.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.acceptance.harness import log_events, timestamp

from heteroflow.agent.settings import AgentSettings
from heteroflow.agent.simulated import SimulatedCollector
from heteroflow.core.ids import NodeId
from heteroflow.core.testing import FakeClock
from heteroflow.health.samples import CardKey, HealthReading, StoredSample
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.health.write_policy import decide_write
from heteroflow.local.plan import CARDS_PER_NODE

LONG_LIVED = ("server", "controller", "coordinator", "node-manager")
RSS_RATIO, RSS_ALLOWANCE_MIB = 1.5, 32.0
"""Invariant 5: a long-lived process's RSS at the end may be this many times its start plus this many MiB (code
paths used for the first time by a fault — rounds, fallbacks — load modules and fill caches)."""


# == records ====================================================================================================
@dataclass
class RequestRecord:
    """One client request through the Coordinator (times in epoch seconds, as the Coordinator logs them)."""

    request_id: str
    route: str
    stream: bool
    started: float
    ended: float = 0.0
    ok: bool = False
    status: int | None = None
    error: str | None = None


@dataclass
class Fault:
    """One injected fault and what it did."""

    at: float
    kind: str
    instance: str
    rank: int
    what: str = ""
    error: str | None = None
    variant: str | None = None
    """``kill``: worker/process; ``hardware``: via and variant."""
    reacted: bool | None = None
    """Whether a round started or the controller left idle (``None``: none was expected)."""


@dataclass
class Violation:
    """One breach of an invariant (1-5, see ``bench/soak.py``)."""

    invariant: int
    at: float
    text: str


@dataclass
class Report:
    """Everything the summary prints (and ``--json`` writes)."""

    options: dict[str, Any]
    machine: dict[str, Any]
    faults: list[Fault] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    timelines: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every round's evidence timeline by request id (for ``--json``; the summary does not print them)."""
    requests: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    database: dict[str, Any] = field(default_factory=dict)
    rss_mib: dict[str, dict[str, float]] = field(default_factory=dict)
    processes: dict[str, Any] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# == checks =====================================================================================================
def coordinator_log(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The Coordinator's log lines that matter here, by event (``coordinator.`` left out)."""
    names = ("view_changed", "forwarded", "stream_finished", "upstream_failed", "withdrawn_before_send")
    return {name: log_events(path, f"coordinator.{name}") for name in names}


def publication_changes(view_changes: list[dict[str, Any]]) -> dict[tuple[str, int], list[tuple[float, bool]]]:
    """(instance, endpoint) → [(time, published after this change)], in time order. Pure."""
    found: dict[tuple[str, int], list[tuple[float, bool]]] = {}
    for change in sorted(view_changes, key=lambda c: c["timestamp"]):
        at = timestamp(change["timestamp"])
        for endpoint in change.get("withdrawn") or []:
            found.setdefault((change["instance"], int(endpoint)), []).append((at, False))
        for endpoint in change.get("published") or []:
            found.setdefault((change["instance"], int(endpoint)), []).append((at, True))
    return found


def routed_while_withdrawn(
    attempts: list[tuple[str, str, int, float, float]], changes: dict[tuple[str, int], list[tuple[float, bool]]]
) -> list[str]:
    """Invariant 2 over (request id, instance, endpoint, request start, attempt's log line): the attempts sent to
    an endpoint that was withdrawn when the request started and not published again before the attempt. Pure."""
    found = []
    for request_id, instance, endpoint, started, logged in attempts:
        history = changes.get((instance, endpoint), [])
        published = False
        for at, state in history:
            if at > started:
                break
            published = state
        if published or any(state and started < at <= logged for at, state in history):
            continue
        found.append(f"request {request_id} went to {instance} endpoint {endpoint}, withdrawn at its start")
    return found


def check_rounds(rounds: list[dict[str, Any]]) -> list[str]:
    """Invariant 3 over the round summaries (any order): what did not end committed, succeeded or deduplicated,
    and failed without a later fallback that succeeded. Pure."""
    problems = []
    ordered = sorted(rounds, key=lambda r: r["started_at"])
    for n, summary in enumerate(ordered):
        outcome = summary["outcome"]
        if outcome in ("committed", "succeeded", "deduplicated"):
            continue
        if outcome == "failed":
            later = [r for r in ordered[n + 1 :] if r["instance_id"] == summary["instance_id"]]
            if later and later[0]["kind"] == "fallback" and later[0]["outcome"] == "succeeded":
                continue
            problems.append(f"round {summary['request_id']} ({summary['kind']}) failed and no fallback succeeded next")
        else:
            problems.append(f"round {summary['request_id']} ({summary['kind']}) has not ended ({outcome})")
    return problems


def round_ids_shared(view_changes: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Round ids the Coordinator saw in view operations of more than one instance. Pure."""
    instances: dict[str, set[str]] = {}
    for change in view_changes:
        if change.get("request_id"):
            instances.setdefault(change["request_id"], set()).add(change["instance"])
    return [(rid, sorted(found)) for rid, found in sorted(instances.items()) if len(found) > 1]


def missing_fallbacks(
    succeeded: list[tuple[str, float]], rounds: dict[str, dict[str, Any]], timelines: dict[str, dict[str, Any]]
) -> list[str]:
    """Invariant 3's bookkeeping: every fallback the controller logged as succeeded (instance, time) is a round of
    that instance in its round history, finished within 2 s of the log line. Pure."""
    finished = [
        (found["instance_id"], timestamp(e["at"]))
        for rid, found in rounds.items()
        if found["kind"] == "fallback"
        for e in timelines.get(rid, {}).get("events", [])
        if e["kind"] == "outcome"
    ]
    return [
        f"{inst}: a fallback succeeded at {datetime.fromtimestamp(at, UTC):%H:%M:%S} (controller log), but the "
        f"controller's round history holds no fallback round of {inst} ending then"
        for inst, at in succeeded
        if not any(i == inst and abs(end - at) <= 2 for i, end in finished)
    ]


def round_facts(timeline: dict[str, Any]) -> dict[str, Any]:
    """What the summary shows of a round's timeline: failed fallback attempts, a hardware match, its error."""
    events = timeline.get("events", [])
    decided: dict[str, Any] = next((e for e in events if e["kind"] == "decided"), {})
    failed = [e.get("error") for e in events if e["kind"] == "failed"]
    return {
        "fallback_attempts_failed": sum(1 for e in events if e["kind"] == "fallback_failed"),
        "hardware_matched": bool(decided.get("hardware_matched")),
        "error": failed[0] if failed else None,
    }


def health_rows_bound(nodes: list[str], lifetime_sec: float) -> dict[str, int]:
    """What the write policy stores for the simulated cards of ``nodes`` over ``lifetime_sec``: every health
    collection the agents make (one per ``health_interval_seconds``, counters from the simulated profiles)
    replayed through :func:`decide_write`; the bound adds one row per card for a collection at a boundary.
    ``beats`` is what one row per heartbeat would have written."""
    agent, storage = AgentSettings(), HealthStorageSettings()
    keepalive = timedelta(seconds=storage.keepalive_seconds)
    collections = int(lifetime_sec // agent.health_interval_seconds) + 1
    expected = 0
    for node in nodes:
        clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
        collector = SimulatedCollector(clock=clock, count=CARDS_PER_NODE, seed=node, speed=agent.simulate_speed)
        latest: dict[int, StoredSample] = {}
        for _ in range(collections):
            for gpu in collector.read_health().gpus:
                key = CardKey(node_id=NodeId(node), gpu_index=gpu.index, source="simulated")
                reading = HealthReading(key=key, uuid=gpu.uuid, sampled_at=clock.now(), counters=gpu.counters)
                if decide_write(reading, latest.get(gpu.index), keepalive=keepalive) is not None:
                    expected += 1
                    latest[gpu.index] = StoredSample(key, reading.uuid, reading.sampled_at, reading.counters)
            clock.advance(agent.health_interval_seconds)
    cards = len(nodes) * CARDS_PER_NODE
    return {
        "collections": collections,
        "expected": expected,
        "bound": expected + cards,
        "beats": cards * (int(lifetime_sec // agent.heartbeat_interval_seconds) + 1),
        "metrics_bound": cards * (int(lifetime_sec // 60) + 2),
    }


def count_rows(database_url: str) -> dict[str, int]:
    path = database_url.removeprefix("sqlite:///")
    tables = ("gpu_health_samples", "gpu_metrics_minutes", "gpu_xid_events", "nodes")
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        return {table: int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]) for table in tables}


def rss_mib(pid: int) -> float | None:
    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024
    return None


def long_lived_rss(processes: list[tuple[str, int]]) -> dict[str, float]:
    """MiB resident of the long-lived processes among (name, pid): server, controller, Coordinator, NodeManagers."""
    found = {}
    for name, pid in processes:
        if name.split(":")[0] in LONG_LIVED and (value := rss_mib(pid)) is not None:
            found[name] = round(value, 1)
    return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def phase_figures(records: list[RequestRecord], seconds: float) -> dict[str, float]:
    ok = [r.ended - r.started for r in records if r.ok]
    return {
        "requests": len(records),
        "per_sec": round(len(records) / seconds, 2) if seconds > 0 else float("nan"),
        "success_rate": round(len(ok) / len(records), 4) if records else float("nan"),
        "p50_ms": round(percentile(ok, 0.5) * 1000, 1),
        "p95_ms": round(percentile(ok, 0.95) * 1000, 1),
    }


@dataclass(frozen=True)
class Observed:
    """What the run collected, for :func:`judge`."""

    records: list[RequestRecord]
    rounds: dict[str, dict[str, Any]]
    """Round summaries by request id (``GET …/rounds``)."""
    timelines: dict[str, dict[str, Any]]
    """Round timelines by request id (``GET …/rounds/{request_id}``)."""
    restorations: list[tuple[str, list[int], float, float]]
    """(instance, ranks that left ``dead_committed``, last sample with them, first sample without them)."""
    log_dir: Path
    """The cluster's logs: the Coordinator's (views, every request's endpoint) and the controller's."""
    windows: dict[str, tuple[float, float]]
    """Phase name → (start, end) in epoch seconds, for the baseline comparison."""
    rows: dict[str, int]
    lifetime_sec: float
    sim_nodes: list[str]
    rss_start: dict[str, float]
    rss_end: dict[str, float]


def judge(report: Report, seen: Observed) -> None:
    """Invariants 1-5 over everything collected (appended to ``report.violations``), and the report's figures."""
    violations = report.violations
    # invariant 1: every rank that left dead_committed did so with a fallback that succeeded (the controller's log)
    fallbacks = [
        (e["instance_id"], timestamp(e["timestamp"]))
        for e in log_events(seen.log_dir / "controller.log", "controller.fallback_succeeded")
    ]
    for inst, ranks, last_seen, first_gone in seen.restorations:
        if not any(i == inst and last_seen - 1 <= at <= first_gone + 5 for i, at in fallbacks):
            violations.append(Violation(1, first_gone, f"{inst}: ranks {ranks} left dead_committed with no fallback"))
    # invariant 2: from the Coordinator's own log
    logs = coordinator_log(seen.log_dir / "coordinator.log")
    starts = {r.request_id: r.started for r in seen.records}
    attempts = [
        (e["request_id"], e["instance"], int(e["endpoint"]), starts[e["request_id"]], timestamp(e["timestamp"]))
        for name in ("forwarded", "stream_finished", "upstream_failed")
        for e in logs[name]
        if e.get("request_id") in starts and "endpoint" in e
    ]
    changes = publication_changes(logs["view_changed"])
    violations.extend(Violation(2, time.time(), text) for text in routed_while_withdrawn(attempts, changes))
    coordinator_dels = {e.get("request_id"): e for e in logs["view_changed"] if e.get("op") == "DEL"}
    lags = []
    for timeline in seen.timelines.values():
        for event in (e for e in timeline["events"] if e["kind"] == "coordinator_del"):
            applied = coordinator_dels.get(timeline["request_id"])
            if applied is None:
                text = f"round {timeline['request_id']}: a DEL in its timeline, none in the Coordinator's log"
                violations.append(Violation(2, time.time(), text))
            else:
                lags.append(timestamp(applied["timestamp"]) - timestamp(event["at"]))
    # invariant 3
    report.timelines = seen.timelines
    report.rounds = [
        {**found, **round_facts(seen.timelines.get(rid, {}))}
        for rid, found in sorted(seen.rounds.items(), key=lambda kv: kv[1]["started_at"])
    ]
    violations.extend(Violation(3, time.time(), text) for text in check_rounds(list(seen.rounds.values())))
    shared = round_ids_shared(logs["view_changed"])
    for text in missing_fallbacks(fallbacks, seen.rounds, seen.timelines):
        where = "; ".join(f"round id {rid} used by {', '.join(insts)} (the Coordinator's log)" for rid, insts in shared)
        violations.append(Violation(3, time.time(), f"{text}{f' — {where}' if where else ''}"))
    # invariant 4
    rows = seen.rows
    bound = health_rows_bound(seen.sim_nodes, seen.lifetime_sec)
    report.database = {"rows": rows, **bound, "lifetime_sec": round(seen.lifetime_sec, 1)}
    if rows["gpu_health_samples"] > bound["bound"]:
        violations.append(
            Violation(4, time.time(), f"gpu_health_samples {rows['gpu_health_samples']} > {bound['bound']}")
        )
    if rows["gpu_metrics_minutes"] > bound["metrics_bound"]:  # not a write rule of the health spec: shown, not judged
        report.notes.append(
            f"gpu_metrics_minutes holds {rows['gpu_metrics_minutes']} rows, more than one per card and minute "
            f"({bound['metrics_bound']})"
        )
    # invariant 5: memory (processes are checked at idle points and after the stop)
    for name, before in seen.rss_start.items():
        after = seen.rss_end.get(name, float("nan"))
        report.rss_mib[name] = {"start": before, "end": after}
        if after > before * RSS_RATIO + RSS_ALLOWANCE_MIB:
            violations.append(Violation(5, time.time(), f"{name} RSS {before} → {after} MiB"))
    # requests
    retried = {e["request_id"] for e in logs["upstream_failed"] if e.get("will_retry")}
    failures = Counter(
        f"HTTP {r.status}" if r.status not in (None, 200) else (r.error or "?").split(":")[0][:40]
        for r in seen.records
        if not r.ok
    )
    served = Counter(f"{e['instance']}/{e['endpoint']}" for e in logs["forwarded"] + logs["stream_finished"])
    report.requests = {
        "total": len(seen.records),
        "ok": sum(r.ok for r in seen.records),
        "failed": sum(not r.ok for r in seen.records),
        "retried": len(retried & set(starts)),
        "streaming": sum(r.stream for r in seen.records),
        "failures": dict(failures.most_common()),
        "served_by": dict(sorted(served.items())),
        "attempts_checked": len(attempts),
        "reselections_before_send": len(logs["withdrawn_before_send"]),
        "del_applied_after_timeline_ms": [round(x * 1000) for x in sorted(lags)],
    }
    for name, (low, high) in seen.windows.items():
        report.phases[name] = phase_figures([r for r in seen.records if low <= r.started < high], high - low)


# == report ======================================================================================================
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
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def table(header: list[str], rows: list[list[Any]]) -> Iterator[str]:
    yield "| " + " | ".join(header) + " |"
    yield "|" + "---|" * len(header)
    for row in rows:
        yield "| " + " | ".join(str(x) for x in row) + " |"


def summary(report: Report) -> str:
    lines = [f"machine: {json.dumps(report.machine)}", f"options: {json.dumps(report.options)}", ""]
    kinds = Counter((f.kind, f.variant or "", "failed to inject" if f.error else "injected") for f in report.faults)
    lines += ["faults injected", *table(["kind", "variant", "", "count"], [[*k, n] for k, n in sorted(kinds.items())])]
    unanswered = [f for f in report.faults if f.reacted is False]
    lines += [f"unanswered faults (no round, the controller idle for 30 s): {len(unanswered)}"]
    lines += [f"- {time.strftime('%H:%M:%S', time.localtime(f.at))} {f.kind} {f.instance} rank {f.rank}: {f.what}"
              for f in unanswered]  # fmt: skip
    outcomes = Counter((r["kind"], r["outcome"], r["hardware_matched"]) for r in report.rounds)
    failed_attempts = sum(r["fallback_attempts_failed"] for r in report.rounds)
    lines += ["", f"rounds by outcome ({len(report.rounds)} rounds; failed fallback attempts: {failed_attempts})"]
    lines += table(
        ["kind", "outcome", "hardware matched", "count"], [[*k, n] for k, n in sorted(outcomes.items(), key=str)]
    )
    lines += [f"- {r['request_id']} {r['kind']} {r['outcome']}: {r['error']}" for r in report.rounds if r["error"]]
    req = report.requests
    lines += ["", "requests", *table(
        ["total", "ok", "failed", "retried", "streaming", "attempts checked (inv. 2)", "reselected before send"],
        [[req["total"], req["ok"], req["failed"], req["retried"], req["streaming"], req["attempts_checked"],
          req["reselections_before_send"]]],
    )]  # fmt: skip
    lines += [f"failures: {json.dumps(req['failures'])}", f"served by: {json.dumps(req['served_by'])}"]
    lines += [f"Coordinator DEL applied after the timeline's DEL (ms): {req['del_applied_after_timeline_ms']}"]
    base, faults = report.phases.get("baseline", {}), report.phases.get("faults", {})
    rows = [[name, *figures.values()] for name, figures in report.phases.items()]
    if base and faults:
        rows.append([
            "faults / baseline", "", round(faults["per_sec"] / base["per_sec"], 2),
            round(faults["success_rate"] / base["success_rate"], 3) if base["success_rate"] else "n/a",
            round(faults["p50_ms"] / base["p50_ms"], 2), round(faults["p95_ms"] / base["p95_ms"], 2),
        ])  # fmt: skip
    lines += ["", "baseline (fault-free) against the fault phase, by request start"]
    lines += table(["phase", "requests", "per s", "success rate", "p50 ms (ok)", "p95 ms (ok)"], rows)
    db = report.database
    lines += ["", f"platform database after {db['lifetime_sec']} s ({db['collections']} health collections per card)"]
    lines += table(["table", "rows", "bound", "one row per heartbeat would be"], [
        ["gpu_health_samples", db["rows"]["gpu_health_samples"], f"{db['bound']} (policy replay {db['expected']})",
         db["beats"]],
        ["gpu_metrics_minutes (not judged)", db["rows"]["gpu_metrics_minutes"],
         f"{db['metrics_bound']} (one per card and minute)", db["beats"]],
        ["gpu_xid_events", db["rows"]["gpu_xid_events"], "the XIDs sent", ""],
    ])  # fmt: skip
    lines += ["", f"RSS MiB (bound: end ≤ {RSS_RATIO} x start + {RSS_ALLOWANCE_MIB:.0f})"]
    lines += table(["process", "start", "end"], [[k, v["start"], v["end"]] for k, v in report.rss_mib.items()])
    lines += ["", f"processes with the cluster marker: {json.dumps(report.processes)}"]
    lines += [f"notes: {note}" for note in report.notes]
    by_invariant = Counter(v.invariant for v in report.violations)
    lines += ["", "invariant violations", *table(
        ["1 committed stays out", "2 no routing after withdrawal", "3 rounds end", "4 database bounded",
         "5 no leaks"],
        [[by_invariant[i] for i in range(1, 6)]],
    )]  # fmt: skip
    lines += [f"- invariant {v.invariant}: {v.text}" for v in report.violations]
    return "\n".join(lines)
