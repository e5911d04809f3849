"""A real ``heteroflow server`` process on SQLite, and a fake ``nvidia-smi`` on a private PATH."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls

REPO = Path(__file__).resolve().parents[3]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
OWN_FIXTURES = REPO / "tests" / "fixtures" / "agent"


def heteroflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "heteroflow", *args], capture_output=True, text=True, timeout=60, check=False
    )


@dataclass
class ServerProcess:
    database_url: str
    port: int
    token: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "heteroflow",
                "server",
                "--port",
                str(self.port),
                "--database-url",
                self.database_url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"{self.url}/healthz", headers=self.headers, timeout=2, verify=client_tls())
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("the server did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, path: str, **params: object) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", params=params, headers=self.headers, timeout=10, verify=client_tls())  # type: ignore[arg-type]


def start_server(tmp: Path) -> ServerProcess:
    database_url = f"sqlite:///{tmp / 'heteroflow.db'}"
    result = heteroflow("admin", "create-token", "--scopes", "agent,nodes:read", "--database-url", database_url)
    assert result.returncode == 0, result.stderr
    server = ServerProcess(database_url=database_url, port=free_port(), token=result.stdout.strip().splitlines()[-1])
    server.start()
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("server"))
    try:
        yield server
    finally:
        server.stop()


def fake_smi_path(tmp: Path) -> Path:
    """A folder holding an executable ``nvidia-smi`` that runs the fake script with this interpreter."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{OWN_FIXTURES / "fake_nvidia_smi.py"}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def agent_env(bin_dir: Path, **fake: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETEROFLOW_", "GPU_HEALTH_", "FAKE_NVIDIA"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"
    env["HETEROFLOW_AGENT_KERNEL_LOG"] = ""  # the host's own kernel log is not the test's
    env.update(fake)
    return env


def poll(check: object, *, timeout_sec: float = 20.0, every_sec: float = 0.1) -> object:
    """Call ``check`` until it returns something truthy or the deadline passes (then fail)."""
    assert callable(check)
    deadline = time.monotonic() + timeout_sec
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_sec} s (last value {value!r})")
        time.sleep(every_sec)
