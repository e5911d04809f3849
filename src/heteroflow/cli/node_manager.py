"""``heteroflow node-manager``: one pod's NodeManager — engines, FT status poller, FT routes, heartbeat."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Generator
from pathlib import Path
from typing import Annotated, Any

import structlog
import typer

from heteroflow.core.clock import SystemClock
from heteroflow.core.logs import configure_logging
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.spec import InstanceSpec, SpecError, load_spec

_log = structlog.get_logger(__name__)


def node_manager(
    controller: Annotated[
        str,
        typer.Option(
            help="Controller base URL, e.g. http://127.0.0.1:8500; several comma-separated for active/standby "
            "controllers (the NodeManager moves on from one that is down or not acting)"
        ),
    ],
    pod_id: Annotated[str, typer.Option(help="This pod's id (unique in the cluster)")],
    pod_ip: Annotated[str, typer.Option(help="This pod's IP: engines bind it, the controller reaches them there")],
    host: Annotated[
        str | None, typer.Option(help="Bind address of the API [env HETEROFLOW_NODE_MANAGER_HOST; 127.0.0.1]")
    ] = None,
    port: Annotated[int | None, typer.Option(help="API port [env HETEROFLOW_NODE_MANAGER_PORT; 8300]")] = None,
    node_name: Annotated[str, typer.Option(help="Kubernetes node name (hardware faults are keyed by it)")] = "",
    advertise_url: Annotated[
        str | None, typer.Option(help="URL the controller uses to reach this NodeManager (default http://HOST:PORT)")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="Instance spec of this pod, JSON or .toml [env HETEROFLOW_NODE_MANAGER_CONFIG]"),
    ] = None,
    log_dir: Annotated[
        str | None, typer.Option(help="Directory of engine logs [env HETEROFLOW_NODE_MANAGER_LOG_DIR]")
    ] = None,
) -> None:
    """Run one pod's NodeManager: launch and supervise its engines and proxy their fault tolerance."""
    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "host": host,
            "port": port,
            "log_dir": log_dir,
            "config_file": None if config is None else str(config),
        }.items()
        if value is not None
    }
    settings = NodeManagerSettings.load(**overrides)
    if settings.config_file is None:
        raise typer.BadParameter("an instance spec is required (--config or HETEROFLOW_NODE_MANAGER_CONFIG)")
    try:
        spec = load_spec(Path(settings.config_file))
    except SpecError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from exc
    configure_logging(level=settings.log_level)
    url = advertise_url or f"http://{settings.host}:{settings.port}"
    code = asyncio.run(
        run_node_manager(
            spec=spec,
            settings=settings,
            controller_url=controller,
            pod_id=pod_id,
            pod_ip=pod_ip,
            node_name=node_name,
            url=url,
        )
    )
    raise typer.Exit(code)


async def run_node_manager(
    *,
    spec: InstanceSpec,
    settings: NodeManagerSettings,
    controller_url: str,
    pod_id: str,
    pod_ip: str,
    node_name: str,
    url: str,
) -> int:
    """Serve until SIGTERM/SIGINT (exit 0) or the engine-death suicide handling fires (exit 1)."""
    import uvicorn

    from heteroflow.cli.http_server import server_config

    class _Server(uvicorn.Server):
        """uvicorn re-raises a captured SIGTERM when it stops, which would kill us before the engines are
        stopped; the NodeManager handles SIGTERM/SIGINT itself and stops its engines first."""

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            yield

        def request_exit(self) -> None:
            self.should_exit = True

    from heteroflow.serving.node_manager.assembly import create_app
    from heteroflow.serving.node_manager.client import HttpControllerClient
    from heteroflow.serving.node_manager.daemon import NodeManager, PodIdentity
    from heteroflow.serving.node_manager.engines import HttpEngineClient
    from heteroflow.serving.node_manager.spec import endpoint_url
    from heteroflow.serving.node_manager.supervisor import PopenLauncher

    prefix = settings.engine_ft_path_prefix if settings.engine_ft_path_prefix is not None else spec.ft_path_prefix
    urls = {eid: endpoint_url(pod_ip, spec.endpoint(eid).port) for eid in spec.endpoint_ids}
    nm = NodeManager(
        spec=spec,
        settings=settings,
        pod=PodIdentity(pod_id=pod_id, pod_ip=pod_ip, node_manager_url=url, node_name=node_name),
        controller=HttpControllerClient(
            controller_url, cluster_token=settings.cluster_token, timeout_sec=settings.controller_timeout_sec
        ),
        engines=HttpEngineClient.for_urls(
            urls,
            cluster_token=settings.cluster_token,
            ft_path_prefix=prefix,
            profile=spec.pinned_profile,
            model=(spec.vllm.served_model_name or spec.vllm.model) if spec.vllm is not None else None,
        ),
        launcher=PopenLauncher(log_dir=Path(settings.log_dir) if settings.log_dir else None),
        clock=SystemClock(),
    )
    app = create_app(nm, cluster_token=settings.cluster_token, allow_no_token=settings.allow_no_token)
    server = _Server(server_config(app, host=settings.host, port=settings.port, lifespan="off"))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_exit)

    async def stop_on_suicide() -> None:
        await nm.exit_requested.wait()
        server.should_exit = True

    await nm.start()
    watcher = asyncio.create_task(stop_on_suicide())
    try:
        await server.serve()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await nm.close()
    return 1 if nm.exit_requested.is_set() else 0
