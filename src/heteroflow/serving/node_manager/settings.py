"""NodeManager settings, grouped by concern; CLI options override the environment (``HETEROFLOW_…``).

The fault-tolerance switches (scale-down proxy, fast recovery, idle nudge) are not here: the controller
derives them and pushes them at registration (``serving-ft.md`` configuration table), so a pod can never
disagree with its controller about them. Until registration succeeds the FT routes answer 404.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from heteroflow.contracts.engine_protocol import normalize_prefix
from heteroflow.core.settings import LenientSettings, env_names


class NodeManagerSettings(LenientSettings):
    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        validation_alias=env_names("node_manager_host"),
        description="Bind address of the NodeManager's HTTP API (default loopback).",
    )
    port: int = Field(
        default=8300,
        ge=1,
        le=65535,
        validation_alias=env_names("node_manager_port"),
        description="TCP port of the NodeManager's HTTP API (default 8300).",
    )
    config_file: str | None = Field(
        default=None,
        validation_alias=env_names("node_manager_config"),
        description="Path of this pod's instance spec (JSON or .toml); the CLI's --config wins.",
    )
    cluster_token: str | None = Field(
        default=None,
        validation_alias=env_names("cluster_token"),
        description=(
            "Bearer token of every internal route: the NodeManager's own routes require it, and it is sent "
            "to the controller and to the engines. Unset: the NodeManager refuses its routes (401) unless "
            "HETEROFLOW_NODE_MANAGER_ALLOW_NO_TOKEN is set, for a local cluster without one."
        ),
    )
    allow_no_token: bool = Field(
        default=False,
        validation_alias=env_names("node_manager_allow_no_token"),
        description="Serve the internal routes without a token when none is configured (local use only).",
    )
    engine_ft_poll_interval_sec: float = Field(
        default=1.0,
        gt=0,
        le=60,
        validation_alias=env_names("engine_ft_poll_interval_sec"),
        description="Seconds between two FT status polls of one ready engine (F-1, default 1).",
    )
    engine_ft_status_timeout_sec: float = Field(
        default=5.0,
        gt=0,
        le=60,
        validation_alias=env_names("engine_ft_status_timeout_sec"),
        description=(
            "Timeout of one FT status poll in seconds (default 5 = request_timeout_sec); once the engine has "
            "been ready, a timeout is DEAD evidence (RFC §4.4)."
        ),
    )
    engine_ft_path_prefix: str | None = Field(
        default=None,
        validation_alias=env_names("engine_ft_path_prefix"),
        description="Overrides the spec's FT route prefix ({prefix}/fault_tolerance/status|apply).",
    )
    supervisor_interval_sec: float = Field(
        default=0.1,
        gt=0,
        le=1.0,
        validation_alias=env_names("node_manager_supervisor_interval_sec"),
        description="How often the ProcessSupervisor checks the engines' processes (F-2; default 0.1 s).",
    )
    engine_stopped_dead_sec: float = Field(
        default=3.0,
        ge=0,
        validation_alias=env_names("node_manager_engine_stopped_dead_sec"),
        description=(
            "Seconds an engine's worker subprocess may stay stopped (SIGSTOP, a tracer's stop) before the "
            "ProcessSupervisor reports the engine dead and kills it (default 3: below the engines' 10 s "
            "collective timeout, so that the peers see the rank leave instead of timing out on it; 0 = never)."
        ),
    )
    heartbeat_interval_sec: float = Field(
        default=5.0,
        gt=0,
        le=300,
        validation_alias=env_names("node_manager_heartbeat_interval_sec"),
        description="Heartbeat period until the controller's registration answer sets its own (default 5 s).",
    )
    controller_timeout_sec: float = Field(
        default=5.0,
        gt=0,
        le=60,
        validation_alias=env_names("node_manager_controller_timeout_sec"),
        description="Timeout of one request to the controller (default 5 s).",
    )
    retired_watch_interval_sec: float = Field(
        default=10.0,
        gt=0,
        validation_alias=env_names("node_manager_retired_watch_interval_sec"),
        description="Low-rate watch of retired ranks (F-53): one status query per this many seconds (10).",
    )
    engine_death_suicide: bool = Field(
        default=True,
        validation_alias=env_names("node_manager_engine_death_suicide"),
        description=(
            "Default reaction to a dead local engine outside a guarded round: stop every local engine and "
            "exit 1 so that the pod is recreated (frozen while a round's guard holds)."
        ),
    )
    engine_death_suicide_grace_sec: float = Field(
        default=60.0,
        ge=0,
        validation_alias=env_names("node_manager_engine_death_suicide_grace_sec"),
        description=(
            "Seconds a dead local engine is left to the controller before the suicide handling fires "
            "(default 60: about software_fault_collection_timeout_sec, below the engine's 120 s recovery "
            "timeout, so that a scale-down round can guard first)."
        ),
    )
    engine_stop_grace_sec: float = Field(
        default=5.0,
        ge=0,
        validation_alias=env_names("node_manager_engine_stop_grace_sec"),
        description="SIGTERM → SIGKILL delay when stopping engines on request (fencing always SIGKILLs).",
    )
    log_dir: str | None = Field(
        default=None,
        validation_alias=env_names("node_manager_log_dir"),
        description="Directory of the engines' stdout/stderr files (engine-<rank>.log); unset: discarded.",
    )
    log_level: str = Field(
        default="info", validation_alias=env_names("node_manager_log_level"), description="Log level."
    )

    @field_validator("engine_ft_path_prefix")
    @classmethod
    def _valid_prefix(cls, value: str | None) -> str | None:
        return None if value is None else normalize_prefix(value)
