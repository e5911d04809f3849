"""The controller's configuration: a YAML file plus environment overrides (``serving-ft.md``, Configuration).

Precedence, highest first: command-line options, ``HETEROFLOW_…`` environment variables, the YAML file, the
defaults. Every value is checked on its own: an invalid one falls back to its default with a warning (kept
in :attr:`ControllerConfig.warnings` and shown by the status API), so a typo never becomes behaviour and
never stops the controller. A file that is not YAML, or not a mapping, is an error: that is not a value.

The file::

    controller:            # process settings (ControllerSettings)
      host: 127.0.0.1
      port: 8500
      store_url: sqlite:///var/controller/ft-runtime.db
      coordinator_url: http://127.0.0.1:8400
    fault_tolerance_config:  # FaultToleranceConfig; the same for prefill and decode
      enable_dp_scale_down: true
      dp_scale_down_config:
        execution_deadline_sec: 30
    instances:             # optional, per instance id
      inst-1: {model: my-model, fallback: EngineRelaunch}

``enable_dp_scale_down_proxy`` is derived (``enable_fault_tolerance and enable_dp_scale_down``) and pushed
to the NodeManagers; setting it is ignored with a warning.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import yaml
from pydantic import Field

from heteroflow.contracts.serving import FtFlags
from heteroflow.core.settings import LenientSettings, env_names
from heteroflow.serving.controller.core.decision import DecisionTimings
from heteroflow.serving.controller.core.gate import GateFlags
from heteroflow.serving.controller.core.runtime import FallbackStrategy
from heteroflow.serving.controller.core.topology import RoundTimings

_log = structlog.get_logger(__name__)

DERIVED_KEYS = ("enable_dp_scale_down_proxy",)


class ConfigFileError(ValueError):
    """The configuration file cannot be read as a YAML mapping."""


class ControllerSettings(LenientSettings):
    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        validation_alias=env_names("controller_host"),
        description="Bind address of the controller's HTTP API (default loopback).",
    )
    port: int = Field(
        default=8500,
        ge=1,
        le=65535,
        validation_alias=env_names("controller_port"),
        description="TCP port of the controller's HTTP API (default 8500).",
    )
    store_url: str = Field(
        default="sqlite:///var/controller/ft-runtime.db",
        min_length=1,
        validation_alias=env_names("controller_store_url"),
        description=(
            "FtRuntimeStore: sqlite:///PATH (embedded, the default) or etcd://HOST:PORT[,HOST:PORT][?prefix=P]."
        ),
    )
    store_timeout_sec: float = Field(
        default=2.0,
        gt=0,
        le=60,
        validation_alias=env_names("controller_store_timeout_sec"),
        description="Deadline of one store operation; past it the store counts as unavailable (default 2 s).",
    )
    coordinator_url: str | None = Field(
        default=None,
        validation_alias=env_names("controller_coordinator_url"),
        description="The Coordinator whose serving view the controller manages (DEL/ADD/SET); unset: none.",
    )
    cluster_token: str | None = Field(
        default=None,
        validation_alias=env_names("cluster_token"),
        description=(
            "Bearer token of every internal route: required on the controller's routes and sent to the "
            "NodeManagers and the Coordinator. Unset: the routes answer 401 unless "
            "HETEROFLOW_CONTROLLER_ALLOW_NO_TOKEN is set (local use only)."
        ),
    )
    allow_no_token: bool = Field(
        default=False,
        validation_alias=env_names("controller_allow_no_token"),
        description="Serve the internal routes without a token when none is configured (local use only).",
    )
    heartbeat_interval_sec: float = Field(
        default=5.0,
        gt=0,
        le=300,
        validation_alias=env_names("controller_heartbeat_interval_sec"),
        description="Heartbeat period the controller gives NodeManagers at registration (default 5 s).",
    )
    pod_lost_after_sec: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        validation_alias=env_names("controller_pod_lost_after_sec"),
        description="A pod silent this long is shown as lost in the status (default 30 s).",
    )
    default_model: str = Field(
        default="heteroflow-sim-moe",
        min_length=1,
        validation_alias=env_names("controller_default_model"),
        description="Served model name published to the Coordinator for instances without their own.",
    )
    leader_election: bool | None = Field(
        default=None,
        validation_alias=env_names("controller_leader_election"),
        description=(
            "Active/standby: act only while holding the leader lease in etcd. Unset: on with an etcd store, off "
            "with the embedded SQLite store (which is single-controller only; true is refused there)."
        ),
    )
    lease_ttl_sec: int = Field(
        default=10,
        ge=2,
        le=300,
        validation_alias=env_names("controller_lease_ttl_sec"),
        description="TTL of the leader lease: a standby takes over about this long after the leader dies.",
    )
    controller_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        validation_alias=env_names("controller_id"),
        description="This controller's name in the leader key (default: host name and process id).",
    )
    advertise_url: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        validation_alias=env_names("controller_advertise_url"),
        description="The URL peers reach this controller at, shown by a standby as the leader's (default: none).",
    )
    pod_replacement_namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        validation_alias=env_names("controller_pod_replacement_namespace"),
        description=(
            "Kubernetes namespace of the serving pods: a fallback deletes a pod whose card has a standing hardware "
            "fault there, for its StatefulSet to replace (needs RBAC delete on pods). Unset (a local cluster): "
            "the instance comes back without those ranks, or says why it cannot."
        ),
    )
    crash_at_step: str | None = Field(
        default=None,
        validation_alias=env_names("controller_crash_at_step"),
        description=(
            "Test hook: exit the process (code 86) when a round reaches this step (e.g. 'before_apply'). "
            "Never set it in production."
        ),
    )


class FaultToleranceConfig(LenientSettings):
    """``fault_tolerance_config``: the spec's table; ``dp_scale_down_config`` keys are flattened in."""

    enable_fault_tolerance: bool = Field(
        default=True,
        validation_alias=env_names("ft_enable_fault_tolerance"),
        description="Master switch of fault tolerance (default true).",
    )
    enable_dp_scale_down: bool = Field(
        default=False,
        validation_alias=env_names("ft_enable_dp_scale_down"),
        description="DP-domain scale-down orchestration (default false: the baseline whole-instance path).",
    )
    enable_dp_scale_up: bool = Field(
        default=False,
        validation_alias=env_names("ft_enable_dp_scale_up"),
        description="Only: stop pods whose ranks are all committed after a successful round (default false).",
    )
    enable_fast_recovery: bool = Field(
        default=False,
        validation_alias=env_names("ft_enable_fast_recovery"),
        description="Fast recovery with the engine's 'retry' instruction (F-11; default false).",
    )
    request_timeout_sec: float = Field(
        default=5.0,
        gt=0,
        le=120,
        validation_alias=env_names("ft_request_timeout_sec"),
        description="dp_scale_down_config.request_timeout_sec: one controller → NodeManager FT request (5).",
    )
    poll_interval_sec: float = Field(
        default=1.0,
        gt=0,
        le=60,
        validation_alias=env_names("ft_poll_interval_sec"),
        description="dp_scale_down_config.poll_interval_sec: status polls before and after apply (1).",
    )
    execution_deadline_sec: float = Field(
        default=30.0,
        gt=0,
        le=1200,
        validation_alias=env_names("ft_execution_deadline_sec"),
        description="dp_scale_down_config.execution_deadline_sec: each of before and after apply (30).",
    )
    apply_dispatch_budget_sec: float = Field(
        default=5.0,
        gt=0,
        le=9.0,
        validation_alias=env_names("ft_apply_dispatch_budget_sec"),
        description=(
            "dp_scale_down_config.apply_dispatch_budget_sec: the apply reaches every survivor at once within this "
            "or the round stops (5; at most 9: vLLM 0.34 fails a round whose survivors did not all get its id "
            "within 10 s)."
        ),
    )
    max_transient_query_errors: int = Field(
        default=0,
        ge=0,
        le=100,
        validation_alias=env_names("ft_max_transient_query_errors"),
        description="dp_scale_down_config.max_transient_query_errors: tolerated unknown polls (F-51; 0).",
    )
    hardware_ft_correlation_window_sec: float = Field(
        default=5.0,
        gt=0,
        le=600,
        validation_alias=env_names("ft_hardware_ft_correlation_window_sec"),
        description="Hardware-first correlation window (F-12; 5 s).",
    )
    software_fault_collection_timeout_sec: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        validation_alias=env_names("ft_software_fault_collection_timeout_sec"),
        description="Collection timeout of an incomplete snapshot, below the engine's recovery timeout (60 s).",
    )
    strategy_center_check_interval: float = Field(
        default=10.0,
        gt=0,
        le=600,
        validation_alias=env_names("ft_strategy_center_check_interval"),
        description="Fallback scan of the strategy center besides notify-on-report (F-13; 10 s).",
    )
    nudge_idle_survivors: bool = Field(
        default=False,
        validation_alias=env_names("ft_nudge_idle_survivors"),
        description="Send idle survivors one bounded probe so they meet the fault (F-54; default false).",
    )
    gate_expert_capacity: bool = Field(
        default=False,
        validation_alias=env_names("ft_gate_expert_capacity"),
        description="Refuse a round whose survivors lack expert slots (F-55; default false: a warning).",
    )
    fast_recovery_stability_sec: float = Field(
        default=2.0,
        ge=0,
        le=600,
        validation_alias=env_names("ft_fast_recovery_stability_sec"),
        description="Stability window before a fast recovery dispatches (F-59; 2 s).",
    )
    serving_view_refresh_sec: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        validation_alias=env_names("ft_serving_view_refresh_sec"),
        description="Period of the SET that converges the Coordinator's view (10 s).",
    )
    probe_timeout_sec: float = Field(
        default=5.0,
        gt=0,
        le=60,
        validation_alias=env_names("ft_probe_timeout_sec"),
        description="Timeout of the pre-commit completion probe each survivor's NodeManager sends (F-52; 5 s).",
    )
    commit_attempts: int = Field(
        default=5,
        ge=1,
        le=100,
        validation_alias=env_names("ft_commit_attempts"),
        description="finalize(commit) attempts per NodeManager before it is declared lost (F-57; 5).",
    )
    fallback_max_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        validation_alias=env_names("ft_fallback_max_attempts"),
        description=(
            "Whole-instance relaunch attempts allowed within fallback_attempt_window_sec; one more and the "
            "instance is left as INTERVENTION_REQUIRED (3, as llm-d's 3 per 30 min)."
        ),
    )
    fallback_attempt_window_sec: float = Field(
        default=1800.0,
        gt=0,
        le=7 * 86400,
        validation_alias=env_names("ft_fallback_attempt_window_sec"),
        description="The window fallback_max_attempts counts in (1800 s).",
    )
    fallback_ready_timeout_sec: float = Field(
        default=300.0,
        gt=0,
        le=7200,
        validation_alias=env_names("ft_fallback_ready_timeout_sec"),
        description=(
            "Longest wait for relaunched engines to be ready (300 s). Once an instance's engines have been "
            "relaunched, the wait is three times their measured start time (at least 30 s), within this bound."
        ),
    )

    auto_restore: bool = Field(
        default=False,
        validation_alias=env_names("ft_auto_restore"),
        description=(
            "Bring a scaled-down instance back to its configured size on its own once the capacity of every "
            "retired rank is registered again (a planned relaunch at full size; default false: only the "
            "operator's restore does it)."
        ),
    )
    auto_restore_delay_sec: float = Field(
        default=300.0,
        gt=0,
        le=7 * 86400,
        validation_alias=env_names("ft_auto_restore_delay_sec"),
        description=(
            "With auto_restore: how long an instance must have run scaled down, quiet and with its capacity back, "
            "before the controller restores it (300 s)."
        ),
    )

    @property
    def scale_down_enabled(self) -> bool:
        return self.enable_fault_tolerance and self.enable_dp_scale_down

    def flags(self) -> FtFlags:
        """What the NodeManagers get at registration and in heartbeat answers."""
        return FtFlags(
            enable_dp_scale_down_proxy=self.scale_down_enabled,
            enable_fast_recovery=self.scale_down_enabled and self.enable_fast_recovery,
            nudge_idle_survivors=self.nudge_idle_survivors,
        )

    def gate_flags(self) -> GateFlags:
        return GateFlags(
            enable_fault_tolerance=self.enable_fault_tolerance,
            enable_dp_scale_down=self.enable_dp_scale_down,
            gate_expert_capacity=self.gate_expert_capacity,
        )

    def round_timings(self) -> RoundTimings:
        return RoundTimings(
            request_timeout_sec=self.request_timeout_sec,
            poll_interval_sec=self.poll_interval_sec,
            execution_deadline_sec=self.execution_deadline_sec,
            apply_dispatch_budget_sec=self.apply_dispatch_budget_sec,
        )

    def decision_timings(self) -> DecisionTimings:
        return DecisionTimings(
            software_fault_collection_timeout_sec=self.software_fault_collection_timeout_sec,
            hardware_ft_correlation_window_sec=self.hardware_ft_correlation_window_sec,
            fast_recovery_stability_sec=self.fast_recovery_stability_sec,
        )


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    model: str | None = None
    fallback: FallbackStrategy = FallbackStrategy.INSTANCE_RECONFIGURATION
    """The deployment's original fallback (ScaleP2D for the decode instance of a P/D deployment)."""


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    settings: ControllerSettings
    ft: FaultToleranceConfig
    instances: Mapping[str, InstanceConfig] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def instance(self, instance_id: str) -> InstanceConfig:
        return self.instances.get(instance_id, InstanceConfig())


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path} is not UTF-8 text") from exc
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path} is not valid YAML: {exc}") from exc
    except RecursionError as exc:  # PyYAML composes nested collections recursively
        raise ConfigFileError(f"{path} is nested too deeply to be a configuration") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigFileError(f"{path} must hold a mapping at the top level, not {type(loaded).__name__}")
    return loaded


