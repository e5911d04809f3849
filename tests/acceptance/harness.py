"""What the acceptance suite drives: a running :class:`LocalCluster` (started by :func:`running_cluster`), user
traffic, and the observations the rows assert on. The evidence each row saves is :mod:`tests.acceptance.evidence`.

Why a harness of its own (and not the integration harness of ``tests/integration/serving``): these rows run on
real processes only — platform server, controller, Coordinator, NodeManagers, simulated engines with torch
workers — and observe them the way an operator would, over their HTTP routes, their logs and ``heteroflow
fault``. The one process-level action is A17's: the controller is killed and started again with the command
line the state file records and the environment it had.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from heteroflow.http.tls import client_tls
from heteroflow.local import ClusterOptions, ClusterState, LocalCluster
from heteroflow.local.client import ClusterAuth, ClusterClient, ClusterUnreachableError
from heteroflow.local.hardware import inject as inject_hardware
from heteroflow.local.processes import CLUSTER_ID_ENV, marked_processes, start_process
from heteroflow.local.state import InstanceState
from heteroflow.serving.node_manager.spec import endpoint_url
from tests.support.polling import until

INSTANCE = "inst-1"
PROMPTS = ("the quick brown fox", "hello world")
"""Greedy completions of these are taken when a cluster is ready and compared after every recovery: the
simulator's MoE computes them identically on any set of surviving ranks, so equality proves correct serving."""

TIMINGS: dict[str, Any] = {"serving_view_refresh_sec": 2.0, "fallback_max_attempts": 100}
"""Shared by every cluster: the periodic SET every 2 s instead of 10 s, so a rebuilt instance is published again
within seconds (the suite rebuilds ten times); and room for more whole-instance relaunches than the default 3 per
30 min, because one cluster serves several independent rows, each ending in a deliberate reconfiguration (the
bound itself is tested in tests/integration/serving/test_controller_paths.py). No row depends on either."""


COLLECTIVE_TIMEOUT_SEC = 3.0
"""Timing only, shared by every cluster: the engines' collective timeout is 3 s instead of 10 s (what the
integration tests' simulated clusters use), below the 5 s correlation window and collection timeout of these
rows. A survivor that only notices a lost peer by that timeout still reports within the window; no row injects
a hang, the one fault that waits for it on purpose."""


def describe(entry: dict[str, Any] | None) -> str:
    """The keys of a status entry that explain why a wait did not end (a timeout's message)."""
    if entry is None:
        return "unreachable"
    keys = (
        "phase",
        "dead_committed",
        "published_endpoints",
        "can_serve",
        "running_strategy",
        "fallback_strategy",
        "last_decision",
        "last_error",
        "request_id",
    )
    return json.dumps({key: entry.get(key) for key in keys}, default=str)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def timestamp(text: str) -> float:
    """An ISO time of a log line (``…Z``) or a timeline event (``…+00:00``) as seconds since the epoch."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def events(timeline: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in timeline.get("events", []) if e.get("kind") == kind]


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")


def log_events(log: Path, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of one process whose ``event`` is ``event`` (other lines are skipped)."""
    found = []
    with contextlib.suppress(OSError), log.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if f'"{event}"' not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    found.append(record)
    return found


