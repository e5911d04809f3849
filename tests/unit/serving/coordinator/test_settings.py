"""Coordinator settings: defaults, the environment, invalid values → default + warning, and the docs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import AliasChoices

from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.coordinator.testing import TEST_API_KEY, TEST_API_KEY_SHA256


def env_names(field: str) -> list[str]:
    alias = CoordinatorSettings.model_fields[field].validation_alias
    assert isinstance(alias, AliasChoices)
    return [str(name) for name in alias.choices if isinstance(name, str) and name.isupper()]


def test_defaults_are_secure_and_on_loopback() -> None:
    settings = CoordinatorSettings.load()
    assert (settings.host, settings.port) == ("127.0.0.1", 8400)
    assert settings.cluster_token is None
    assert settings.api_key_digests == frozenset()
    assert settings.platform_url is None
    assert settings.client_deadline_sec == 30.0
    assert (settings.faulted_first_byte_sec, settings.fault_pause_sec) == (1.0, 1.0)
    assert settings.max_body_bytes == 1024 * 1024
    assert (settings.upstream_connect_timeout_sec, settings.upstream_first_byte_timeout_sec) == (2.0, 60.0)
    assert settings.upstream_total_timeout_sec == 600.0
    assert settings.platform_token_cache_sec == 30.0
    assert settings.config_warnings == ()


def test_the_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_CLUSTER_TOKEN", "tok")
    monkeypatch.setenv("HETEROFLOW_COORDINATOR_PORT", "9400")
    monkeypatch.setenv("HETEROFLOW_COORDINATOR_API_KEY_HASHES", f" {TEST_API_KEY_SHA256.upper()} ,{'a' * 64},")
    monkeypatch.setenv("HETEROFLOW_COORDINATOR_PLATFORM_URL", "https://platform.example/")
    settings = CoordinatorSettings.load()
    assert settings.cluster_token == "tok"
    assert settings.port == 9400
    assert settings.api_key_digests == {TEST_API_KEY_SHA256, "a" * 64}
    assert settings.platform_url == "https://platform.example"


@pytest.mark.parametrize(
    ("name", "value", "field", "default"),
    [
        ("HETEROFLOW_COORDINATOR_PORT", "0", "port", 8400),
        ("HETEROFLOW_COORDINATOR_CLIENT_DEADLINE_SEC", "-1", "client_deadline_sec", 30.0),
        ("HETEROFLOW_COORDINATOR_UNAVAILABLE_WAIT_SEC", "-1", "client_deadline_sec", 30.0),
        ("HETEROFLOW_COORDINATOR_FAULTED_FIRST_BYTE_SEC", "0", "faulted_first_byte_sec", 1.0),
        ("HETEROFLOW_COORDINATOR_MAX_BODY_BYTES", "lots", "max_body_bytes", 1024 * 1024),
        ("HETEROFLOW_COORDINATOR_UPSTREAM_CONNECT_TIMEOUT_SEC", "0", "upstream_connect_timeout_sec", 2.0),
        ("HETEROFLOW_COORDINATOR_PLATFORM_URL", "platform:8080", "platform_url", None),
        ("HETEROFLOW_COORDINATOR_LOG_LEVEL", "loud", "log_level", "info"),
    ],
)
def test_an_invalid_value_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, field: str, default: object
) -> None:
    monkeypatch.setenv(name, value)
    settings = CoordinatorSettings.load()
    assert getattr(settings, field) == default
    assert any(name in warning for warning in settings.config_warnings)


def test_a_key_pasted_into_the_digest_list_closes_the_door_and_is_never_repeated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HETEROFLOW_COORDINATOR_API_KEY_HASHES", f"{TEST_API_KEY_SHA256},{TEST_API_KEY}")
    settings = CoordinatorSettings.load()
    assert settings.api_key_digests == frozenset()
    (warning,) = settings.config_warnings
    assert "HETEROFLOW_COORDINATOR_API_KEY_HASHES" in warning
    assert TEST_API_KEY not in warning


def test_a_blank_cluster_token_is_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_CLUSTER_TOKEN", "  ")
    assert CoordinatorSettings.load().cluster_token is None


def test_docs_list_every_variable() -> None:
    text = (Path(__file__).parents[4] / "docs" / "configuration.md").read_text()
    start = text.index("## Coordinator")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    for field in CoordinatorSettings.model_fields:
        for name in env_names(field):
            assert f"`{name}`" in section, f"{name} is missing from the Coordinator section of docs/configuration.md"


def test_the_coordinator_guide_lists_every_variable_and_route() -> None:
    from heteroflow.contracts import serving as wire

    text = (Path(__file__).parents[4] / "docs" / "coordinator.md").read_text()
    for field in CoordinatorSettings.model_fields:
        for name in env_names(field):
            assert f"`{name}`" in text, f"{name} is missing from docs/coordinator.md"
    for path in (
        wire.COORDINATOR_DEL_PATH,
        wire.COORDINATOR_ADD_PATH,
        wire.COORDINATOR_SET_PATH,
        wire.COORDINATOR_INSTANCES_PATH,
    ):
        assert path in text
