"""``heteroflow coordinator``: route OpenAI requests to the published endpoints of the serving instances."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Annotated, Any

import structlog
import typer

from heteroflow.core.logs import configure_logging
from heteroflow.serving.coordinator.settings import CoordinatorSettings

_log = structlog.get_logger(__name__)

MANAGEMENT_START_SEC = 10.0
"""How long the management listener may take to bind before the Coordinator gives up starting."""
MANAGEMENT_SWITCH_INTERVAL_SEC = 0.0005
"""The interpreter's thread switch interval while the management listener runs (Python's default is 5 ms).

The management listener's thread needs the interpreter lock back after every wait on its sockets; while the
OpenAI loop keeps the lock busy, each take waits up to the switch interval. At 0.5 ms the busy loop hands the
lock over ten times sooner, and only when the other thread asks for it: an idle management listener costs the
OpenAI loop nothing (measured: docs/benchmarks.md, management operations under 200 streams)."""
GRACEFUL_SHUTDOWN_SEC = 30
"""On SIGTERM, requests in flight get this long to finish; a stream longer than that is cut so that a rolling
restart never waits for the 600 s total timeout."""


def raise_thread_priority(nice: int) -> bool:
    """Give the calling thread the nice value ``nice`` (Linux schedules threads one by one); False when the
    process may not (a lower value than it has needs CAP_SYS_NICE) or the platform has no such call."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):  # PermissionError without CAP_SYS_NICE
        return False
    return True


def coordinator(
    host: Annotated[
        str | None, typer.Option(help="Bind address (env HETEROFLOW_COORDINATOR_HOST; default 127.0.0.1)")
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="TCP port (env HETEROFLOW_COORDINATOR_PORT; default 8400)")
    ] = None,
    platform_url: Annotated[
        str | None,
        typer.Option(help="Platform server that validates API keys (env HETEROFLOW_COORDINATOR_PLATFORM_URL)"),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="Log level (env HETEROFLOW_COORDINATOR_LOG_LEVEL; default info)")
    ] = None,
) -> None:
    """Run the Coordinator: OpenAI routes in front of the engines, DEL/ADD/SET for the controller.

    Secrets come from the environment only (argv is visible in ps): HETEROFLOW_CLUSTER_TOKEN and
    HETEROFLOW_COORDINATOR_API_KEY_HASHES.
    """
    import uvicorn

    from heteroflow.cli.http_server import serve, server_config
    from heteroflow.serving.coordinator.assembly import create_app, create_management_app
    from heteroflow.serving.coordinator.service import Coordinator

    overrides: dict[str, Any] = {
        key: value
        for key, value in {"host": host, "port": port, "platform_url": platform_url, "log_level": log_level}.items()
        if value is not None
    }
    settings = CoordinatorSettings.load(**overrides)
    configure_logging(level=settings.log_level)
    if settings.cluster_token is None:
        _log.warning("coordinator.no_cluster_token", detail="management routes and /metrics refuse every call")
    if not settings.api_key_digests and settings.platform_url is None:
        _log.warning("coordinator.no_api_key", detail="no API key source is configured: every OpenAI request gets 401")
    service = Coordinator(settings=settings)
    _log.info("coordinator.starting", host=settings.host, port=settings.port, management_port=settings.management_port)
    if settings.management_port is not None:
        management = uvicorn.Server(
            server_config(
                create_management_app(service), host=settings.host, port=settings.management_port, lifespan="off"
            )
        )
        # a thread and event loop of its own: a DEL takes effect however busy the OpenAI loop is; uvicorn
        # installs no signal handlers outside the main thread, and the thread dies with the process
        sys.setswitchinterval(MANAGEMENT_SWITCH_INTERVAL_SEC)
        nice = settings.management_nice

        def run_management() -> None:
            if nice and not raise_thread_priority(nice):
                _log.info("coordinator.management_priority_unchanged", nice=nice, detail="needs CAP_SYS_NICE")
            management.run()

        thread = threading.Thread(target=run_management, name="coordinator-management", daemon=True)
        thread.start()
        deadline = time.monotonic() + MANAGEMENT_START_SEC
        while not management.started:
            if not thread.is_alive() or time.monotonic() > deadline:  # e.g. the port is taken: say so, stop
                _log.error("coordinator.management_listener_failed", port=settings.management_port)
                raise typer.Exit(code=1)
            time.sleep(0.02)  # polling the listener's start with a deadline
    serve(
        create_app(service),
        host=settings.host,
        port=settings.port,
        lifespan="on",
        timeout_keep_alive=settings.keep_alive_timeout_sec,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SEC,
    )
