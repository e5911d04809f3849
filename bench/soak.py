"""Soak: the local cluster under random faults for a bounded time, with the serving invariants checked
throughout. Everything on real processes (a local cluster, simulated engines with torch workers).

One cluster (``--instances`` x DP 4 over 2 pods) serves steady client traffic through the Coordinator: a few
concurrent clients, half of them streaming, completions and chat completions. Each request carries its own
``x-request-id``; the Coordinator's debug log names the endpoint that served it (``coordinator.forwarded``,
``coordinator.stream_finished``) and every attempt that failed (``coordinator.upstream_failed``), so every
request is known by endpoint, start and end time, outcome and retry.

After a fault-free baseline (``--baseline-sec``), faults come at random intervals for ``--duration-sec``, drawn
from a shuffled bag so that every kind comes once per cycle:

    kill       a random live rank's worker dies, or its whole engine is SIGKILLed  → a scale-down round
    hang       a random live rank's worker is SIGSTOPped: peers time out, it stays healthy → the collection
               timeout → whole-instance reconfiguration. When the hung rank hosts the DP group's TCP store,
               every other rank blocks in a store call instead (they do not time out on a stopped host) and
               nothing is reported: the bench resumes the worker after 30 s and lists the fault as unanswered
               (``--spare-store-master`` hangs other ranks only)
    transient  every rank's collective fails, nobody dies → fast recovery (``retry``)
    hardware   a card fault through ``--via controller|mindcluster|gpu-health`` (at random): followed by the
               death of the rank (hardware first, matched → a scale-down round), alone (no software evidence
               within the correlation window → reconfiguration), on a committed rank (handled, nothing
               repeated) or on a card name the controller cannot map (the original strategy → reconfiguration)

A fault that nothing answers within 30 s (no round starts, the controller stays idle) is listed as unanswered.
Before each fault the bench waits (bounded) until the controller is idle: every instance NORMAL or
SCALED_DOWN_RUNNING with nothing running, serving and published exactly its live ranks, no hardware fault
pending. No rank is ever restored by hand: the design restores them itself. After two committed rounds the
survivors hold just enough expert slots (4 experts + 4 redundant replicas, 2 slots per rank), so the next kill
fails the round in the engines and the frozen fallback (InstanceReconfiguration) relaunches every rank; a hang,
an unmatched hardware fault or an unmappable one relaunches them too. Pods whose ranks are all committed are
stopped (``enable_dp_scale_up``) and come back with the next rebuild.

Invariants, checked while the run goes (a status sampler, 2 Hz) and over the logs at the end; any violation makes
the exit status 1:

    1  a committed rank never serves again unless a fallback restored it: the controller never publishes a
       rank of ``dead_committed``; the Coordinator never publishes one that was committed both before and after
       (same generation); a rank leaves ``dead_committed`` only with a fallback round that succeeded
    2  no request is routed to a withdrawn endpoint after its withdrawal: every attempt's endpoint was published
       by the Coordinator at the request's start, or published again before the attempt's log line (the
       Coordinator's ``coordinator.view_changed`` lines, logged once the swap is done; each round timeline's DEL
       is matched with the Coordinator's by request id)
    3  every round ends committed, succeeded or deduplicated, or failed and followed by a fallback that
       succeeded; none runs past its deadline
    4  the platform database stays within the write rules: ``gpu_health_samples`` ≤ what the write policy
       (``heteroflow.health.write_policy``) keeps for the simulated cards over the cluster's lifetime, replayed
       collection by collection, plus one row per card (``gpu_metrics_minutes`` is shown against one row per
       card and minute, not judged: no write rule of the spec covers it)
    5  no process leaks: at every idle point no more processes carry the cluster's marker than when it first
       served, and none after the stop; the RSS of the server, controller, Coordinator and NodeManagers at the
       end ≤ 1.5 x the start + 32 MiB

Timing only (no behaviour of the spec depends on it): the acceptance suite's periodic SET every 2 s and 3 s
collective timeout, a 10 s collection timeout instead of 60 s (a hang is decided within seconds), GPU-health
faults standing 15 s instead of 300 s (the same card can fail again within a run). Fast recovery and scale-up
are on: they are the paths the design offers besides scale-down and the fallbacks.

Usage::

    .venv/bin/python bench/soak.py [--duration-sec 600] [--seed 1] [--instances 2] [--baseline-sec 60]
                                   [--clients 4] [--spare-store-master] [--data-dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from heteroflow.http.tls import client_tls

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the acceptance harness

from tests.acceptance.harness import COLLECTIVE_TIMEOUT_SEC, TIMINGS, timestamp
from tests.support.polling import until

from bench.soak_report import (
    Fault,
    Observed,
    Report,
    RequestRecord,
    Violation,
    count_rows,
    judge,
    long_lived_rss,
    machine,
    summary,
)
from heteroflow.local import ClusterOptions, ClusterState, LocalCluster
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.faults import FaultError, KillMode, hang, kill, transient
from heteroflow.local.hardware import HardwareVia, card_of
from heteroflow.local.hardware import inject as inject_hardware
from heteroflow.local.plan import node_name
from heteroflow.local.processes import marked_processes
from heteroflow.local.state import InstanceState
from heteroflow.serving.node_manager.spec import endpoint_url

KINDS = ("kill", "hang", "transient", "hardware")
HARDWARE_VARIANTS = ("with-death", "alone", "committed", "unmappable")
UNMAPPABLE_CARD = "slot 4 / left"
"""A card name in no format the controller reads: the fault cannot be mapped to ranks (F-3, A14)."""
FT_CONFIG: dict[str, Any] = {
    **TIMINGS,
    "enable_fast_recovery": True,
    "enable_dp_scale_up": True,
    "software_fault_collection_timeout_sec": 10.0,
}
GPU_HEALTH_HOLD_SEC = 15.0
EXTRA_ENV = {
    "HETEROFLOW_COORDINATOR_LOG_LEVEL": "debug",  # the endpoint of every request: coordinator.forwarded
    "HETEROFLOW_MONITOR_PLATFORM_FAULT_HOLD_SEC": str(GPU_HEALTH_HOLD_SEC),
}
ROUND_DEADLINE_SEC = {"scale_down": 90.0, "fast_recovery": 90.0, "fallback": 360.0}
"""A round running longer is stuck: two execution deadlines (2 x 30 s) plus margin; a fallback's relaunch may take
300 s (``fallbacks.READY_TIMEOUT_SEC``) plus its first retries."""
SAMPLE_PERIOD_SEC = 0.5
REACTION_WITHIN_SEC = 30.0
"""How long a fault may go unanswered (no round, the controller idle): a hang needs the collective timeout (3 s)
and the collection timeout (10 s); everything else reacts within seconds."""


@dataclass(frozen=True)
class SoakOptions:
    duration_sec: float = 600.0
    """Seconds of faults (after the baseline); the phase also lasts until every kind was injected once."""
    seed: int = 1
    instances: int = 2
    baseline_sec: float = 60.0
    """Fault-free traffic first: the baseline of success rate and latency."""
    clients: int = 4
    """Concurrent clients; every second one streams."""
    gap_sec: tuple[float, float] = (2.0, 8.0)
    """Random pause between the controller turning idle and the next fault."""
    idle_within_sec: float = 240.0
    """How long the controller may stay busy after a fault (a rebuild on two loaded cores takes 10-30 s)."""
    spare_store_master: bool = False
    """Hang only ranks that do not host the DP group's TCP store: a hung store host stalls every rank of the
    instance without any of them failing a collective, so nothing reports it (see ``--spare-store-master``)."""
    data_dir: Path | None = None


@dataclass
class Sample:
    """One status sample: the controller's view, the Coordinator's, the controller's again (epoch seconds)."""

    at: float
    entries: dict[str, dict[str, Any]]
    """The controller's entry per instance (read after the Coordinator's view)."""
    before: dict[str, dict[str, Any]]
    """The controller's entry per instance read before the Coordinator's view."""
    published: dict[str, list[int] | None]
    """What the Coordinator publishes per instance."""


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# == traffic =====================================================================================================
class Traffic:
    """``clients`` threads sending completions through the Coordinator, each request recorded."""

    def __init__(self, state: ClusterState, *, clients: int, seed: int) -> None:
        self.state = state
        self.records: list[RequestRecord] = []
        self.stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(n, random.Random(seed * 1000 + n)), daemon=True, name=f"c{n}")
            for n in range(clients)
        ]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        until(lambda: any(r.ok for r in self.records), within=60, what="a first completion")
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=180)

    def _run(self, n: int, rng: random.Random) -> None:
        stream, chat = n % 2 == 1, n % 4 >= 2
        route = "/v1/chat/completions" if chat else "/v1/completions"
        model = self.state.instances[0].model
        headers = {"Authorization": f"Bearer {self.state.api_key or self.state.admin_token}"}
        with httpx.Client(
            base_url=self.state.coordinator_url, headers=headers, timeout=120, trust_env=False, verify=client_tls()
        ) as http:
            for i in itertools.count():
                if self.stop.is_set():
                    return
                prompt = f"soak client {n} request {i}"
                body: dict[str, Any] = {"model": model, "max_tokens": rng.randint(4, 16), "stream": stream}
                body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
                record = RequestRecord(f"soak-{n}-{i}", route, stream, started=time.time())
                try:
                    self._send(http, record, body)
                except (httpx.HTTPError, ValueError) as exc:  # ValueError: a 200 whose body is not JSON
                    record.error = f"{type(exc).__name__}: {exc}"[:200]
                record.ended = time.time()
                self.records.append(record)
                self.stop.wait(rng.uniform(0.0, 0.1))  # a user's think time, not a synchronisation

    @staticmethod
    def _send(http: httpx.Client, record: RequestRecord, body: dict[str, Any]) -> None:
        headers = {"x-request-id": record.request_id}
        if not record.stream:
            response = http.post(record.route, json=body, headers=headers)
            record.status = response.status_code
            record.ok = response.status_code == 200 and bool(response.json().get("choices"))
            if not record.ok:
                record.error = response.text[:200]
            return
        with http.stream("POST", record.route, json=body, headers=headers) as response:
            record.status = response.status_code
            if response.status_code != 200:
                record.error = response.read().decode(errors="replace")[:200]
                return
            done = False
            for line in response.iter_lines():
                if line.startswith("data: ") and '"error"' in line:
                    record.error = f"stream error event: {line[6:200]}"
                done = done or line == "data: [DONE]"
            record.ok = done and record.error is None


