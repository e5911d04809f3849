"""Every configuration variable: an invalid value gives the default plus a warning (H-25)."""

from __future__ import annotations

import pytest
from pydantic import AliasChoices

from heteroflow.agent.settings import AgentSettings
from heteroflow.core.settings import LenientSettings
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.serving.controller.config import ControllerSettings, FaultToleranceConfig

GROUPS: list[type[LenientSettings]] = [
    HealthStorageSettings,
    ServerSettings,
    AgentSettings,
    PredictionSettings,
    AlertDeliverySettings,
    GpuMetricsSettings,
    ControllerSettings,
    FaultToleranceConfig,
]


def env_names(group: type[LenientSettings], field: str) -> list[str]:
    alias = group.model_fields[field].validation_alias
    assert isinstance(alias, AliasChoices)
    return [str(name) for name in alias.choices if isinstance(name, str) and name.isupper()]


# free-form strings whose every value is legal (an empty token or node name means "not set")
FREE_TEXT = {
    "token",
    "node_name",
    "webhook_url",
    "alertmanager_url",
    "coordinator_url",
    "cluster_token",
    "crash_at_step",
    "kernel_log",  # a path, or empty: not read
}
SPECIAL = {
    "port": ["abc", "0", "70000"],
    "log_level": ["", "loud"],
    "simulate_gpus": ["abc", "-5"],  # 0 is the default: real hardware
    "max_transient_query_errors": ["abc", "-1"],  # 0 is the RFC's default
    "fast_recovery_stability_sec": ["abc", "-1"],  # 0: dispatch at once
    "flush_spread_seconds": ["abc", "-1"],  # 0: the slices back to back
    "gc_young_threshold": ["abc", "-1"],  # 0: the collector left as it is
    "collector": ["", "magic"],
    "window_days": ["abc", "14", "0", "7.5"],  # 7 or 30 only
}


def invalid_values(group: type[LenientSettings], field: str) -> list[str]:
    if field in FREE_TEXT:
        return []
    if field in SPECIAL:
        return SPECIAL[field]
    annotation = group.model_fields[field].annotation
    if annotation is bool:
        return ["abc", "maybe"]
    if annotation in (int, float):
        return ["abc", "-5", "0"]
    return [""]


CASES = [
    (group, field, name, value)
    for group in GROUPS
    for field in group.model_fields
    for name in env_names(group, field)
    for value in invalid_values(group, field)
    # 0 is a legal cache time (no caching)
    if not (field in ("auth_cache_seconds", "node_cache_seconds") and value == "0")
]


@pytest.mark.parametrize(("group", "field", "name", "value"), CASES, ids=lambda c: str(getattr(c, "__name__", c)))
def test_invalid_value_falls_back_to_default_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, group: type[LenientSettings], field: str, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    loaded = group.load()
    default = group.model_fields[field].get_default(call_default_factory=True)
    assert getattr(loaded, field) == default
    assert len(loaded.config_warnings) == 1
    assert name in loaded.config_warnings[0]
    assert repr(value) in loaded.config_warnings[0]


@pytest.mark.parametrize("name", ["GPU_FAULT_PREDICT_WINDOW_DAYS", "HETEROFLOW_GPU_FAULT_PREDICT_WINDOW_DAYS"])
def test_the_30_day_window_is_read_from_text(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # an environment variable is text, and a literal of numbers does not coerce "30" by itself
    monkeypatch.setenv(name, " 30 ")
    loaded = PredictionSettings.load()
    assert loaded.window_days == 30
    assert loaded.config_warnings == ()
    assert PredictionSettings.load(window_days="7").window_days == 7  # health backtest --param window_days=7


def test_every_field_is_described() -> None:
    for group in GROUPS:
        for field, info in group.model_fields.items():
            assert info.description, f"{group.__name__}.{field} has no description"


def test_seed_names_are_read_as_written_and_the_prefix_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_HEALTH_RETENTION_DAYS", "90")
    assert HealthStorageSettings.load().retention_days == 90
    monkeypatch.setenv("HETEROFLOW_GPU_HEALTH_RETENTION_DAYS", "30")
    loaded = HealthStorageSettings.load()
    assert loaded.retention_days == 30
    assert loaded.config_warnings == ()


def test_valid_values_and_explicit_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_SERVER_PORT", "9000")
    monkeypatch.setenv("HETEROFLOW_DATABASE_URL", "postgresql://u@db/heteroflow")
    loaded = ServerSettings.load(host="0.0.0.0")
    assert (loaded.host, loaded.port, loaded.database_url) == ("0.0.0.0", 9000, "postgresql://u@db/heteroflow")
    assert ServerSettings.load().host == "127.0.0.1"  # loopback unless told otherwise


def test_an_invalid_explicit_override_also_falls_back() -> None:
    loaded = HealthStorageSettings.load(keepalive_seconds=-1)
    assert loaded.keepalive_seconds == 300
    assert loaded.config_warnings


def test_docs_list_every_variable() -> None:
    from pathlib import Path

    from heteroflow.engine_sim.settings import EngineSimSettings
    from heteroflow.serving.controller.monitor.settings import ResourceMonitorSettings
    from heteroflow.serving.node_manager.settings import NodeManagerSettings

    text = (Path(__file__).parents[3] / "docs" / "configuration.md").read_text()
    groups: list[type[LenientSettings]] = [*GROUPS, EngineSimSettings, NodeManagerSettings, ResourceMonitorSettings]
    for group in groups:
        for field in group.model_fields:
            for name in env_names(group, field):
                assert f"`{name}`" in text, f"{name} is missing from docs/configuration.md"
