"""Fixtures shared by every tier: databases (SQLite and a real PostgreSQL), a server harness."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
import structlog
from hypothesis import HealthCheck, settings
from sqlalchemy.engine import Engine

from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.testing import PostgresServer, PostgresUnavailableError
from tests.support.environment import load_settings_modules, settings_env_names, settings_in

# Two shared cores: a per-example deadline would fail on the machine's load, not on the code.
settings.register_profile("heteroflow", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("heteroflow")


@pytest.fixture(scope="session")
def _settings_modules() -> list[str]:
    """Every settings group loaded once, so that names only a subprocess reads are known too."""
    return load_settings_modules()


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, _settings_modules: list[str]) -> None:
    """Tests never inherit HeteroFlow settings from the shell that runs them (``tests/support/environment.py``):
    every declared prefix (``HETEROFLOW_``, ``GPU_FAULT_``, …, ``ALERT_BACKLOG_HOURS``) and every name a settings
    group reads, matched case-insensitively as the settings match them."""
    for name in settings_in(list(os.environ), settings_env_names()):
        monkeypatch.delenv(name)
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
    except PostgresUnavailableError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required in CI: {exc}")
        pytest.skip(str(exc))
    server.start()
    try:
        yield server
    finally:
        server.close()


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def new_database(backend: str, request: pytest.FixtureRequest) -> str:
    """The URL of a new empty database on ``backend`` (``sqlite`` or ``postgres``)."""
    if backend == "sqlite":
        tmp: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        return f"sqlite:///{tmp.mktemp('db') / 'heteroflow.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    if not server.running:
        server.start()  # a previous test stopped it on purpose
    return server.create_database()


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest) -> str:
    """Every storage test runs on SQLite and on a fresh database of a real PostgreSQL server."""
    return new_database(request.param, request)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_db_engine(database_url)
    upgrade_database(engine)
    yield engine
    engine.dispose()


class StatementCounter:
    """Counts the SQL statements an engine sends (every cursor execution, executemany included)."""

    def __init__(self, engine: Engine) -> None:
        self.statements: list[str] = []
        sa.event.listen(engine, "before_cursor_execute", self._record)

    def _record(self, _conn: object, _cursor: object, statement: str, *_: object) -> None:
        self.statements.append(statement)

    def reset(self) -> None:
        self.statements.clear()

    @property
    def count(self) -> int:
        return len(self.statements)

    def matching(self, prefix: str) -> list[str]:
        return [s for s in self.statements if s.lstrip().upper().startswith(prefix)]


@pytest.fixture
def statements(engine: Engine) -> StatementCounter:
    return StatementCounter(engine)