# == the observer: status samples, rounds, processes =============================================================
class Observer:
    """Samples the controller's status and the Coordinator's view at 2 Hz, keeps every round's summary and
    timeline, and checks invariants 1, 3 and 5 as it goes (violations appended to ``violations``)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.state = cluster.state
        self.instances = [inst.instance_id for inst in self.state.instances]
        self.samples: list[Sample] = []
        self.rounds: dict[str, dict[str, Any]] = {}
        self.timelines: dict[str, dict[str, Any]] = {}
        self.violations: list[Violation] = []
        self.restorations: list[tuple[str, list[int], float, float]] = []
        """(instance, ranks, last sample with them committed, first sample without them)."""
        self.process_counts: list[tuple[float, int]] = []
        self.processes_at_start = len(marked_processes(cluster.cluster_id))
        self.exited: list[tuple[str, int]] = []
        self.stop = threading.Event()
        self._stuck: set[str] = set()
        self._thread = threading.Thread(target=self._run, daemon=True, name="observer")

    def __enter__(self) -> Observer:
        self._thread.start()
        until(lambda: self.samples, within=30, what="a first status sample")
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self._thread.join(timeout=60)

    @property
    def latest(self) -> Sample:
        return self.samples[-1]

    def violate(self, invariant: int, text: str) -> None:
        if not any(v.invariant == invariant and v.text == text for v in self.violations[-50:]):
            self.violations.append(Violation(invariant, time.time(), text))
            log(f"VIOLATION of invariant {invariant}: {text}")

    def _run(self) -> None:
        with ClusterClient(self.state, timeout_sec=10) as client:
            while not self.stop.is_set():
                try:
                    self._sample(client)
                    self._poll_rounds(client)
                except ClusterUnreachableError as exc:
                    log(f"observer: {exc}")
                except Exception as exc:  # the sampler must outlive any surprise; it is reported, not fatal
                    log(f"observer failed once: {type(exc).__name__}: {exc}")
                self.exited = self.cluster.exited()
                self.stop.wait(SAMPLE_PERIOD_SEC)

    def _sample(self, client: ClusterClient) -> None:
        before = {e["instance_id"]: e for e in client.controller_status()}
        published = {inst: client.published(inst) for inst in self.instances}
        entries = {e["instance_id"]: e for e in client.controller_status()}
        sample = Sample(time.time(), entries, before, published)
        previous = self.samples[-1] if self.samples else None
        self.samples.append(sample)
        for inst, entry in entries.items():
            dead = set(entry["dead_committed"])
            if wrong := sorted(dead & set(entry["published_endpoints"])):
                self.violate(1, f"{inst}: the controller publishes committed ranks {wrong}")
            was = before.get(inst)
            served = set(published.get(inst) or [])
            if was is not None and was["generation"] == entry["generation"]:
                stably = dead & set(was["dead_committed"]) & served
                if stably:
                    self.violate(1, f"{inst}: the Coordinator publishes committed ranks {sorted(stably)}")
            if previous is not None and inst in previous.entries:
                gone = sorted(set(previous.entries[inst]["dead_committed"]) - dead)
                if gone:
                    self.restorations.append((inst, gone, previous.at, sample.at))
        for request_id, found in list(self.rounds.items()):
            age = time.time() - timestamp(found["started_at"])
            if found["outcome"] is None and age > ROUND_DEADLINE_SEC[found["kind"]] and request_id not in self._stuck:
                self._stuck.add(request_id)
                self.violate(3, f"round {request_id} ({found['kind']}) still running after {age:.0f} s")

    def _poll_rounds(self, client: ClusterClient) -> None:
        for inst in self.instances:
            for found in client.rounds(inst):
                self.rounds[found["request_id"]] = found
                if found["outcome"] is not None and found["request_id"] not in self.timelines:
                    self.timelines[found["request_id"]] = client.round(found["request_id"])

    def fetch_all_timelines(self) -> None:
        with ClusterClient(self.state, timeout_sec=10) as client:
            for request_id in self.rounds:
                with contextlib.suppress(ClusterUnreachableError):
                    self.timelines[request_id] = client.round(request_id)

    # -- idle --------------------------------------------------------------------------------------------
    def busy_reason(self, sample: Sample | None = None) -> str | None:
        """Why the controller is not idle now (``None``: idle, every instance serving its live ranks)."""
        sample = sample or self.latest
        if time.time() - sample.at > 5:
            return "no recent status sample"
        for inst in self.instances:
            entry = sample.entries.get(inst)
            if entry is None:
                return f"{inst}: not assembled"
            live = sorted(set(entry["original_dp_ranks"]) - set(entry["dead_committed"]))
            statuses = entry.get("engine_statuses") or {}
            if entry["phase"] not in ("NORMAL", "SCALED_DOWN_RUNNING") or entry["running_strategy"] is not None:
                return f"{inst}: {entry['phase']} running {entry['running_strategy']}"
            if not entry["can_serve"] or entry["published_endpoints"] != live or sample.published.get(inst) != live:
                return f"{inst}: published {sample.published.get(inst)}, live {live}"
            if any(statuses.get(str(r), statuses.get(r, "healthy")) != "healthy" for r in live):
                return f"{inst}: engine statuses {statuses}"
            if any(f.get("pending") for f in entry.get("hardware_faults", [])):
                return f"{inst}: a hardware fault pending"
        return None

    def wait_idle(self, *, within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and not self.exited:
            if self.busy_reason() is None:
                self.count_processes()
                return True
            time.sleep(0.2)  # the polling period of this wait, bounded by the deadline above
        return False

    def count_processes(self) -> None:
        count = len(marked_processes(self.cluster.cluster_id))
        self.process_counts.append((time.time(), count))
        if count > self.processes_at_start:
            self.violate(5, f"{count} processes carry the marker at an idle point (at start {self.processes_at_start})")

    def reacted(self, since: float, *, within: float) -> bool:
        """Whether a round started, or the controller left idle, after ``since`` (waits up to ``within``)."""

        def check() -> bool:
            started = any(timestamp(s["started_at"]) >= since - 0.5 for s in list(self.rounds.values()))
            return started or self.busy_reason() is not None

        with contextlib.suppress(TimeoutError):
            return until(check, within=within, what="a reaction", period=0.2)
        return False


# == faults ======================================================================================================
@dataclass
class Injector:
    """Draws and injects the faults; remembers what to clear once the controller is idle again."""

    state: ClusterState
    observer: Observer
    rng: random.Random
    spare_store_master: bool = False
    bag: list[str] = field(default_factory=list)
    to_clear: list[Callable[[ClusterClient], object]] = field(default_factory=list)
    gpu_health_last: dict[str, float] = field(default_factory=dict)
    """Card uuid → when a GPU-health fault was last sent for it (one stands ``GPU_HEALTH_HOLD_SEC``)."""

    def next_kind(self) -> str:
        if not self.bag:
            self.bag = list(KINDS)
            self.rng.shuffle(self.bag)
        return self.bag.pop()

    def inject(self, kind: str) -> Fault:
        entries = self.observer.latest.entries
        instance = self.rng.choice(sorted(entries))
        entry = entries[instance]
        dead = sorted(entry["dead_committed"])
        live = sorted(set(entry["original_dp_ranks"]) - set(dead))
        rank = self.rng.choice(live)
        inst = self.state.instance(instance)
        fault = Fault(at=time.time(), kind=kind, instance=instance, rank=rank)
        with ClusterClient(self.state, timeout_sec=10) as client:
            try:
                if kind == "kill":
                    mode = self.rng.choice([KillMode.WORKER, KillMode.PROCESS])
                    fault.variant = mode.value
                    fault.what = kill(client, inst, rank, mode=mode)
                elif kind == "hang":
                    if self.spare_store_master:
                        fault.rank = rank = self._spare_master(client, inst, rank, sorted(set(live) - {rank}))
                    fault.what = hang(client, inst, rank)
                elif kind == "transient":
                    fault.what = transient(client, inst, rank)
                else:
                    self._hardware(client, fault, dead)
            except (FaultError, ClusterUnreachableError) as exc:
                fault.error = str(exc)[:300]
        return fault

    def _spare_master(self, client: ClusterClient, inst: InstanceState, rank: int, others: list[int]) -> int:
        """``rank``, or another live rank when ``rank`` hosts the instance's TCP store (its ``/sim/info``)."""
        endpoint = inst.endpoint(rank)
        master = client.engine_info(endpoint_url(endpoint.ip, endpoint.port)).get("store_master")
        return self.rng.choice(others) if rank == master and others else rank

    def _hardware(self, client: ClusterClient, fault: Fault, dead: list[int]) -> None:
        inst = self.state.instance(fault.instance)
        variant = self.rng.choice(HARDWARE_VARIANTS)
        if variant == "committed" and not dead:
            variant = "with-death"
        via = HardwareVia.CONTROLLER if variant == "unmappable" else self.rng.choice(list(HardwareVia))
        if variant == "committed":
            fault.rank = self.rng.choice(dead)
        uuid = card_of(inst, fault.rank).uuid
        if via == HardwareVia.GPU_HEALTH and time.time() - self.gpu_health_last.get(uuid, 0) < GPU_HEALTH_HOLD_SEC + 5:
            via = HardwareVia.MINDCLUSTER  # the card's earlier fault may still stand: it would not be new
        fault.variant = f"{via.value}/{variant}"
        card = UNMAPPABLE_CARD if variant == "unmappable" else None
        if via == HardwareVia.GPU_HEALTH:
            self.gpu_health_last[uuid] = time.time()
        elif via in (HardwareVia.CONTROLLER, HardwareVia.MINDCLUSTER):
            rank = fault.rank
            self.to_clear.append(lambda c: inject_hardware(c, inst, rank, via=via, card=card, cleared=True))
        fault.what = inject_hardware(client, inst, fault.rank, via=via, card=card)
        if variant == "with-death":  # within the correlation window: the rank dies of it
            fault.what += "; then " + kill(client, inst, fault.rank, mode=KillMode.WORKER)

    def resume_later(self, fault: Fault) -> None:
        """A hang nobody reacted to is resumed once the controller is idle (a rebuild kills the worker instead)."""
        inst, rank = self.state.instance(fault.instance), fault.rank
        self.to_clear.append(lambda c: hang(c, inst, rank, resume=True))

    def clear(self) -> list[str]:
        errors = []
        with ClusterClient(self.state, timeout_sec=10) as client:
            for undo in self.to_clear:
                try:
                    undo(client)
                except (FaultError, ClusterUnreachableError) as exc:
                    errors.append(str(exc)[:200])
        self.to_clear.clear()
        return errors


