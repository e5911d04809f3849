"""No test inherits a HeteroFlow setting from the shell that runs it (``tests/support/environment.py``).

``tests/conftest.py`` clears, before every test, each environment variable that is a HeteroFlow setting. These
tests check that the rule it uses covers every name every settings group reads, and nothing else.
"""

from __future__ import annotations

import os

import pytest

from heteroflow.core.settings import LenientSettings
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.platform_server.settings import ServerSettings
from tests.support.environment import (
    NAMES,
    PREFIXES,
    env_names_of,
    is_declared,
    load_settings_modules,
    settings_env_names,
    settings_groups,
    settings_in,
)


@pytest.fixture(scope="module")
def groups() -> list[type[LenientSettings]]:
    load_settings_modules()
    return settings_groups()


def test_every_module_that_defines_a_settings_group_is_loaded(groups: list[type[LenientSettings]]) -> None:
    modules = {group.__module__ for group in groups}
    assert set(load_settings_modules()) <= modules
    assert {"heteroflow.platform_server.settings", "heteroflow.health.prediction_settings"} <= modules


def test_every_upper_case_name_a_group_reads_is_declared(groups: list[type[LenientSettings]]) -> None:
    """A group that reads a new kind of name (a new prefix of the design) must declare it for the test run."""
    undeclared = sorted(
        f"{name} ({group.__module__}.{group.__qualname__})"
        for group in groups
        for name in env_names_of(group)
        if name.isupper() and not is_declared(name)
    )
    assert not undeclared, f"add these to PREFIXES or NAMES in tests/support/environment.py: {undeclared}"


def test_the_design_names_of_the_prediction_engine_and_alerts_are_cleared() -> None:
    names = env_names_of(PredictionSettings)
    assert {"GPU_FAULT_PREDICT_RATIO", "GPU_FAULT_PREDICTED_ALERT_ENABLED", "ALERT_BACKLOG_HOURS"} <= names
    known = settings_env_names([PredictionSettings])
    assert set(settings_in(names, known)) == names


def test_names_are_matched_in_any_case_and_bare_field_names_are_not_settings() -> None:
    """The environment is matched case-insensitively; a bare field name (``DATABASE_URL``) is no setting."""
    known = settings_env_names([ServerSettings])
    environ = ["DATABASE_URL", "database_url", "Log_Level", "heteroflow_server_port", "PATH", "HOME", "CI", "TZ"]
    assert settings_in(environ, known) == ["heteroflow_server_port"]


def test_the_rule_clears_nothing_that_is_not_a_setting(groups: list[type[LenientSettings]]) -> None:
    known = settings_env_names(groups)
    ordinary = ["PATH", "HOME", "USER", "LANG", "CI", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR", "DISPLAY", "PGDATA"]
    assert settings_in(ordinary, known) == []
    assert "GPU_FAULT_" in PREFIXES
    assert "ALERT_BACKLOG_HOURS" in NAMES


def test_the_running_test_sees_no_setting_from_the_shell(groups: list[type[LenientSettings]]) -> None:
    """What the autouse fixture left: no HeteroFlow setting at all (a leftover would change defaults silently)."""
    assert settings_in(list(os.environ), settings_env_names(groups)) == []


def test_a_generic_shell_variable_does_not_configure_a_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """``DATABASE_URL`` or ``LOG_LEVEL`` meant for another program never reach a service; the prefixed names do."""
    monkeypatch.setenv("DATABASE_URL", "sqlite:////nonexistent/from-the-shell.db")
    monkeypatch.setenv("log_level", "debug")
    loaded = ServerSettings.load()
    assert loaded.database_url != "sqlite:////nonexistent/from-the-shell.db"
    assert loaded.log_level == ServerSettings.model_fields["log_level"].get_default()
    monkeypatch.setenv("HETEROFLOW_DATABASE_URL", "sqlite:////srv/heteroflow.db")
    assert ServerSettings.load().database_url == "sqlite:////srv/heteroflow.db"
    assert ServerSettings.load(database_url="sqlite:////x.db").database_url == "sqlite:////x.db"  # by field name
