"""``heteroflow controller``: the serving fault-tolerance controller (one per cluster, or active/standby)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import structlog
import typer

from heteroflow.core.clock import SystemClock
from heteroflow.core.logs import configure_logging

_log = structlog.get_logger(__name__)


def controller(
    config: Annotated[
        Path | None, typer.Option(help="YAML configuration (controller, fault_tolerance_config, instances)")
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Bind address (env HETEROFLOW_CONTROLLER_HOST; default 127.0.0.1)")
    ] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="HTTP port (default 8500)")] = None,
    store_url: Annotated[str | None, typer.Option(help="sqlite:///PATH (default) or etcd://HOST:PORT")] = None,
    coordinator_url: Annotated[str | None, typer.Option(help="The Coordinator to publish serving views to")] = None,
    log_level: Annotated[str, typer.Option(help="Log level")] = "info",
) -> None:
    """Run the controller: instance registry, FaultManager, DP scale-down rounds, fallbacks, status API."""
    from heteroflow.serving.controller.config import ConfigFileError, load_config

    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "host": host,
            "port": port,
            "store_url": store_url,
            "coordinator_url": coordinator_url,
        }.items()
        if value is not None
    }
    configure_logging(level=log_level)
    try:
        cfg = load_config(config, overrides=overrides)
    except ConfigFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from exc
    store_url = cfg.settings.store_url
    if store_url.startswith("sqlite:///"):  # the embedded default: make its folder on first start
        Path(store_url.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
    raise typer.Exit(asyncio.run(run_controller(cfg)))


async def run_controller(cfg: Any) -> int:
    import uvicorn

    from heteroflow.cli.http_server import server_config
    from heteroflow.serving.controller.assembly import create_app
    from heteroflow.serving.controller.clients import CoordinatorClient, NodeManagerClient
    from heteroflow.serving.controller.monitor import ResourceMonitorSettings, build_monitor, hosting_nodes
    from heteroflow.serving.controller.pod_replacement import KubernetesPodReplacement
    from heteroflow.serving.controller.service import Controller
    from heteroflow.serving.controller.store import open_store

    settings = cfg.settings
    try:
        store = open_store(settings.store_url, timeout_sec=settings.store_timeout_sec)
    except ValueError as exc:
        _log.error("controller.bad_store_url", error=str(exc))
        return 2
    try:
        election = leader_election(settings, store, clock=SystemClock())
    except ValueError as exc:
        _log.error("controller.bad_leader_election", error=str(exc))
        return 2
    timeout = cfg.ft.request_timeout_sec
    ctrl = Controller(
        config=cfg,
        store=store,
        node_managers=NodeManagerClient(cluster_token=settings.cluster_token, timeout_sec=timeout),
        coordinator=(
            CoordinatorClient(settings.coordinator_url, cluster_token=settings.cluster_token, timeout_sec=timeout)
            if settings.coordinator_url
            else None
        ),
        clock=SystemClock(),
        pod_replacement=(
            KubernetesPodReplacement(namespace=settings.pod_replacement_namespace)
            if settings.pod_replacement_namespace
            else None
        ),
    )
    if election is not None:
        ctrl.on_not_leader = election.lost
    monitor = build_monitor(
        ResourceMonitorSettings.load(),
        sink=ctrl.hardware_fault,
        hosts_instance=hosting_nodes(lambda: [inst.topology for inst in ctrl.instances.values()]),
        clock=ctrl.clock,
    )
    app = create_app(
        ctrl,
        cluster_token=settings.cluster_token,
        allow_no_token=settings.allow_no_token,
        monitor=monitor,
        leadership=election,
    )
    server = uvicorn.Server(server_config(app, host=settings.host, port=settings.port, lifespan="off"))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    serving = asyncio.create_task(server.serve(), name="http")
    if election is not None:
        # a standby serves its probes and 503s, and acts only once it holds the lease
        campaign = asyncio.create_task(election.campaign(), name="campaign")
        await asyncio.wait({serving, campaign}, return_when=asyncio.FIRST_COMPLETED)
        if not campaign.done():  # asked to stop while standing by
            campaign.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await campaign
            await serving
            await ctrl.close()
            return 0
    await ctrl.start()
    await monitor.start()
    _log.info(
        "controller.started",
        host=settings.host,
        port=settings.port,
        store=settings.store_url.split("?")[0],
        scale_down=cfg.ft.scale_down_enabled,
        leader_election=election is not None,
    )
    try:
        await serving
    finally:
        await monitor.close()
        await ctrl.stop()
        if election is not None:
            await election.resign()  # after the last write: the standby may take over at once
        await ctrl.close()
    return 0


def leader_election(settings: Any, store: Any, *, clock: Any) -> Any:
    """The controller's :class:`LeaderElection`, or ``None`` in single-controller mode; :class:`ValueError` when
    election is asked for on the embedded store."""
    from heteroflow.serving.controller.leadership import LEADERSHIP_LOST_EXIT_CODE, LeaderElection
    from heteroflow.serving.controller.store import EtcdFtRuntimeStore

    if not isinstance(store, EtcdFtRuntimeStore):
        if settings.leader_election:
            raise ValueError("leader election needs an etcd store; the embedded SQLite store is single-controller")
        return None
    if settings.leader_election is False:
        return None

    def lost(reason: str) -> None:
        # the in-memory state may already be behind the new leader's: stop at once, come back as a standby
        sys.stderr.flush()
        os._exit(LEADERSHIP_LOST_EXIT_CODE)

    return LeaderElection(
        store,
        key=store.prefix.rstrip("/") + "-leader",
        controller_id=settings.controller_id or f"{socket.gethostname()}-{os.getpid()}",
        url=settings.advertise_url,
        ttl_sec=settings.lease_ttl_sec,
        clock=clock,
        on_lost=lost,
    )
