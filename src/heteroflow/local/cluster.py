"""The whole serving platform on one machine, as real processes: :class:`LocalCluster`.

What runs (on loopback unless each pod gets a network namespace of its own, see below; each process in its own
session, every output under ``<data_dir>/logs``):

- the platform server (``heteroflow server``) on SQLite under the data dir;
- the controller (``heteroflow controller``) with its embedded SQLite FtRuntimeStore and a generated YAML
  (scale-down on), merged under the operator's ``--config``;
- the Coordinator (``heteroflow coordinator``), which checks API keys against the platform server;
- one NodeManager per pod of each instance (``heteroflow node-manager``), each launching and supervising its
  simulated engines (backend ``sim``: an API server and a torch worker per DP rank);
- the simulated GPU agents (``heteroflow agent run --simulate 8``) whose cards the ranks' device infos name.

One secret for everything: the platform's admin token, created here, is also the cluster token of every
internal route (controller, NodeManagers, engines, the Coordinator's management routes), and the Coordinator
accepts it — and any other platform token — as an OpenAI API key.

With ``network_namespaces`` (root only) each pod's NodeManager, and so its engines, runs in a network
namespace of its own on an address of its own, and the other services listen on the bridge that joins the
namespaces (:mod:`heteroflow.local.netns`): pod IPs and DP master IPs are then distinct addresses. The network
is created before any process starts and deleted after every process has stopped.

``heteroflow up`` is a thin shell over this class; the end-to-end tests drive it directly.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import structlog
import yaml

from heteroflow.contracts.engine_protocol import ProfileName
from heteroflow.core.clock import SystemClock
from heteroflow.core.files import private_dir
from heteroflow.local import netns, vllm
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.plan import (
    NUM_REDUNDANT_EXPERTS,
    InstancePlan,
    InstancePorts,
    Layout,
    command_line,
    controller_config,
    merge_config,
    plan_instances,
    process_plans,
    split_ranks,
    url_of,
)
from heteroflow.local.ports import PortAllocator
from heteroflow.local.processes import (
    CLUSTER_ID_ENV,
    ManagedProcess,
    kill_marked,
    marked_processes,
    start_process,
    start_ticks,
    stop_processes,
)
from heteroflow.local.state import (
    ClusterState,
    EndpointState,
    InstanceState,
    NetworkState,
    PodNetworkState,
    PodState,
    ProcessState,
    write_state,
)
from heteroflow.platform.auth import Scope, generate_token
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.token_store import SqlTokenStore

_log = structlog.get_logger(__name__)

DEFAULT_SERVER_PORT = 8080
DEFAULT_CONTROLLER_PORT = 8500
DEFAULT_COORDINATOR_PORT = 8400
NETWORK_RECORD = "network.json"
"""Under the data dir: the pods' network as created (``network_namespaces``), kept until it is deleted."""


