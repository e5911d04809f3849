"""``heteroflow controller``: the serving fault-tolerance controller (one per cluster, or active/standby)."""

from __future__ import annotations

import asyncio
import signal
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

    from heteroflow.serving.controller.app import create_app
    from heteroflow.serving.controller.clients import CoordinatorClient, NodeManagerClient
    from heteroflow.serving.controller.monitor import ResourceMonitorSettings, build_monitor, hosting_nodes
    from heteroflow.serving.controller.service import Controller
    from heteroflow.serving.controller.store import open_store

    settings = cfg.settings
    try:
        store = open_store(settings.store_url, timeout_sec=settings.store_timeout_sec)
    except ValueError as exc:
        _log.error("controller.bad_store_url", error=str(exc))
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
    )
    monitor = build_monitor(
        ResourceMonitorSettings.load(),
        sink=ctrl.hardware_fault,
        hosts_instance=hosting_nodes(lambda: [inst.topology for inst in ctrl.instances.values()]),
        clock=ctrl.clock,
    )
    app = create_app(
        ctrl, cluster_token=settings.cluster_token, allow_no_token=settings.allow_no_token, monitor=monitor
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False, lifespan="off")
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    await ctrl.start()
    await monitor.start()
    _log.info(
        "controller.started",
        host=settings.host,
        port=settings.port,
        store=settings.store_url.split("?")[0],
        scale_down=cfg.ft.scale_down_enabled,
    )
    try:
        await server.serve()
    finally:
        await monitor.close()
        await ctrl.close()
    return 0
