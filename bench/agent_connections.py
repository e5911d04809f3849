"""Connections real agents open: ``heteroflow agent run`` processes beating a real ``heteroflow server``.

Starts a server on a fresh SQLite file and ``--agents`` agent processes (8 simulated cards each, the default 5 s
interval), waits ``--warmup-seconds`` for every node to register and beat, then for ``--seconds`` reads the
server's established connections every 0.2 s (``ss``, by the client's port) and its accepted heartbeats (its
``heteroflow_heartbeats_total``). It prints the beats, the connections opened in the window (seen in it but not
open at its start; one that lived less than 0.2 s may be missed), and their ratio: 1.0 is a connection per beat, 0
a connection kept across beats. Usage::

    .venv/bin/python bench/agent_connections.py [--agents 20] [--seconds 40] [--warmup-seconds 15]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.ingest
from bench.ingest import heteroflow, wait_answering
from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls


def client_ports(port: int) -> set[int]:
    """The client ports of the connections established to the server's ``port`` (``ss`` from iproute2)."""
    lines = subprocess.run(
        ["ss", "-Htn", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return {int(line.split()[-1].rsplit(":", 1)[1]) for line in lines if line.strip()}


def heartbeats(url: str, token: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, verify=client_tls()).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("heteroflow_heartbeats_total")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--warmup-seconds", type=float, default=15.0)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="hf-agents-"))
    database_url = f"sqlite:///{workdir}/bench.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")}
    agent_token = heteroflow("admin", "create-token", "--scopes", "agent", "--database-url", database_url, env=env)
    admin_token = heteroflow("admin", "create-token", "--scopes", "admin", "--database-url", database_url, env=env)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    quiet = {**env, "HETEROFLOW_LOG_LEVEL": "warning"}
    server = subprocess.Popen(
        [sys.executable, "-m", "heteroflow", "server", "--port", str(port), "--database-url", database_url],
        env=quiet,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    agents: list[subprocess.Popen[bytes]] = []
    try:
        wait_answering(f"{url}/healthz", admin_token, what="the server")
        for i in range(args.agents):
            agent_env = {
                **quiet,
                "HETEROFLOW_AGENT_SERVER_URL": url,
                "HETEROFLOW_AGENT_TOKEN": agent_token,
                "HETEROFLOW_AGENT_STATE_DIR": str(workdir / f"agent-{i}"),
                "HETEROFLOW_AGENT_NODE_NAME": f"bench-{i:04d}",
                "HETEROFLOW_AGENT_SIMULATE_GPUS": "8",
            }
            agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "heteroflow", "agent", "run"],
                    env=agent_env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        time.sleep(args.warmup_seconds)  # the agents' start-up and first beats: not measured
        at_start = client_ports(port)
        seen: set[int] = set()
        established: list[int] = []
        beats_before = heartbeats(url, admin_token)
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            ports = client_ports(port)
            established.append(len(ports))
            seen |= ports
            time.sleep(0.2)  # the sampling period
        beats = heartbeats(url, admin_token) - beats_before
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            agent.wait(15)
        server.terminate()
        server.wait(15)

    print(f"{args.agents} agents at the default 5 s interval, {args.seconds:.0f} s after {args.warmup_seconds:.0f} s")
    at_once = f"{min(established)}-{max(established)}"
    print(
        f"beats {beats:.0f}; connections opened {len(seen - at_start)} (established at once: {at_once}); "
        f"connections opened per beat {len(seen - at_start) / beats:.2f}"
    )
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
