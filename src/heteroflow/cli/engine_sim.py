"""``heteroflow engine-sim``: one simulated vLLM DP rank (external-LB mode) — API server plus torch worker.

Signals (the signal-based fault path, usable without the cluster token): SIGUSR1 kills the worker
(this rank → ``dead``), SIGUSR2 injects a transient collective failure; SIGSTOP/SIGCONT on the worker's
pid (``GET /sim/info``) hang and resume it; SIGKILL to the session kills the whole rank.

Like a vLLM release, it cannot be launched "with ranks already dead" (there is no such option): a relaunch
without some ranks is a smaller contiguous world, ``--dp-size k --dp-rank 0..k-1`` with
``--num-redundant-experts k x slots_per_rank - E``. The expert layout is checked at start as vLLM 0.34 checks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from typing import Annotated, Any

import structlog
import typer

from heteroflow.contracts.engine_protocol import PROFILE_ALIASES, PROFILE_NAMES, PROFILES, canonical_profile_name
from heteroflow.core.clock import SystemClock
from heteroflow.core.logs import configure_logging
from heteroflow.engine_sim.assembly import create_app
from heteroflow.engine_sim.backend import FaultKind, WorkerStartError
from heteroflow.engine_sim.elastic import SCALE_UP_LAUNCH_ENV, ElasticEpConfig
from heteroflow.engine_sim.engine import EngineCore, EngineTimeouts
from heteroflow.engine_sim.process_backend import ProcessWorkerBackend, WorkerLaunch
from heteroflow.engine_sim.settings import EngineSimSettings, Topology
from heteroflow.engine_sim.state import ConfigurationError, initial_state

_log = structlog.get_logger(__name__)


def engine_sim(
    dp_size: Annotated[int, typer.Option(min=1, help="Data-parallel size of the instance (all ranks ever)")],
    dp_rank: Annotated[int, typer.Option(min=0, help="This engine's global DP rank (its FT id)")],
    master_addr: Annotated[str, typer.Option(help="DP master address: where the first TCP store listens")],
    master_port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the first TCP store")],
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port of this rank's API server")],
    host: Annotated[
        str | None, typer.Option(help="Bind address (env HETEROFLOW_ENGINE_SIM_HOST; default 127.0.0.1)")
    ] = None,
    num_experts: Annotated[int, typer.Option(min=1, help="Logical experts")] = 8,
    num_redundant_experts: Annotated[
        int,
        typer.Option(help="EPLB redundant replicas (vLLM --eplb-config.num_redundant_experts; E+K must divide by N)"),
    ] = 4,
    slots_per_rank: Annotated[
        int | None, typer.Option(min=1, help="Physical expert slots per rank: (E+K)/N, the only layout vLLM starts")
    ] = None,
    collective_timeout_sec: Annotated[
        float | None, typer.Option(help="gloo collective timeout (vLLM --cpu-distributed-timeout-seconds)")
    ] = None,
    engine_recovery_timeout_sec: Annotated[
        float | None, typer.Option(help="Exit when no FT command is accepted this long after a fault")
    ] = None,
    rebuild_timeout_sec: Annotated[float | None, typer.Option(help="Deadline of one group rebuild")] = None,
    startup_timeout_sec: Annotated[float | None, typer.Option(help="Deadline of the first group start")] = None,
    exit_linger_sec: Annotated[
        float | None, typer.Option(help="Seconds 'dead' stays visible after a terminal failure")
    ] = None,
    ft_path_prefix: Annotated[
        str | None, typer.Option(help="Prefix of the FT routes (default: the profile's, /v1 or none)")
    ] = None,
    ft_profile: Annotated[
        str | None,
        typer.Option(help="FT protocol profile: vllm-0.34 (default; alias scale-down) or vllm-0.32 (vllm-released)"),
    ] = None,
    diagnosing_sec: Annotated[
        float | None, typer.Option(help="vllm-0.34: seconds a faulted engine reports 'diagnosing'")
    ] = None,
    enable_elastic_ep: Annotated[
        bool,
        typer.Option(
            "--enable-elastic-ep",
            help="vllm-0.34: serve the elastic EP routes (env HETEROFLOW_ENGINE_SIM_ENABLE_ELASTIC_EP)",
        ),
    ] = False,
    elastic_ep_max_dp_size: Annotated[
        int | None,
        typer.Option(min=1, help="Elastic EP: largest data-parallel size a resize may reach (default: --dp-size)"),
    ] = None,
    elastic_ep_prepare_timeout_sec: Annotated[
        float | None, typer.Option(help="Elastic EP: deadline of the bootstrap wait and the ready barrier (300)")
    ] = None,
    elastic_ep_handshake_timeout_sec: Annotated[
        float | None, typer.Option(help="Elastic EP: how long a scale-up-launched rank waits for rank 0 (300)")
    ] = None,
    cluster_token: Annotated[
        str | None, typer.Option(help="Token of the fault-injection route (env HETEROFLOW_CLUSTER_TOKEN)")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Model seed (same on every rank)")] = None,
    log_level: Annotated[str | None, typer.Option(help="Log level (default info)")] = None,
) -> None:
    """Run one simulated engine rank that speaks the vLLM fault-tolerance protocol."""
    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "host": host,
            "collective_timeout_sec": collective_timeout_sec,
            "engine_recovery_timeout_sec": engine_recovery_timeout_sec,
            "rebuild_timeout_sec": rebuild_timeout_sec,
            "startup_timeout_sec": startup_timeout_sec,
            "exit_linger_sec": exit_linger_sec,
            "ft_path_prefix": ft_path_prefix,
            "ft_profile": ft_profile,
            "diagnosing_sec": diagnosing_sec,
            "elastic_ep_prepare_timeout_sec": elastic_ep_prepare_timeout_sec,
            "elastic_ep_handshake_timeout_sec": elastic_ep_handshake_timeout_sec,
            "enable_elastic_ep": True if enable_elastic_ep else None,  # unset: the environment decides
            "cluster_token": cluster_token,
            "seed": seed,
            "log_level": log_level,
        }.items()
        if value is not None
    }
    settings = EngineSimSettings.load(**overrides)
    topology = Topology(
        dp_size=dp_size,
        dp_rank=dp_rank,
        master_addr=master_addr,
        master_port=master_port,
        num_experts=num_experts,
        num_redundant_experts=num_redundant_experts,
        slots_per_rank=slots_per_rank,
        elastic_ep_max_dp_size=elastic_ep_max_dp_size,
        scale_up_launch=os.environ.get(SCALE_UP_LAUNCH_ENV, "") not in ("", "0"),
    )
    try:
        topology.validate()
        if topology.scale_up_launch and not settings.enable_elastic_ep:
            raise ConfigurationError(
                f"{SCALE_UP_LAUNCH_ENV}=1 launches a rank into an elastic EP scale-up: it needs --enable-elastic-ep"
            )
        initial_state(rank=dp_rank, dp_size=dp_size)
        if ft_profile is not None and canonical_profile_name(ft_profile) not in PROFILE_NAMES:
            known = ", ".join((*PROFILE_NAMES, *PROFILE_ALIASES))
            raise ConfigurationError(f"--ft-profile must be one of {known}; got {ft_profile!r}")
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc)) from exc
    configure_logging(level=settings.log_level)
    raise typer.Exit(asyncio.run(run_engine(topology=topology, settings=settings, port=port)))


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` but not listening yet: the port is ours, connections are refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def run_engine(*, topology: Topology, settings: EngineSimSettings, port: int) -> int:
    """Start the worker, serve HTTP until the engine decides to exit; the process exit code."""
    import uvicorn

    from heteroflow.cli.http_server import server_config

    loop = asyncio.get_running_loop()
    launch = WorkerLaunch(
        rank=topology.dp_rank,
        dp_size=topology.dp_size,
        master_addr=topology.master_addr,
        master_port=topology.master_port,
        bind_host=settings.host,
        num_experts=topology.num_experts,
        num_redundant_experts=topology.num_redundant_experts,
        # a scale-up-launched rank takes its layout from rank 0's bootstrap: the option's is not used
        slots_per_rank=topology.slots_per_rank or 1 if topology.scale_up_launch else topology.effective_slots_per_rank,
        collective_timeout_sec=settings.collective_timeout_sec,
        startup_timeout_sec=settings.startup_timeout_sec,
        rebuild_timeout_sec=settings.rebuild_timeout_sec,
        seed=settings.seed,
        max_batch=settings.max_batch_per_rank,
        idle_poll_interval_sec=settings.idle_poll_interval_sec,
        scale_up_launch=topology.scale_up_launch,
        handshake_timeout_sec=settings.elastic_ep_handshake_timeout_sec,
    )
    startup = settings.startup_timeout_sec
    if topology.scale_up_launch:  # it waits for the operator's resize first
        startup += settings.elastic_ep_handshake_timeout_sec + settings.elastic_ep_commit_timeout_sec
    backend = ProcessWorkerBackend(launch, startup_timeout_sec=startup)

    def hard_exit() -> None:
        # answer the injection request first, then die like a crashed process (no cleanup)
        def die() -> None:
            backend.inject(FaultKind.KILL_WORKER)
            os._exit(137)

        loop.call_later(0.2, die)

    core = EngineCore(
        initial=initial_state(
            rank=topology.dp_rank,
            dp_size=topology.dp_size,
            profile_name=settings.ft_profile,
        ),
        backend=backend,
        clock=SystemClock(),
        timeouts=EngineTimeouts(
            engine_recovery_timeout_sec=settings.engine_recovery_timeout_sec,
            exit_linger_sec=settings.exit_linger_sec,
            diagnosing_sec=settings.diagnosing_sec,
        ),
        hard_exit=hard_exit,
        elastic=ElasticEpConfig(
            num_experts=topology.num_experts,
            num_redundant_experts=topology.num_redundant_experts,
            max_dp_size=topology.effective_elastic_ep_max_dp_size,
            prepare_timeout_sec=settings.elastic_ep_prepare_timeout_sec,
            commit_timeout_sec=settings.elastic_ep_commit_timeout_sec,
        )
        if settings.enable_elastic_ep
        else None,
    )
    # Claim the HTTP port before the process group forms: gloo's own sockets take ephemeral ports and could
    # otherwise land on it. The socket listens (connections are accepted) only once the engine is ready.
    try:
        http_socket = reserve_port(settings.host, port)
    except OSError as exc:
        _log.error("engine.port_unavailable", rank=topology.dp_rank, host=settings.host, port=port, error=str(exc))
        return 1
    try:
        ready = await core.start()
    except (WorkerStartError, TimeoutError) as exc:
        http_socket.close()
        _log.error("engine.start_failed", rank=topology.dp_rank, error=str(exc))
        return 1
    _log.info("engine.ready", rank=topology.dp_rank, worker_pid=ready.worker_pid, placement=ready.placement)
    app = create_app(
        core,
        model_name=settings.model_name,
        ft_path_prefix=settings.effective_ft_path_prefix,
        profile=PROFILES[settings.ft_profile],
        cluster_token=settings.cluster_token,
        max_tokens_limit=settings.max_tokens_limit,
        enable_elastic_ep=settings.enable_elastic_ep,
    )
    server = uvicorn.Server(server_config(app, host=settings.host, port=port, lifespan="off"))
    loop.add_signal_handler(signal.SIGUSR1, core.inject, FaultKind.KILL_WORKER)
    loop.add_signal_handler(signal.SIGUSR2, core.inject, FaultKind.TRANSIENT)

    async def tick() -> None:
        while True:
            core.tick()
            await asyncio.sleep(0.1)  # the timer's own period, not a synchronisation

    async def stop_on_exit() -> None:
        await core.exit_requested.wait()
        server.should_exit = True

    tasks = [asyncio.create_task(tick()), asyncio.create_task(stop_on_exit())]
    try:
        await server.serve(sockets=[http_socket])
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await core.close()
    return core.exit_code if core.exit_requested.is_set() else 0
