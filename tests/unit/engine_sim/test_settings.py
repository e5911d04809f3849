from __future__ import annotations

import pytest

from heteroflow.engine_sim.settings import EngineSimSettings, Topology
from heteroflow.engine_sim.state import ConfigurationError


def test_defaults() -> None:
    settings = EngineSimSettings.load()
    assert settings.host == "127.0.0.1"
    assert settings.ft_profile == "vllm-0.34"
    assert settings.ft_path_prefix is None
    assert settings.effective_ft_path_prefix == "/v1"
    assert settings.engine_recovery_timeout_sec == 120.0


def test_invalid_values_fall_back_to_defaults_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_ENGINE_FT_PATH_PREFIX", "/v 1")
    monkeypatch.setenv("HETEROFLOW_ENGINE_SIM_COLLECTIVE_TIMEOUT_SEC", "-3")
    monkeypatch.setenv("HETEROFLOW_ENGINE_RECOVERY_TIMEOUT_SEC", "30")
    monkeypatch.setenv("HETEROFLOW_CLUSTER_TOKEN", "secret-token")
    settings = EngineSimSettings.load()
    assert settings.effective_ft_path_prefix == "/v1"
    assert settings.collective_timeout_sec == 10.0
    assert settings.engine_recovery_timeout_sec == 30.0
    assert settings.cluster_token == "secret-token"
    assert len(settings.config_warnings) == 2
    assert all("secret-token" not in w for w in settings.config_warnings)


def test_prefix_is_normalised() -> None:
    assert EngineSimSettings.load(ft_path_prefix="v1/").ft_path_prefix == "/v1"
    assert EngineSimSettings.load(ft_path_prefix="").ft_path_prefix == ""


def test_topology_defaults_slots_from_experts() -> None:
    assert Topology(dp_size=4, dp_rank=0, master_addr="127.0.0.1", master_port=1).effective_slots_per_rank == 3
    with pytest.raises(ConfigurationError, match="are 3 physical experts per rank"):
        Topology(dp_size=4, dp_rank=0, master_addr="h", master_port=1, slots_per_rank=1).validate()
    # a relaunch of 3 survivors keeps the slots per rank and recomputes the redundancy: 3 x 3 - 8 = 1
    Topology(dp_size=3, dp_rank=2, master_addr="h", master_port=1, num_redundant_experts=1, slots_per_rank=3).validate()
    with pytest.raises(ConfigurationError, match="Got 12 experts and 5 EP ranks"):
        Topology(dp_size=5, dp_rank=0, master_addr="h", master_port=1).validate()


def test_the_released_profile_has_no_route_prefix_unless_one_is_set() -> None:
    assert EngineSimSettings.load(ft_profile="vllm-released").effective_ft_path_prefix == ""
    assert EngineSimSettings.load(ft_profile="vllm-released").ft_profile == "vllm-0.32"  # the older name stays
    assert EngineSimSettings.load(ft_profile="scale-down").ft_profile == "vllm-0.34"
    assert EngineSimSettings.load(ft_profile="vllm-released", ft_path_prefix="/x").effective_ft_path_prefix == "/x"
