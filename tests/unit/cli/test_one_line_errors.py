"""A command that fails on what it was given or could not reach says so in one line, with exit code 2.

Each command that opens the database runs against a refused connection (a closed local port: no DNS wait), a URL
that is no database URL, and a SQLite path it cannot create; each command that reads a file runs against a
missing one; each that calls a peer runs against a URL that is none and a peer that is not there. The line says
what failed and what to check; the traceback comes only with ``--debug`` or ``HETEROFLOW_DEBUG=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from heteroflow.cli.errors import http_url_problem
from heteroflow.cli.main import app
from heteroflow.core.testing import free_port

DATABASE_COMMANDS = [
    ["db", "upgrade"],
    ["admin", "create-token", "--scopes", "nodes:read"],
    ["admin", "revoke-token", "tok-1"],
    ["health", "tick"],
    ["sim", "generate", "--profile", "healthy", "--cards", "1", "--days", "1"],
    ["sim", "purge"],
]


def _run(args: list[str], **env: str) -> Result:
    return CliRunner(env={"HETEROFLOW_DEBUG": None, **env}).invoke(app, args)


def _one_error_line(result: Result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def refused_database() -> str:
    """A PostgreSQL URL on a local port nothing listens on: the connection is refused at once."""
    return f"postgresql://heteroflow:secret@127.0.0.1:{free_port()}/heteroflow"


@pytest.fixture
def uncreatable_sqlite(tmp_path: Path) -> str:
    """A SQLite path whose folder cannot be made: a file stands where the folder would be."""
    (tmp_path / "a-file").write_text("")
    return f"sqlite:///{tmp_path}/a-file/heteroflow.db"


@pytest.mark.parametrize("command", DATABASE_COMMANDS, ids=" ".join)
def test_a_refused_database_is_one_line(command: list[str], refused_database: str) -> None:
    line = _one_error_line(_run([*command, "--database-url", refused_database]))
    assert "cannot use the database" in line
    assert "Connection refused" in line
    assert "--database-url or HETEROFLOW_DATABASE_URL" in line


@pytest.mark.parametrize("command", DATABASE_COMMANDS, ids=" ".join)
def test_a_url_that_is_no_database_url_is_one_line(command: list[str]) -> None:
    line = _one_error_line(_run([*command, "--database-url", "bogus://nowhere"]))
    assert "unsupported database 'bogus'" in line
    assert "--database-url" in line


@pytest.mark.parametrize("command", DATABASE_COMMANDS, ids=" ".join)
def test_a_sqlite_file_that_cannot_be_made_is_one_line(command: list[str], uncreatable_sqlite: str) -> None:
    line = _one_error_line(_run([*command, "--database-url", uncreatable_sqlite]))
    assert "cannot use the file" in line
    assert "a-file" in line


def test_the_debug_variable_keeps_the_traceback(refused_database: str) -> None:
    result = _run(["db", "upgrade", "--database-url", refused_database], HETEROFLOW_DEBUG="1")
    assert result.exit_code != 0
    assert type(result.exception).__name__ == "OperationalError"  # raised as it was, not translated
    assert "error: " not in result.stderr


def test_the_debug_flag_keeps_the_traceback(refused_database: str) -> None:
    result = _run(["--debug", "db", "upgrade", "--database-url", refused_database])
    assert type(result.exception).__name__ == "OperationalError"


MISSING_FILE_COMMANDS = [
    (["health", "backtest", "--trace", "{missing}"], "does not exist"),
    (["controller", "--config", "{missing}"], "No such file"),
    (
        [
            "node-manager",
            "--controller", "http://127.0.0.1:9",
            "--pod-id", "pod-0",
            "--pod-ip", "127.0.0.1",
            "--config", "{missing}",
        ],
        "{missing}",
    ),
    (["status", "--state-file", "{missing}"], "No such file"),
    (["fault", "kill", "--rank", "0", "--state-file", "{missing}"], "No such file"),
    (["fault", "transient", "--rank", "0", "--state-file", "{missing}"], "No such file"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "says"), MISSING_FILE_COMMANDS, ids=[" ".join(command[:2]) for command, _ in MISSING_FILE_COMMANDS]
)
def test_a_missing_file_is_one_line(command: list[str], says: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.yaml")
    line = _one_error_line(_run([part.format(missing=missing) for part in command]))
    assert says.format(missing=missing) in line
    assert missing in line


def _state_file(tmp_path: Path) -> Path:
    """A local cluster's state whose services are all gone (their ports closed)."""
    url = f"http://127.0.0.1:{free_port()}"
    state = {
        "version": 1,
        "cluster_id": "gone",
        "launcher_pid": os.getpid(),
        "data_dir": str(tmp_path),
        "log_dir": str(tmp_path),
        "server_url": url,
        "controller_url": url,
        "coordinator_url": url,
        "admin_token": "hf_admin",
        "database_url": f"sqlite:///{tmp_path}/heteroflow.db",
        "controller_config": str(tmp_path / "controller.yaml"),
        "instances": [
            {
                "instance_id": "inst-1",
                "model": "m",
                "dp_size": 1,
                "endpoints": [{"id": 0, "ip": "127.0.0.1", "port": free_port(), "pod": "pod-0"}],
                "pods": [{"pod_id": "pod-0", "node_manager_url": url, "endpoint_ids": [0], "node_name": "gpu-0"}],
            }
        ],
        "processes": [],
    }
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    return path


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["fault", "kill", "--rank", "0"]], ids=" ".join)
def test_a_cluster_that_is_gone_is_one_line(command: list[str], tmp_path: Path) -> None:
    line = _one_error_line(_run([*command, "--state-file", str(_state_file(tmp_path))]))
    assert "127.0.0.1" in line
    assert "still running?" in line


@pytest.mark.parametrize("url", ["notaurl", "ftp://server", "http://", "http://server:99999"])
def test_an_agent_server_url_that_is_none_is_one_line(url: str) -> None:
    line = _one_error_line(_run(["agent", "run", "--server", url, "--token", "t", "--simulate", "1"]))
    assert "--server" in line
    assert repr(url) in line


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://server:8080", None),
        ("https://10.0.0.1", None),
        ("server:8080", "'server:8080' is not an http:// or https:// URL"),
        ("https://", "'https://' names no host"),
    ],
)
def test_http_url_problem(url: str, problem: str | None) -> None:
    assert http_url_problem(url) == problem


def test_a_usage_error_is_one_line_too() -> None:
    line = _one_error_line(_run(["health", "backtest"]))
    assert "give exactly one of --trace" in line
    assert "heteroflow health backtest --help" in line or "backtest --help" in line


@pytest.mark.parametrize("database_url", ["postgresql://heteroflow:secret@127.0.0.1:{port}/heteroflow", "bogus://x"])
def test_the_installed_command_prints_one_line(database_url: str) -> None:
    """The real entry point, as a process: `heteroflow server` and `db upgrade` on a database that is away."""
    url = database_url.format(port=free_port())
    for command in (["db", "upgrade"], ["server", "--port", str(free_port())]):
        done = subprocess.run(
            [sys.executable, "-m", "heteroflow", *command, "--database-url", url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={key: value for key, value in os.environ.items() if key != "HETEROFLOW_DEBUG"},
        )
        assert done.returncode == 2, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert "database" in errors[0]