class ClusterError(Exception):
    """The cluster could not be started or did not become ready; the text says which process and why."""


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """What ``heteroflow up`` asks for. Ports: ``None`` = the default (8080/8500/8400) when free, else any
    free port; ``0`` = any free port; a number = exactly that port."""

    data_dir: Path = Path("var/local")
    state_file: Path | None = None
    """Default ``<data_dir>/state.json``."""
    dp_size: int = 4
    pods: int = 2
    instances: int = 1
    sim_nodes: int = 2
    """Simulated GPU agents (8 cards each); the pods are placed on their nodes (see ``plan.py``)."""
    server_port: int | None = None
    controller_port: int | None = None
    coordinator_port: int | None = None
    controller_config: Path | None = None
    """Operator YAML merged over the generated controller configuration (the file wins)."""
    host: str = "127.0.0.1"
    python: str = sys.executable
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Added to every process's environment, e.g. ``HETEROFLOW_ENGINE_FT_POLL_INTERVAL_SEC`` for the NodeManagers."""
    num_redundant_experts: int = NUM_REDUNDANT_EXPERTS
    """EPLB redundant expert replicas of every instance (4). 0 still serves, but fails the scale-down gate
    (``EXPERT_REDUNDANCY_REQUIRED``): how the acceptance suite shows a static gate refusal (A15)."""
    collective_timeout_sec: float = 10.0
    """The engines' collective timeout (``--cpu-distributed-timeout-seconds``, 10 s): how long a survivor waits on
    a peer that neither answers nor leaves, e.g. a hung worker."""
    engine: Literal["sim", "vllm"] = "sim"
    """``vllm``: real vLLM ranks from the cached vLLM venv (``scripts/vllm-venv``; ``heteroflow.local.vllm``)."""
    vllm_model: Path | None = None
    """The model real ranks serve; default the generated tiny MoE model (``~/.cache/heteroflow/tiny-moe``)."""
    sim_ft_profile: ProfileName = "vllm-0.34"
    """The FT protocol profile the simulated engines speak (the RFC's flow needs ``vllm-0.34``)."""
    network_namespaces: bool = False
    """Each pod in a network namespace of its own (``heteroflow up --netns``; Linux, root, iproute2's ``ip``):
    pods on distinct addresses of a private /24, the other services on the bridge's address instead of
    ``host`` (which then only serves to check that the ports are free). Off: everything on ``host``."""

    @property
    def state_path(self) -> Path:
        return self.state_file or self.data_dir / "state.json"


@dataclass(frozen=True, slots=True)
class StopReport:
    killed: tuple[str, ...]
    """Processes that ignored SIGTERM within the grace and were SIGKILLed."""
    swept: tuple[int, ...]
    """Pids still carrying the cluster's marker after the orderly stop (engines of a NodeManager that could
    not stop them), SIGKILLed by the final sweep."""
    left: tuple[int, ...]
    """Marked pids alive after everything: should always be empty."""
    network_left: tuple[str, ...] = ()
    """Parts of the pods' network (``network_namespaces``) that could not be deleted, with ``ip``'s reason:
    should always be empty."""


