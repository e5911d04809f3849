"""What idle keep-alive connections cost a real ``heteroflow server``: its resident size before and after.

Every agent keeps its connection open between beats, so a server of a 10,000-node fleet holds 10,000 connections
that are idle nearly all the time. This starts a server on a fresh SQLite file, opens ``--connections``
connections, sends one authenticated ``GET /healthz`` on each and reads its answer, keeps them all open, and
prints the server's resident size (VmRSS) before and after, and the difference per connection. Usage::

    .venv/bin/python bench/idle_connections.py [--connections 10000]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.ingest
from bench.ingest import heteroflow, wait_answering
from bench.soak_report import rss_mib
from heteroflow.core.testing import free_port


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000)
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < args.connections + 100:
        raise SystemExit(f"the hard limit on open files ({hard}) is under {args.connections} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process's sockets; the server raises its own

    database_url = f"sqlite:///{tempfile.mkdtemp(prefix='hf-idle-')}/bench.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")}
    token = heteroflow("admin", "create-token", "--scopes", "admin", "--database-url", database_url, env=env)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "heteroflow", "server", "--port", str(port), "--database-url", database_url],
        env={**env, "HETEROFLOW_LOG_LEVEL": "warning"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    request = f"GET /healthz HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    sockets: list[socket.socket] = []
    try:
        wait_answering(f"http://127.0.0.1:{port}/healthz", token, what="the server")
        time.sleep(1.0)  # settle: the start-up's last allocations
        before = rss_mib(server.pid)
        for _ in range(args.connections):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(request)
            sockets.append(sock)
        answered = sum(sock.recv(4096).startswith(b"HTTP/1.1 200") for sock in sockets)
        time.sleep(1.0)  # settle: the answers' last frees
        after = rss_mib(server.pid)
    finally:
        for sock in sockets:
            sock.close()
        server.terminate()
        server.wait(15)
    if before is None or after is None:
        raise SystemExit("the server had gone before its resident size was read")
    print(f"{args.connections} idle connections, {answered} answered 200")
    print(
        f"server RSS {before:.1f} -> {after:.1f} MiB: +{after - before:.1f} MiB, "
        f"{(after - before) * 1024 / args.connections:.1f} KiB per idle connection"
    )
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
