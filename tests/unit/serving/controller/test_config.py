"""The controller's configuration: YAML file, environment overrides, defaults, invalid → default + warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from heteroflow.serving.controller.config import ConfigFileError, FaultToleranceConfig, load_config
from heteroflow.serving.controller.core.runtime import FallbackStrategy


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(text)
    return path


def test_defaults_are_the_specs_table() -> None:
    cfg = load_config(None, environ={})
    ft = cfg.ft
    assert (ft.enable_fault_tolerance, ft.enable_dp_scale_down, ft.enable_dp_scale_up) == (True, False, False)
    assert (ft.enable_fast_recovery, ft.nudge_idle_survivors, ft.gate_expert_capacity) == (False, False, False)
    assert (ft.request_timeout_sec, ft.poll_interval_sec, ft.execution_deadline_sec) == (5.0, 1.0, 30.0)
    assert ft.max_transient_query_errors == 0
    assert ft.hardware_ft_correlation_window_sec == 5.0
    assert ft.strategy_center_check_interval == 10.0
    assert ft.flags().enable_dp_scale_down_proxy is False
    assert cfg.settings.host == "127.0.0.1"  # loopback unless told otherwise
    assert cfg.warnings == ()


def test_file_values_nested_section_and_instances(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
controller:
  port: 9000
  coordinator_url: http://127.0.0.1:8400
fault_tolerance_config:
  enable_dp_scale_down: true
  enable_fast_recovery: true
  dp_scale_down_config:
    execution_deadline_sec: 12.5
    max_transient_query_errors: 2
instances:
  inst-7: {model: big-moe, fallback: EngineRelaunch}
""",
    )
    cfg = load_config(path, environ={})
    assert cfg.settings.port == 9000
    assert cfg.ft.execution_deadline_sec == 12.5
    assert cfg.ft.max_transient_query_errors == 2
    flags = cfg.ft.flags()
    assert flags.enable_dp_scale_down_proxy is True
    assert flags.enable_fast_recovery is True
    assert cfg.instance("inst-7").fallback == FallbackStrategy.ENGINE_RELAUNCH
    assert cfg.instance("inst-7").model == "big-moe"
    assert cfg.instance("other").fallback == FallbackStrategy.INSTANCE_RECONFIGURATION
    assert cfg.warnings == ()


def test_environment_wins_over_the_file_and_options_win_over_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "controller: {port: 9000}\nfault_tolerance_config: {poll_interval_sec: 3}\n")
    monkeypatch.setenv("HETEROFLOW_FT_POLL_INTERVAL_SEC", "0.5")
    monkeypatch.setenv("HETEROFLOW_CONTROLLER_PORT", "9100")
    cfg = load_config(path)
    assert cfg.ft.poll_interval_sec == 0.5
    assert cfg.settings.port == 9100
    assert load_config(path, overrides={"port": 9200}).settings.port == 9200


def test_invalid_values_fall_back_with_warnings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
fault_tolerance_config:
  enable_dp_scale_down_proxy: true
  execution_deadline_sec: -3
  dp_scale_down_config: {poll_interval_sec: soon}
  bogus: 1
instances:
  a: {fallback: Pray}
  b: 7
surprise: {}
""",
    )
    cfg = load_config(path, environ={})
    assert cfg.ft.execution_deadline_sec == 30.0
    assert cfg.ft.poll_interval_sec == 1.0
    assert cfg.ft.flags().enable_dp_scale_down_proxy is False  # derived, never set
    text = "\n".join(cfg.warnings)
    for fragment in (
        "enable_dp_scale_down_proxy is derived",
        "-3",
        "'soon'",
        "bogus",
        "Pray",
        "instances.b",
        "surprise",
    ):
        assert fragment in text
    assert cfg.instance("a").fallback == FallbackStrategy.INSTANCE_RECONFIGURATION


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"key: [unclosed", "not valid YAML"),
        (b"- a\n- b\n", "mapping"),
        (b"\xff\xfe", "UTF-8"),
        (b"controller: " + b"[" * 5000 + b"]" * 5000, "nested too deeply"),  # was a RecursionError
    ],
)
def test_a_file_that_is_not_a_yaml_mapping_is_an_error(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigFileError, match=fragment):
        load_config(path, environ={})


def test_keys_that_are_not_strings_are_named_in_the_warnings(tmp_path: Path) -> None:
    """YAML keys may be numbers, booleans or null: sorting them with strings was a TypeError."""
    path = tmp_path / "keys.yaml"
    path.write_text("1: a\nb: c\nnull: d\ncontroller: {2: x, host: 10.0.0.1, true: y}\n")
    cfg = load_config(path, environ={})
    assert cfg.settings.host == "10.0.0.1"
    assert "unknown top-level keys ignored: 1, None, b" in cfg.warnings
    assert "unknown keys ignored: 2, True" in cfg.warnings


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_config(tmp_path / "absent.yaml", environ={})


def test_scale_down_needs_both_switches() -> None:
    assert (
        FaultToleranceConfig.load(enable_dp_scale_down=True, enable_fault_tolerance=False).scale_down_enabled is False
    )
    assert FaultToleranceConfig.load(enable_dp_scale_down=True).flags().enable_dp_scale_down_proxy is True
    off = FaultToleranceConfig.load(enable_fast_recovery=True)
    assert off.flags().enable_fast_recovery is False  # fast recovery only with scale-down on (F-11)


def test_polls_start_quick_and_settle_at_the_period() -> None:
    from itertools import islice

    from heteroflow.serving.controller.strategy import poll_pauses

    pauses = list(islice(poll_pauses(1.0), 26))
    assert pauses[:20] == [0.05] * 20  # quick for the first second, while rebuilds usually end
    assert pauses[20:] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert list(islice(poll_pauses(0.02), 60)) == [0.02] * 60