def _section(raw: Mapping[str, Any], name: str, warnings: list[str]) -> dict[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        warnings.append(f"'{name}' must be a mapping; ignored")
        return {}
    return dict(value)


def _without_env_set(
    group: type[LenientSettings], values: dict[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    """File values for the fields no environment variable sets (the environment wins over the file)."""
    kept: dict[str, Any] = {}
    for key, value in values.items():
        info = group.model_fields.get(key)
        if info is None:
            continue
        alias = info.validation_alias
        names = [c for c in getattr(alias, "choices", []) if isinstance(c, str) and c.isupper()]
        if any(name in environ for name in names):
            continue
        kept[key] = value
    return kept


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ControllerConfig:
    """The whole configuration; ``overrides`` (command-line options) win over everything."""
    environ = os.environ if environ is None else environ
    warnings: list[str] = []
    raw = _read_file(path) if path is not None else {}
    # YAML keys may be numbers, booleans or null as well as strings: named as text, so that they sort together
    unknown = sorted(map(str, set(raw) - {"controller", "fault_tolerance_config", "instances"}))
    if unknown:
        warnings.append(f"unknown top-level keys ignored: {', '.join(unknown)}")

    controller_values = _section(raw, "controller", warnings)
    ft_values = _section(raw, "fault_tolerance_config", warnings)
    nested = ft_values.pop("dp_scale_down_config", None)
    if isinstance(nested, dict):
        ft_values.update(nested)
    elif nested is not None:
        warnings.append("'dp_scale_down_config' must be a mapping; ignored")
    for key in DERIVED_KEYS:
        if ft_values.pop(key, None) is not None:
            warnings.append(f"{key} is derived (enable_fault_tolerance and enable_dp_scale_down); the value is ignored")
    for group, values in ((ControllerSettings, controller_values), (FaultToleranceConfig, ft_values)):
        stray = sorted(map(str, set(values) - set(group.model_fields)))
        if stray:
            warnings.append(f"unknown keys ignored: {', '.join(stray)}")

    settings = ControllerSettings.load(
        **{**_without_env_set(ControllerSettings, controller_values, environ), **(overrides or {})}
    )
    ft = FaultToleranceConfig.load(**_without_env_set(FaultToleranceConfig, ft_values, environ))
    warnings.extend(settings.config_warnings)
    warnings.extend(ft.config_warnings)

    instances: dict[str, InstanceConfig] = {}
    for instance_id, entry in _section(raw, "instances", warnings).items():
        instances[str(instance_id)] = _instance(str(instance_id), entry, warnings)
    for warning in warnings:
        _log.warning("controller.config", detail=warning)
    return ControllerConfig(settings=settings, ft=ft, instances=instances, warnings=tuple(warnings))


def _instance(instance_id: str, entry: object, warnings: list[str]) -> InstanceConfig:
    if not isinstance(entry, dict):
        warnings.append(f"instances.{instance_id} must be a mapping; defaults used")
        return InstanceConfig()
    model = entry.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        warnings.append(f"instances.{instance_id}.model must be a non-empty string; the default model is used")
        model = None
    fallback = FallbackStrategy.INSTANCE_RECONFIGURATION
    raw_fallback = entry.get("fallback")
    if raw_fallback is not None:
        try:
            fallback = FallbackStrategy(raw_fallback)
        except ValueError:
            choices = ", ".join(f.value for f in FallbackStrategy)
            warnings.append(
                f"instances.{instance_id}.fallback {raw_fallback!r} is not one of {choices}; using {fallback.value}"
            )
    return InstanceConfig(model=model, fallback=fallback)


__all__ = [
    "ConfigFileError",
    "ControllerConfig",
    "ControllerSettings",
    "FaultToleranceConfig",
    "InstanceConfig",
    "load_config",
]
