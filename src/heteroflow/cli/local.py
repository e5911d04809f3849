"""``heteroflow up``: the platform on one machine, on embedded defaults.

Today this is the platform server on SQLite with an admin token, and simulated GPU nodes (agents reporting
simulated cards, source 'simulated') so that the platform has live data without hardware. The serving
components join it as they land.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    sim_nodes: Annotated[int, typer.Option(min=0, max=64, help="Simulated GPU nodes (8 cards each) to run")] = 2,
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
    tokens = SqlTokenStore(engine)
    now = SystemClock().now()
    _, token = tokens.create_token(name="local-admin", scopes=frozenset({Scope.ADMIN}), tenant_id=None, now=now)
    _, agent_token = tokens.create_token(name="local-agents", scopes=frozenset({Scope.AGENT}), tenant_id=None, now=now)
    server_url = f"http://127.0.0.1:{port}"
    state = {"server_url": server_url, "admin_token": token, "database_url": database_url}
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.write_text(json.dumps(state, indent=2) + "\n")
    os.chmod(state_path, 0o600)
    typer.echo(f"HeteroFlow platform server  {server_url}")
    typer.echo(f"state file                  {state_path}")
    typer.echo(f"admin token                 {token}")
    typer.echo(f"try: curl -H 'Authorization: Bearer {token}' {server_url}/api/v1/nodes")
    typer.echo(f"simulated GPU nodes         {sim_nodes} x 8 cards (source 'simulated')")
    settings = ServerSettings.load(host="127.0.0.1", port=port, database_url=database_url)
    ctx = build_context(settings=settings, health_settings=HealthStorageSettings.load(), engine=engine)
    # agents retry until the server answers, so they can start first; they stop with us
    agents = [
        subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            [
                sys.executable,
                "-m",
                "heteroflow",
                "agent",
                "run",
                "--server",
                server_url,
                "--node-name",
                f"sim-local-{n + 1:02d}",
                "--simulate",
                "8",
            ],
            env={**os.environ, "HETEROFLOW_AGENT_TOKEN": agent_token},
            stdout=subprocess.DEVNULL,
        )
        for n in range(sim_nodes)
    ]
    try:
        uvicorn.run(create_app(ctx, migrate=False), host="127.0.0.1", port=port, log_config=None, access_log=False)
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(5)
