"""The real monitoring stack for tests: ``promtool``, a Prometheus server and an Alertmanager, as processes.

The binaries are Debian's (``prometheus``, ``prometheus-alertmanager``; ``scripts/install-system-deps`` installs
them). A test that needs one and cannot find it is skipped, loudly, with the package to install, except under
``CI=true``, where a missing binary is a failure: CI must run these against the real programs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from heteroflow.core.testing import free_port
from heteroflow.http.tls import client_tls

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "heteroflow-alerts.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "heteroflow-alerts.test.yaml"
DASHBOARD = REPO / "docs" / "grafana-gpu-dashboard.json"

_BINARIES = {
    "promtool": ("promtool", "prometheus"),
    "prometheus": ("prometheus", "prometheus"),
    "alertmanager": ("prometheus-alertmanager", "prometheus-alertmanager"),
}


def binary(name: str) -> str:
    """The path of ``promtool``, ``prometheus`` or ``alertmanager``; skipped (failed under CI) when missing."""
    command, package = _BINARIES[name]
    found = shutil.which(command) or (shutil.which("alertmanager") if name == "alertmanager" else None)
    if found is None:
        reason = f"{command} is not installed (Debian package {package!r}; scripts/install-system-deps installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: required in CI")
        pytest.skip(reason)
    return found


def promtool(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, *, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/-/ready", timeout=2, verify=client_tls()).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready within {within} s: {log.read_text()[-2000:]}")
        time.sleep(0.1)  # the readiness poll period, with a deadline


@contextlib.contextmanager
def _process(argv: list[str], *, url: str, log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(url, process, log)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: tuple[str, ...]
    """host:port"""
    token: str


@dataclass(frozen=True)
class Prometheus:
    url: str

    def query(self, expr: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10, verify=client_tls())
        body: dict[str, Any] = response.json()
        return body

    def vector(self, expr: str) -> list[dict[str, Any]]:
        body = self.query(expr)
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.url}/api/v1/targets", timeout=10, verify=client_tls()).json()
        active: list[dict[str, Any]] = body["data"]["activeTargets"]
        return active

    def metric_names(self) -> set[str]:
        """Every name with a stored sample, and every family the targets declared (``# TYPE``), samples or not
        (a labelled counter has no sample until its first increment)."""
        stored = set(
            httpx.get(f"{self.url}/api/v1/label/__name__/values", timeout=10, verify=client_tls()).json()["data"]
        )
        declared = httpx.get(f"{self.url}/api/v1/metadata", timeout=10, verify=client_tls()).json()["data"]
        return stored | set(declared)

    def rule_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = httpx.get(f"{self.url}/api/v1/rules", timeout=10, verify=client_tls()).json()[
            "data"
        ]["groups"]
        return groups


@contextlib.contextmanager
def prometheus(tmp: Path, jobs: list[ScrapeJob], *, rule_files: tuple[Path, ...] = ()) -> Iterator[Prometheus]:
    """A Prometheus scraping ``jobs`` every second, each with its bearer token (in a file only it reads)."""
    exe = binary("prometheus")
    tmp.mkdir(parents=True, exist_ok=True)
    scrape_configs = []
    for job in jobs:
        token_file = tmp / f"{job.name}.token"
        token_file.write_text(job.token)
        token_file.chmod(0o600)
        scrape_configs.append(
            {
                "job_name": job.name,
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "static_configs": [{"targets": list(job.targets)}],
            }
        )
    config: Mapping[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": scrape_configs,
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(dict(config)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        exe,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with _process(argv, url=url, log=tmp / "prometheus.log"):
        yield Prometheus(url)


@dataclass(frozen=True)
class Alertmanager:
    url: str

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v2/alerts", params=filters, timeout=10, verify=client_tls())
        response.raise_for_status()
        found: list[dict[str, Any]] = response.json()
        return found


@contextlib.contextmanager
def alertmanager(tmp: Path) -> Iterator[Alertmanager]:
    """An Alertmanager with one receiver that sends nowhere (the test reads its v2 API), no clustering."""
    exe = binary("alertmanager")
    tmp.mkdir(parents=True, exist_ok=True)
    config = {
        "route": {"receiver": "test", "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "test"}],
    }
    (tmp / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        exe,
        f"--config.file={tmp / 'alertmanager.yml'}",
        f"--storage.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    with _process(argv, url=url, log=tmp / "alertmanager.log"):
        yield Alertmanager(url)
