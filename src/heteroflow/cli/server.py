"""``heteroflow server``: the platform server, one process or several worker processes sharing its port."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from fastapi import FastAPI

from heteroflow.core.collector import settle_after_start_up, watch_pauses
from heteroflow.core.logs import configure_logging
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.platform_server.workers import WORKER_DIR_ENV, SiblingMetrics, worker_directory


def server(
    host: Annotated[str | None, typer.Option(help="Bind address [env HETEROFLOW_SERVER_HOST; 127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port [env HETEROFLOW_SERVER_PORT; 8080]")] = None,
    database_url: Annotated[
        str | None, typer.Option(help="sqlite:///PATH or postgresql://… [env HETEROFLOW_DATABASE_URL]")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Worker processes sharing the port; >1 needs PostgreSQL [env HETEROFLOW_SERVER_WORKERS; 1]"),
    ] = None,
) -> None:
    """Run the platform server (migrates the database first)."""
    from heteroflow.cli.http_server import serve, serve_workers
    from heteroflow.platform_server.assembly import build_context, create_app
    from heteroflow.storage.db import create_db_engine, normalise_url, upgrade_database

    overrides = {
        key: value
        for key, value in {"host": host, "port": port, "database_url": database_url, "workers": workers}.items()
        if value is not None
    }
    settings = ServerSettings.load(**overrides)
    configure_logging(level=settings.log_level)
    if settings.workers == 1:
        ctx = build_context(settings=settings, health_settings=HealthStorageSettings.load())
        with ctx.engine.connect():  # reached now, so a database that is away is told in one line, not at start-up
            pass
        app = create_app(ctx)
        tune_interpreter(settings)
        watch_pauses(ctx.metrics.observe_gc_pause)
        serve(
            app,
            host=settings.host,
            port=settings.port,
            lifespan="on",
            timeout_keep_alive=settings.keep_alive_timeout_seconds,
        )
        return
    if normalise_url(settings.database_url).get_backend_name() != "postgresql":
        typer.echo(
            f"error: --workers {settings.workers} needs PostgreSQL (HETEROFLOW_DATABASE_URL=postgresql://…): "
            "several processes would write one SQLite file, which takes one writer at a time",
            err=True,
        )
        raise typer.Exit(2)
    engine = create_db_engine(settings.database_url)
    upgrade_database(engine)  # once, before the workers start
    engine.dispose()
    directory = Path(tempfile.mkdtemp(prefix="heteroflow-server-"))  # mode 0700: the metrics sockets
    # the workers are new processes: they read the command's options from the environment, as settings
    os.environ.update(
        {
            WORKER_DIR_ENV: str(directory),
            "HETEROFLOW_SERVER_HOST": settings.host,
            "HETEROFLOW_SERVER_PORT": str(settings.port),
            "HETEROFLOW_DATABASE_URL": settings.database_url,
            "HETEROFLOW_SERVER_WORKERS": str(settings.workers),
        }
    )
    try:
        serve_workers(
            "heteroflow.cli.server:worker_app",
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            lifespan="on",
            timeout_keep_alive=settings.keep_alive_timeout_seconds,
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def tune_interpreter(settings: ServerSettings) -> None:
    """Once start-up is over: the collector's policy (``core/collector.py``) and the thread switch interval
    (``switch_interval_ms``: the event loop gets the interpreter lock back sooner from a worker thread)."""
    settle_after_start_up(young_threshold=settings.gc_young_threshold)
    sys.setswitchinterval(settings.switch_interval_ms / 1000)


def worker_app() -> FastAPI:
    """One worker's app (a uvicorn factory, called in each worker process): the same server, with its
    siblings' metrics socket directory."""
    from heteroflow.platform_server.assembly import build_context, create_app

    settings = ServerSettings.load()
    configure_logging(level=settings.log_level)
    ctx = build_context(settings=settings, health_settings=HealthStorageSettings.load())
    directory = worker_directory()
    if directory is not None:
        ctx.siblings = SiblingMetrics(directory, ctx.metrics.own)
    app = create_app(ctx, migrate=False)
    tune_interpreter(settings)
    watch_pauses(ctx.metrics.observe_gc_pause)
    return app