class LocalCluster:
    """Start, watch and stop one local cluster. Not reusable: one ``start`` and one ``stop`` per object.

    Start it from a thread that outlives it: its processes are told to exit when the starting thread's
    process dies (``PR_SET_PDEATHSIG``), which the kernel ties to the starting thread.
    """

    def __init__(self, options: ClusterOptions) -> None:
        self.options = options
        self.cluster_id = uuid.uuid4().hex
        self.processes: list[ManagedProcess] = []
        self.plans: list[InstancePlan] = []
        self._state: ClusterState | None = None
        self._stopped = False
        self._network: tuple[Path, netns.NetworkRecord] | None = None
        """Where the pods' network is recorded, and the record (``network_namespaces`` only)."""
        self._ip: str | None = None
        """iproute2's ``ip`` (``network_namespaces`` only)."""

    @property
    def state(self) -> ClusterState:
        if self._state is None:
            raise ClusterError("the cluster is not started")
        return self._state

    def client(self, *, timeout_sec: float = 5.0) -> ClusterClient:
        return ClusterClient(self.state, timeout_sec=timeout_sec)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- start ---------------------------------------------------------------------------------------------
    def start(self) -> ClusterState:
        """Choose ports, create tokens, write configurations, start every process, write the state file.

        Returns at once (processes are starting); :meth:`wait_ready` waits for the instances to serve.
        With ``network_namespaces`` it first refuses (:class:`ClusterError`, nothing created) when this is not
        Linux, not root, or ``ip`` is missing."""
        opts = self.options
        if opts.network_namespaces:
            self._ip = netns.find_ip()
            reason = netns.unavailable_reason(euid=os.geteuid(), ip=self._ip)
            if reason is not None:
                raise ClusterError(f"cannot give pods network namespaces: {reason}")
        data_dir = opts.data_dir.resolve()
        log_dir = data_dir / "logs"
        # every tenant's data, the token hashes, the runtime, logs and specs: owner-only, whatever the umask
        # (every process is started with umask 077, see processes.py)
        private_dir(data_dir, tighten=True)
        private_dir(log_dir, tighten=True)
        user_config = _read_yaml(opts.controller_config) if opts.controller_config is not None else {}

        split_ranks(opts.dp_size, opts.pods)  # refuse impossible layouts before anything is created
        ports = PortAllocator(opts.host)
        server_port = ports.take(opts.server_port, default=DEFAULT_SERVER_PORT)
        section = user_config.get("controller")
        file_port = section.get("port") if isinstance(section, dict) else None  # the operator's file wins
        controller_port = ports.take(
            file_port if isinstance(file_port, int) else opts.controller_port, default=DEFAULT_CONTROLLER_PORT
        )
        coordinator_port = ports.take(opts.coordinator_port, default=DEFAULT_COORDINATOR_PORT)
        management_port = ports.take()  # the Coordinator's management listener, where the controller sends DEL/ADD/SET
        instance_ports = [
            InstancePorts(
                node_managers=tuple(ports.take() for _ in range(opts.pods)),
                engines=tuple(ports.take() for _ in range(opts.dp_size)),
                rpc_port=ports.take(),
                store_port=ports.take(),
            )
            for _ in range(opts.instances)
        ]
        # With namespaces the ports were checked on `host` all the same: the bridge's address is new, so only a
        # wildcard listener could hold a port there, and that one holds it on loopback too. Inside a pod's
        # namespace every port is free; they stay distinct across the cluster anyway, so nothing else changes.
        network = self._open_network(data_dir) if opts.network_namespaces else None
        try:
            return self._launch(
                data_dir=data_dir,
                log_dir=log_dir,
                user_config=user_config,
                server_port=server_port,
                controller_port=controller_port,
                coordinator_port=coordinator_port,
                management_port=management_port,
                instance_ports=instance_ports,
                network=network,
            )
        except BaseException:
            if network is not None:
                self.stop()  # every process first, then the network
            raise

    def _open_network(self, data_dir: Path) -> netns.NetworkPlan:
        """Clean up an earlier run's leftovers, create the bridge and one namespace per pod (recorded first)."""
        opts = self.options
        assert self._ip is not None  # found by start()
        owner, ticks = os.getpid(), start_ticks(os.getpid())
        record_path = data_dir / NETWORK_RECORD
        try:
            plan = netns.open_network(
                cluster_id=self.cluster_id,
                pods=opts.instances * opts.pods,
                record_path=record_path,
                run=netns.ip_runner(self._ip),
                owner_pid=owner,
                owner_start_ticks=ticks,
                owner_alive=_owner_alive,
            )
        except netns.NetworkError as exc:
            raise ClusterError(f"cannot create the pods' network: {exc}") from exc
        self._network = (record_path, netns.record_of(self.cluster_id, plan, owner_pid=owner, owner_start_ticks=ticks))
        _log.info("local.network", bridge=plan.bridge, subnet=plan.subnet, pods=[p.ip for p in plan.pods])
        return plan

    def _launch(
        self,
        *,
        data_dir: Path,
        log_dir: Path,
        user_config: dict[str, Any],
        server_port: int,
        controller_port: int,
        coordinator_port: int,
        management_port: int,
        instance_ports: list[InstancePorts],
        network: netns.NetworkPlan | None,
    ) -> ClusterState:
        opts = self.options
        host = opts.host if network is None else network.gateway
        engine_args: dict[str, Any] = {"engine": opts.engine, "sim_ft_profile": opts.sim_ft_profile}
        if opts.engine == "vllm":
            engine_args |= _vllm_engine(opts)
        plans = plan_instances(
            **engine_args,
            instances=opts.instances,
            dp_size=opts.dp_size,
            pods=opts.pods,
            sim_nodes=opts.sim_nodes,
            ports=instance_ports,
            host=host,
            python=opts.python,
            num_redundant_experts=opts.num_redundant_experts,
            collective_timeout_sec=opts.collective_timeout_sec,
            pod_networks=network.pods if network is not None else (),
        )
        database_url = f"sqlite:///{data_dir / 'heteroflow.db'}"
        admin_token, agent_token, monitor_token, api_key = _create_tokens(database_url)
        cluster_token = generate_token()  # the internal routes' own secret, new every run (rotated by `up`)
        hardware_directory = data_dir / "mindcluster"
        hardware_directory.mkdir(exist_ok=True)
        # A runtime stored by an earlier `up` describes engines that no longer exist; restoring it (F-32)
        # would start this fresh cluster half scaled-down. The store belongs to the run; the logs stay.
        store_path = data_dir / "controller" / "ft-runtime.db"
        for suffix in ("", "-wal", "-shm", "-journal"):
            store_path.with_name(store_path.name + suffix).unlink(missing_ok=True)
        store_path.parent.mkdir(parents=True, exist_ok=True)
        coordinator_url = url_of(host, management_port)  # the controller's: the management listener
        config = merge_config(
            controller_config(
                host=host,
                port=controller_port,
                store_url=f"sqlite:///{store_path}",
                coordinator_url=coordinator_url,
                instances=plans,
            ),
            user_config,
        )
        layout = Layout(
            host=host,
            server_port=server_port,
            controller_port=controller_port,
            coordinator_port=coordinator_port,
            instances=tuple(replace(plan, model=_model_of(config, plan)) for plan in plans),
            sim_nodes=opts.sim_nodes,
            coordinator_management_port=management_port,
        )
        self.plans = list(layout.instances)
        config_path = data_dir / "controller.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        spec_dir = data_dir / "specs"
        spec_dir.mkdir(exist_ok=True)
        spec_paths = {}
        for plan in layout.instances:
            for pod in plan.pods:
                spec_paths[pod.pod_id] = spec_dir / f"{pod.pod_id}.json"
                spec_paths[pod.pod_id].write_text(pod.spec.model_dump_json(indent=2))

        commands: dict[str, list[str]] = {}  # what the state file records: the interpreter's arguments
        base_env = {**os.environ, **opts.extra_env, CLUSTER_ID_ENV: self.cluster_id, "PYTHONUNBUFFERED": "1"}
        if network is not None:
            base_env.update(_no_proxy(base_env, [network.gateway, *(pod.ip for pod in network.pods)]))
        try:
            for process in process_plans(
                layout,
                database_url=database_url,
                controller=config["controller"],
                controller_config_path=config_path,
                spec_paths=spec_paths,
                engine_log_dir=log_dir,
                admin_token=admin_token,
                cluster_token=cluster_token,
                agent_token=agent_token,
                monitor_token=monitor_token,
                hardware_directory=hardware_directory,
            ):
                self.processes.append(
                    start_process(
                        process.name,
                        command_line(process, python=opts.python, ip=self._ip),
                        env={**base_env, **dict(process.env)},
                        log=log_dir / process.log_name,
                    )
                )
                commands[process.name] = ["-m", "heteroflow", *process.args]
        except BaseException:
            self.stop()
            raise

        self._state = ClusterState(
            cluster_id=self.cluster_id,
            launcher_pid=os.getpid(),
            data_dir=str(data_dir),
            log_dir=str(log_dir),
            server_url=layout.server_url,
            controller_url=layout.controller_url,
            coordinator_url=layout.coordinator_url,
            admin_token=admin_token,
            cluster_token=cluster_token,
            api_key=api_key,
            agent_token=agent_token,
            hardware_directory=str(hardware_directory),
            database_url=database_url,
            controller_config=str(config_path),
            instances=[_instance_state(plan) for plan in layout.instances],
            processes=[
                ProcessState(name=p.name, pid=p.pid, log=str(p.log), command=commands[p.name]) for p in self.processes
            ],
            network=None if network is None else _network_state(network, layout.instances),
        )
        write_state(opts.state_path, self._state)
        _log.info("local.started", state_file=str(opts.state_path), processes=len(self.processes))
        return self._state

    # -- readiness -------------------------------------------------------------------------------------------
    def exited(self) -> list[tuple[str, int]]:
        """(name, exit code) of every process of ours that has exited."""
        return [(p.name, code) for p in self.processes if (code := p.exit_code()) is not None]

    def check_alive(self) -> None:
        """Raise :class:`ClusterError` naming the first process that exited, with the end of its log."""
        for proc in self.processes:
            code = proc.exit_code()
            if code is not None:
                raise ClusterError(f"{proc.name} exited with code {code}; the end of {proc.log}:\n{proc.log_tail()}")

    def readiness(self) -> str | None:
        """``None`` when every instance is published and serving, else what is still missing."""
        state = self.state
        try:
            with ClusterClient(state, timeout_sec=2.0) as client:
                entries = {e.get("instance_id"): e for e in client.controller_status()}
                for inst in state.instances:
                    entry = entries.get(inst.instance_id)
                    if entry is None:
                        return f"{inst.instance_id}: not assembled yet (NodeManagers registering)"
                    if not entry.get("can_serve"):
                        return f"{inst.instance_id}: phase {entry.get('phase')}, not serving yet"
                    if client.published(inst.instance_id) != sorted(e.id for e in inst.endpoints):
                        return f"{inst.instance_id}: the Coordinator does not publish every rank yet"
        except ClusterUnreachableError as exc:
            return str(exc)
        return None

    def wait_ready(self, *, timeout_sec: float = 300.0, cancel: Callable[[], bool] | None = None) -> None:
        """Poll until every instance is published (``can_serve``) and the Coordinator routes to all ranks.

        Raises :class:`ClusterError` when a process exits or the deadline passes; returns early (without
        error) when ``cancel()`` becomes true."""
        clock = SystemClock()
        deadline = clock.monotonic() + timeout_sec
        missing: str | None = "nothing polled yet"
        while True:
            if cancel is not None and cancel():
                return
            self.check_alive()
            missing = self.readiness()
            if missing is None:
                return
            if clock.monotonic() > deadline:
                raise ClusterError(f"not ready within {timeout_sec:.0f} s: {missing}")
            time.sleep(0.25)  # polling period of a readiness check, not a synchronisation

    # -- stop ------------------------------------------------------------------------------------------------
    def stop(self, *, grace_sec: float = 20.0) -> StopReport:
        """Stop everything and check that nothing of the cluster is left. Idempotent.

        The controller goes first, so that engines stopping is never taken for a fault and answered with a
        reconfiguration; then the Coordinator; then the NodeManagers, which stop their engines; then the
        agents and the platform server. Whatever ignores SIGTERM is killed with its process group, and a
        last sweep kills any process still carrying the cluster's marker. The pods' network namespaces, if
        any, are deleted last, once no process of the cluster runs in them."""
        if self._stopped:
            return StopReport((), (), ())
        self._stopped = True
        killed: list[str] = []
        for role in ("controller", "coordinator", "node-manager", "agent", "server"):
            group = [p for p in self.processes if p.name.split(":")[0] == role]
            killed += [p.name for p in stop_processes(group, grace_sec=grace_sec)]
        swept = kill_marked(self.cluster_id)
        clock = SystemClock()
        deadline = clock.monotonic() + 5.0
        left = marked_processes(self.cluster_id)
        while left and clock.monotonic() < deadline:
            time.sleep(0.05)  # SIGKILLed processes need a moment to be reaped by their parents
            left = marked_processes(self.cluster_id)
        if killed or swept or left:
            _log.warning("local.stop_forced", killed=killed, swept=swept, left=left)
        network_left = self._close_network()
        return StopReport(tuple(killed), tuple(swept), tuple(left), tuple(network_left))

    def _close_network(self) -> list[str]:
        if self._network is None or self._ip is None:
            return []
        record_path, record = self._network
        left = netns.close_network(record, record_path=record_path, run=netns.ip_runner(self._ip))
        if left:
            _log.warning("local.network_left", bridge=record.bridge, left=left)
        return left