def expects_reaction(fault: Fault) -> bool:
    return fault.error is None and not (fault.variant or "").endswith("/committed")


# == the run =====================================================================================================
def start_cluster(options: SoakOptions, data_dir: Path) -> LocalCluster:
    config = data_dir / "operator.yaml"
    config.write_text(yaml.safe_dump({"fault_tolerance_config": FT_CONFIG}))
    cluster = LocalCluster(
        ClusterOptions(
            data_dir=data_dir / "local",
            instances=options.instances,
            server_port=0,
            controller_port=0,
            coordinator_port=0,
            controller_config=config,
            collective_timeout_sec=COLLECTIVE_TIMEOUT_SEC,
            extra_env=EXTRA_ENV,
        )
    )
    cluster.start()
    try:
        cluster.wait_ready(timeout_sec=300 * options.instances)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def run_soak(options: SoakOptions) -> Report:
    """Start a cluster, run the baseline and the faults, check every invariant, stop it; the report."""
    data_dir = options.data_dir or Path(tempfile.mkdtemp(prefix="heteroflow-bench-soak-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    report = Report(options={**asdict(options), "data_dir": str(data_dir)}, machine=machine())
    rng = random.Random(options.seed)
    log(f"data and logs under {data_dir}; starting {options.instances} instance(s) x DP 4")
    started = time.time()
    cluster = start_cluster(options, data_dir)
    log(f"serving after {time.time() - started:.0f} s")
    stop_report = None
    try:
        with Observer(cluster) as observer, Traffic(cluster.state, clients=options.clients, seed=options.seed) as load:
            baseline_start = time.time()
            time.sleep(options.baseline_sec)  # the fault-free baseline: traffic only, nothing to wait for
            rss_start = long_lived_rss([(p.name, p.pid) for p in cluster.processes])
            faults_start = time.time()
            injector = Injector(cluster.state, observer, rng, spare_store_master=options.spare_store_master)
            run_faults(options, observer, injector, report, until_sec=faults_start + options.duration_sec)
            faults_end = time.time()
            settle(options, observer, injector, report)
            load.stop.set()
        rss_end = long_lived_rss([(p.name, p.pid) for p in cluster.processes])
        lifetime = time.time() - started
        rows = count_rows(cluster.state.database_url)
        observer.fetch_all_timelines()
    finally:
        stop_report = cluster.stop()
    left_after = marked_processes(cluster.cluster_id)
    report.violations += observer.violations
    seen = Observed(
        records=load.records,
        rounds=observer.rounds,
        timelines=observer.timelines,
        restorations=observer.restorations,
        log_dir=Path(cluster.state.log_dir),
        windows={"baseline": (baseline_start, faults_start), "faults": (faults_start, faults_end)},
        rows=rows,
        lifetime_sec=lifetime,
        sim_nodes=[node_name(n) for n in range(cluster.options.sim_nodes)],
        rss_start=rss_start,
        rss_end=rss_end,
    )
    judge(report, seen)
    report.processes = {
        "at_start": observer.processes_at_start,
        "max_at_idle": max((c for _, c in observer.process_counts), default=0),
        "idle_points": len(observer.process_counts),
        "killed_at_stop": list(stop_report.killed),
        "swept_at_stop": list(stop_report.swept),
        "left_after_stop": list(stop_report.left) or left_after,
    }
    if report.processes["left_after_stop"]:
        report.violations.append(Violation(5, time.time(), f"left after stop: {report.processes['left_after_stop']}"))
    report.machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def settle(options: SoakOptions, observer: Observer, injector: Injector, report: Report) -> bool:
    """Idle, every fault cleared (a hang resumed), and idle again after whatever the clearing started; ``False``
    (and a violation of invariant 3) when the controller stays busy."""
    for _ in range(2):
        if not observer.wait_idle(within=options.idle_within_sec):
            observer.violate(3, f"not idle within {options.idle_within_sec:.0f} s: {observer.busy_reason()}")
            return False
        if not injector.to_clear:
            return True
        cleared_at = time.time()
        report.notes += [f"clearing: {e}" for e in injector.clear()]
        observer.reacted(cleared_at, within=5)  # a resumed hang fails its collective at once: a fast recovery
    return True


def run_faults(
    options: SoakOptions, observer: Observer, injector: Injector, report: Report, *, until_sec: float
) -> None:
    injected: Counter[str] = Counter()
    give_up = until_sec + 300  # every kind at least once, unless injecting one keeps failing
    while time.time() < until_sec or (time.time() < give_up and any(injected[k] == 0 for k in KINDS)):
        if observer.exited:
            observer.violate(5, f"processes of the cluster exited: {observer.exited}")
            return
        if not settle(options, observer, injector, report):
            return
        time.sleep(injector.rng.uniform(*options.gap_sec))  # the random interval between faults
        if observer.busy_reason() is not None:
            continue
        fault = injector.inject(injector.next_kind())
        report.faults.append(fault)
        injected[fault.kind] += fault.error is None
        log(
            f"fault {len(report.faults)}: {fault.kind} {fault.variant or ''} {fault.instance} rank {fault.rank}: "
            f"{fault.error or fault.what}"
        )
        if expects_reaction(fault):
            fault.reacted = observer.reacted(fault.at, within=REACTION_WITHIN_SEC)
            if not fault.reacted:
                log("  no round started and the controller stayed idle")
                if fault.kind == "hang":
                    injector.resume_later(fault)
        else:
            time.sleep(2)  # a fault expected to change nothing: give the controller a moment to prove it


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration-sec", type=float, default=600.0, help="seconds of faults (default 600)")
    parser.add_argument("--seed", type=int, default=1, help="seed of every random choice (default 1)")
    parser.add_argument("--instances", type=int, default=2, help="instances of DP 4 (default 2)")
    parser.add_argument("--baseline-sec", type=float, default=60.0, help="fault-free traffic first (default 60)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients, every second one streams")
    parser.add_argument(
        "--spare-store-master", action="store_true", help="never hang the rank that hosts the DP group's TCP store"
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="where the cluster keeps data and logs")
    parser.add_argument("--json", type=Path, default=None, help="also write the report to this file")
    args = parser.parse_args()
    options = SoakOptions(
        duration_sec=args.duration_sec,
        seed=args.seed,
        instances=args.instances,
        baseline_sec=args.baseline_sec,
        clients=args.clients,
        spare_store_master=args.spare_store_master,
        data_dir=args.data_dir,
    )
    report = run_soak(options)
    print()
    print(summary(report))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    sys.exit(1 if report.violations else 0)


if __name__ == "__main__":
    main()