# == traffic =====================================================================================================
@dataclass
class Traffic:
    """Completions through the Coordinator in a background thread, as a user would send them: survivors meet a
    dead peer only in a collective, and collectives run only while there is work (the RFC's idle row)."""

    state: ClusterState
    results: list[tuple[float, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with ClusterClient(self.state, timeout_sec=30) as client:
            while not self.stop.is_set():
                try:
                    client.completion("traffic keeps the ranks in their collectives")
                    self.results.append((time.monotonic(), True))
                except ClusterUnreachableError:
                    self.results.append((time.monotonic(), False))
                    self.stop.wait(0.05)  # an unavailable instance answers at once; do not spin on it

    def answered_since(self, since: float) -> int:
        return sum(1 for at, ok in self.results if ok and at > since)


@contextlib.contextmanager
def traffic(state: ClusterState) -> Iterator[Traffic]:
    load = Traffic(state)
    thread = threading.Thread(target=load.run, name="traffic", daemon=True)
    thread.start()
    try:
        until(lambda: load.answered_since(0), within=30, what="the first completion under traffic")
        yield load
    finally:
        load.stop.set()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the traffic thread did not stop"


# == the cluster under test ======================================================================================
@dataclass
class ClusterUnderTest:
    """One running local cluster shared by the rows of one test module, and what its rows need to drive it."""

    name: str
    cluster: LocalCluster
    state_file: Path
    evidence_root: Path
    baseline: list[str] = field(default_factory=list)
    """Greedy outputs of :data:`PROMPTS` on every rank, taken when the cluster first served."""
    controller_down: bool = False
    """Set while A17 has killed the controller on purpose: its exit is then not a failure of the cluster."""

    def check_alive(self) -> None:
        """Fail at once (with the end of its log) when a process of the cluster exited: a NodeManager that
        committed suicide or a crashed controller would otherwise show up only as a timeout."""
        for process in self.cluster.processes:
            code = process.exit_code()
            if code is not None and not (process.name == "controller" and self.controller_down):
                raise AssertionError(f"{process.name} exited with code {code}:\n{process.log_tail()}")

    @property
    def state(self) -> ClusterState:
        return self.cluster.state

    @property
    def inst(self) -> InstanceState:
        return self.state.instance(INSTANCE)

    def client(self, *, timeout_sec: float = 10.0) -> ClusterClient:
        return ClusterClient(self.state, timeout_sec=timeout_sec)

    def http(self, *, timeout_sec: float = 10.0) -> httpx.Client:
        """A plain client with each destination's credential, for the routes :class:`ClusterClient` lacks."""
        return httpx.Client(auth=ClusterAuth(self.state), timeout=timeout_sec, trust_env=False, verify=client_tls())

    # -- the controller's view ------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        """The instance's entry in ``GET /controller/fault_tolerance/status``; ``None`` while unreachable."""
        with self.client(timeout_sec=5) as client:
            try:
                return client.instance_status(INSTANCE)
            except ClusterUnreachableError:
                return None

    def wait(self, predicate: Callable[[dict[str, Any]], bool], *, within: float, what: str) -> dict[str, Any]:
        """Poll the status until ``predicate`` holds for the instance's entry; that entry."""

        seen: list[dict[str, Any] | None] = [None]

        def check() -> dict[str, Any] | None:
            self.check_alive()
            entry = seen[0] = self.status()
            return entry if entry is not None and predicate(entry) else None

        try:
            return until(check, within=within, what=what, period=0.1)
        except TimeoutError as timeout:
            raise TimeoutError(f"{timeout}; the controller's last entry: {describe(seen[0])}") from None

    def published(self) -> list[int] | None:
        with self.client(timeout_sec=5) as client:
            try:
                return client.published(INSTANCE)
            except ClusterUnreachableError:
                return None

    def serving(self, ranks: Sequence[int], *, dead: Sequence[int] = (), within: float = 90) -> dict[str, Any]:
        """Wait until the instance serves exactly ``ranks`` (controller and Coordinator agree) with ``dead``
        committed, in NORMAL (nothing committed) or SCALED_DOWN_RUNNING."""
        phase = "SCALED_DOWN_RUNNING" if dead else "NORMAL"
        seen: list[dict[str, Any] | None] = [None]

        def check() -> dict[str, Any] | None:
            self.check_alive()
            entry = seen[0] = self.status()
            if (
                entry is None
                or entry["phase"] != phase
                or entry["dead_committed"] != sorted(dead)
                or not entry["can_serve"]
                or entry["published_endpoints"] != sorted(ranks)
                or entry["running_strategy"] is not None
            ):
                return None
            return entry if self.published() == sorted(ranks) else None

        try:
            return until(check, within=within, what=f"{phase} serving {sorted(ranks)} with {sorted(dead)} committed")
        except TimeoutError as timeout:
            raise TimeoutError(f"{timeout}; the controller's last entry: {describe(seen[0])}") from None

    def standing_faults_cleared(self, *, within: float = 30) -> dict[str, Any]:
        """Wait until the controller lists no standing hardware fault (L5-L6 not cleared by its source): a later
        whole-instance relaunch starts every rank where it ran again."""
        return self.wait(
            lambda s: s["standing_hardware_faults"] == [], within=within, what="no standing hardware fault left"
        )

    def restore_full_size(self, *, within: float = 180) -> dict[str, Any]:
        """Bring a scaled-down instance back to its 4 ranks the way an operator-visible fault would: once no
        standing fault is left, an L4 fault (a contained error: it never stands) on the lowest serving rank is
        reported to the controller and never confirmed, so its window expires and the instance is reconfigured
        in place on every rank. Returns the entry serving 4 ranks."""
        self.standing_faults_cleared()
        entry = self.status()
        assert entry is not None
        rank = min(entry["published_endpoints"])
        with self.client() as client:
            said = inject_hardware(client, self.inst, rank, level=4)
        assert f"{INSTANCE} MAPPED [{rank}]" in said, said
        self.wait(lambda s: s["phase"] == "RECONFIGURING", within=60, what="the restoring reconfiguration")
        return self.serving([0, 1, 2, 3], within=within)

    def rounds(self) -> list[dict[str, Any]]:
        with self.client(timeout_sec=10) as client:
            return client.rounds(INSTANCE)

    def round(self, request_id: str) -> dict[str, Any]:
        with self.client(timeout_sec=10) as client:
            return client.round(request_id)

    # -- engines and NodeManagers -----------------------------------------------------------------------------------
    def engine_url(self, rank: int) -> str:
        endpoint = self.inst.endpoint(rank)
        return endpoint_url(endpoint.ip, endpoint.port)

    def sim_info(self, rank: int) -> dict[str, Any]:
        with self.client() as client:
            return client.engine_info(self.engine_url(rank))

    def engine_ft_status(self, rank: int) -> dict[str, Any]:
        """The engine's own ``GET /v1/fault_tolerance/status`` (read by the test as an observer)."""
        with self.http() as http:
            answer: dict[str, Any] = http.get(self.engine_url(rank) + "/v1/fault_tolerance/status").json()
        return answer

    def inject_sim(self, rank: int, kind: str, **extra: Any) -> dict[str, Any]:
        """The simulator's ``POST /sim/faults`` (for kinds ``heteroflow fault`` has no command for)."""
        with self.http() as http:
            response = http.post(self.engine_url(rank) + "/sim/faults", json={"kind": kind, **extra})
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    def node_manager_status(self, pod_id: str) -> dict[str, Any]:
        with self.client() as client:
            return client.node_manager_status(self.inst.pod(pod_id).node_manager_url)

    def engines(self) -> dict[int, dict[str, Any]]:
        """Every rank as its NodeManager sees it (``GET /node-manager/status``)."""
        found: dict[int, dict[str, Any]] = {}
        for pod in self.inst.pods:
            for endpoint in self.node_manager_status(pod.pod_id).get("endpoints", []):
                found[int(endpoint["endpoint_id"])] = endpoint
        return found

    def idle(self) -> bool:
        """No rank is stepping with its peers: a kill now is the RFC's idle row, not a fault under traffic."""
        return all(not self.sim_info(rank).get("in_wave") for rank in (e.id for e in self.inst.endpoints))

    def controller_events(self, event: str, *, since: float, **match: Any) -> list[dict[str, Any]]:
        """The controller's log lines of ``event`` logged at or after ``since`` (epoch seconds) whose fields
        equal ``match``; the controller's own timestamps, for intervals the status samples are too coarse for."""
        return [
            record
            for record in log_events(Path(self.state.log_dir) / "controller.log", event)
            if timestamp(record["timestamp"]) >= since and all(record.get(k) == v for k, v in match.items())
        ]

    def node_manager_log(self, pod_id: str) -> Path:
        return Path(self.state.log_dir) / f"node-manager-{pod_id}.log"

    def node_manager_events(self, event: str, request_id: str) -> dict[str, list[dict[str, Any]]]:
        """Per pod, the NodeManager's log lines of ``event`` (``ft.apply``, ``ft.finalize``) for one round."""
        return {
            pod.pod_id: [
                r for r in log_events(self.node_manager_log(pod.pod_id), event) if r.get("request_id") == request_id
            ]
            for pod in self.inst.pods
        }

    def completions(self, *, within: float = 30) -> list[str]:
        """The greedy outputs of :data:`PROMPTS` through the Coordinator, once it answers all of them."""

        def attempt() -> list[str] | None:
            with self.client(timeout_sec=30) as client:
                try:
                    return [client.completion(p) for p in PROMPTS]
                except ClusterUnreachableError:
                    return None

        return until(attempt, within=within, what="completions through the Coordinator", period=0.3)

    # -- the controller process (A17) ---------------------------------------------------------------------------
    def controller_pid(self) -> int:
        return next(p for p in self.cluster.processes if p.name == "controller").pid

    def kill_controller(self) -> dict[str, str]:
        """SIGKILL the controller (pid from the state file); returns the environment it ran with, read from
        ``/proc`` before the kill, so that it can be started again exactly as the launcher started it."""
        record = next(p for p in self.state.processes if p.name == "controller")
        managed = next(p for p in self.cluster.processes if p.name == "controller")
        raw = Path(f"/proc/{managed.pid}/environ").read_bytes()
        environ = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        assert environ.get(CLUSTER_ID_ENV) == self.state.cluster_id, "not this cluster's controller"
        assert managed.pid == record.pid or managed.argv[1:] == tuple(record.command)
        os.killpg(managed.pid, signal.SIGKILL)
        managed.popen.wait(timeout=30)
        return environ

    def start_controller(self, environ: dict[str, str]) -> int:
        """Start the controller again with the command line the state file records and ``environ``; the new
        process replaces the old one in the cluster's list, so the cluster's stop still reaches it."""
        record = next(p for p in self.state.processes if p.name == "controller")
        index = next(i for i, p in enumerate(self.cluster.processes) if p.name == "controller")
        argv = [self.cluster.options.python, *record.command]
        process = start_process("controller", argv, env=environ, log=Path(record.log))
        self.cluster.processes[index] = process
        return process.pid


# == starting a cluster ==========================================================================================
def running_cluster(
    name: str,
    tmp_path_factory: pytest.TempPathFactory,
    evidence_root: Path,
    *,
    ft: dict[str, Any],
    dp_size: int = 4,
    pods: int = 2,
    sim_nodes: int = 2,
    num_redundant_experts: int = 4,
    serves: bool = True,
    network_namespaces: bool = False,
) -> Iterator[ClusterUnderTest]:
    """Start one cluster whose controller gets ``ft`` merged into ``fault_tolerance_config``, wait until it
    serves, take the baseline outputs, yield it; stop it and check that no process of it is left (nor any part
    of its pods' network, with ``network_namespaces``: each pod in a namespace of its own).

    ``serves=False`` is the feature-off cluster: with scale-down off ``can_serve`` stays false (F-40), so
    readiness is "DISABLED and the Coordinator publishes every rank" instead of :meth:`LocalCluster.wait_ready`.
    """
    base = tmp_path_factory.mktemp(f"cluster-{name}")
    config = base / "operator.yaml"
    config.write_text(yaml.safe_dump({"fault_tolerance_config": {**TIMINGS, **ft}}))
    options = ClusterOptions(
        data_dir=base / "local",
        dp_size=dp_size,
        pods=pods,
        sim_nodes=sim_nodes,
        server_port=0,
        controller_port=0,
        coordinator_port=0,
        controller_config=config,
        num_redundant_experts=num_redundant_experts,
        collective_timeout_sec=COLLECTIVE_TIMEOUT_SEC,
        network_namespaces=network_namespaces,
    )
    cluster = LocalCluster(options)
    with pytest.MonkeyPatch.context() as env:
        for variable in list(os.environ):  # the processes inherit this environment: nothing from the shell
            if variable.startswith("HETEROFLOW_"):
                env.delenv(variable)
        cluster.start()
    cut = ClusterUnderTest(name=name, cluster=cluster, state_file=options.state_path, evidence_root=evidence_root)
    try:
        ranks = list(range(dp_size))
        if serves:
            cluster.wait_ready(timeout_sec=240)
        else:
            cut.wait(lambda s: s["phase"] == "DISABLED", within=240, what="the instance assembled (DISABLED)")
            until(lambda: cut.published() == ranks, within=120, what="the Coordinator publishes every rank")
        cut.baseline = cut.completions(within=60)
        yield cut
    finally:
        report = cluster.stop()
    assert report.left == (), f"processes of cluster {name} left behind: {report.left}"
    assert marked_processes(cluster.cluster_id) == []
    assert report.network_left == (), f"network of cluster {name} left behind: {report.network_left}"