def _owner_alive(record: netns.NetworkRecord) -> bool:
    """Whether the launcher that recorded a network still runs (same pid *and* start time: pids are reused)."""
    return record.owner_start_ticks is not None and start_ticks(record.owner_pid) == record.owner_start_ticks


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ClusterError(f"cannot read the controller configuration {path}: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ClusterError(f"{path} must hold a mapping at the top level")
    return loaded


def _model_of(config: Mapping[str, Any], plan: InstancePlan) -> str:
    """The model the controller will publish for the instance (the operator's file may name another)."""
    entry = (config.get("instances") or {}).get(plan.instance_id)
    model = entry.get("model") if isinstance(entry, dict) else None
    return model if isinstance(model, str) and model else plan.model


def _create_tokens(database_url: str) -> tuple[str, str, str, str]:
    """Fresh admin, agent, controller-monitor (``nodes:read``) and Coordinator API key (``inference``) tokens in
    the platform database (migrated first)."""
    engine = create_db_engine(database_url)
    try:
        upgrade_database(engine)
        tokens = SqlTokenStore(engine)
        now = SystemClock().now()
        _, admin = tokens.create_token(name="local-admin", scopes=frozenset({Scope.ADMIN}), tenant_id=None, now=now)
        _, agent = tokens.create_token(name="local-agents", scopes=frozenset({Scope.AGENT}), tenant_id=None, now=now)
        _, monitor = tokens.create_token(
            name="local-controller-monitor", scopes=frozenset({Scope.NODES_READ}), tenant_id=None, now=now
        )
        _, api_key = tokens.create_token(
            name="local-inference", scopes=frozenset({Scope.INFERENCE}), tenant_id=None, now=now
        )
    finally:
        engine.dispose()
    return admin, agent, monitor, api_key


def _instance_state(plan: InstancePlan) -> InstanceState:
    return InstanceState(
        instance_id=plan.instance_id,
        model=plan.model,
        dp_size=plan.dp_size,
        endpoints=[
            EndpointState(id=r.rank, ip=pod.ip, port=r.port, pod=pod.pod_id, device_infos=[r.device])
            for pod in plan.pods
            for r in pod.ranks
        ],
        pods=[
            PodState(
                pod_id=pod.pod_id,
                node_manager_url=url_of(pod.ip, pod.node_manager_port),
                endpoint_ids=[r.rank for r in pod.ranks],
                node_name=pod.node_name,
            )
            for pod in plan.pods
        ],
    )


def _network_state(network: netns.NetworkPlan, instances: tuple[InstancePlan, ...]) -> NetworkState:
    pods = [pod for inst in instances for pod in inst.pods]  # the order the network's pods were planned in
    return NetworkState(
        bridge=network.bridge,
        subnet=network.subnet,
        gateway=network.gateway,
        pods=[
            PodNetworkState(pod_id=pod.pod_id, namespace=net.namespace, ip=net.ip, veth=net.veth)
            for pod, net in zip(pods, network.pods, strict=True)
        ],
    )


def _no_proxy(env: Mapping[str, str], addresses: list[str]) -> dict[str, str]:
    """``NO_PROXY``/``no_proxy`` extended with the cluster's addresses: the services' HTTP clients honour the
    proxy variables of the operator's shell, which usually exempt loopback but not a private /24 of ours."""
    current = env.get("NO_PROXY") or env.get("no_proxy") or ""
    value = ",".join(part for part in [current, *addresses] if part)
    return {"NO_PROXY": value, "no_proxy": value}


__all__ = ["ClusterError", "ClusterOptions", "LocalCluster", "StopReport"]


def _vllm_engine(opts: ClusterOptions) -> dict[str, Any]:
    """The plan's arguments for real vLLM ranks: the venv's interpreter, the model, the served name."""
    try:
        python = vllm.venv_python()
        model = opts.vllm_model or vllm.build_tiny_model(python, vllm.default_model_dir())
    except vllm.VllmUnavailableError as exc:
        raise ClusterError(str(exc)) from exc
    return {"vllm": vllm.vllm_options(python, model), "model": vllm.SERVED_MODEL}
