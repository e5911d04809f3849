"""``heteroflow up``: the platform on one machine, on embedded defaults.

Today this is the platform server on SQLite with an admin token; the serving components and simulated
nodes join it as they land.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from heteroflow.core.clock import SystemClock
from heteroflow.core.logs import configure_logging
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import Scope
from heteroflow.server.settings import ServerSettings
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.token_store import SqlTokenStore


def up(
    port: Annotated[int, typer.Option(help="Platform server port on 127.0.0.1")] = 8080,
    data_dir: Annotated[Path, typer.Option(help="Where the SQLite database and state file live")] = Path("var/local"),
    state_file: Annotated[Path | None, typer.Option(help="Where to write URLs and the admin token")] = None,
) -> None:
    """Run HeteroFlow locally on embedded defaults; Ctrl-C stops it."""
    import uvicorn

    from heteroflow.server.app import build_context, create_app

    data_dir.mkdir(parents=True, exist_ok=True)
    state_path = state_file or data_dir / "state.json"
    database_url = f"sqlite:///{(data_dir / 'heteroflow.db').resolve()}"
    configure_logging(level="warning", json=False)
    engine = create_db_engine(database_url)
    upgrade_database(engine)
    _, token = SqlTokenStore(engine).create_token(
        name="local-admin", scopes=frozenset({Scope.ADMIN}), tenant_id=None, now=SystemClock().now()
    )
    server_url = f"http://127.0.0.1:{port}"
    state = {"server_url": server_url, "admin_token": token, "database_url": database_url}
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.write_text(json.dumps(state, indent=2) + "\n")
    os.chmod(state_path, 0o600)
    typer.echo(f"HeteroFlow platform server  {server_url}")
    typer.echo(f"state file                  {state_path}")
    typer.echo(f"admin token                 {token}")
    typer.echo(f"try: curl -H 'Authorization: Bearer {token}' {server_url}/api/v1/nodes")
    settings = ServerSettings.load(host="127.0.0.1", port=port, database_url=database_url)
    ctx = build_context(settings=settings, health_settings=HealthStorageSettings.load(), engine=engine)
    uvicorn.run(create_app(ctx, migrate=False), host="127.0.0.1", port=port, log_config=None, access_log=False)
