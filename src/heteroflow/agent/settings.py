"""Agent settings (H-25): every value has a default; an invalid one falls back to it with a warning."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from heteroflow.core.settings import LenientSettings, env_names


class AgentSettings(LenientSettings):
    """How the agent paces collection and heartbeats, and how it reaches the server."""

    server_url: str = Field(
        default="http://127.0.0.1:8080",
        min_length=1,
        validation_alias=env_names("agent_server_url"),
        description="Base URL of the platform server (default http://127.0.0.1:8080).",
    )
    token: str = Field(
        default="",
        validation_alias=env_names("agent_token"),
        description="Bearer token with scope 'agent'. Never logged.",
    )
    state_dir: str = Field(
        default="~/.local/state/heteroflow/agent",
        min_length=1,
        validation_alias=env_names("agent_state_dir"),
        description=(
            "Folder (created 0700) where the agent keeps its node's credential (0600), issued by the node's "
            "first registration; a restarted agent needs it to speak for its node again (default "
            "~/.local/state/heteroflow/agent; on Kubernetes a hostPath, see docs/deploy.md)."
        ),
    )
    node_name: str = Field(
        default="",
        pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=253,
        validation_alias=env_names("agent_node_name"),
        description=(
            "Hostname the node registers under (default: this machine's hostname; '<hostname>-sim' in "
            "simulated mode, so a simulated node never collides with the real one, H-17)."
        ),
    )
    heartbeat_interval_seconds: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        validation_alias=env_names("agent_heartbeat_interval_seconds"),
        description="Seconds between heartbeats and between telemetry reads (default 5).",
    )
    health_interval_seconds: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        validation_alias=env_names("agent_health_interval_seconds"),
        description=(
            "Seconds between health-counter collections (default 60). A reading is reported for 3 of "
            "these periods (180 s) and is unknown after that (H-13)."
        ),
    )
    tick_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        le=600,
        validation_alias=env_names("agent_tick_timeout_seconds"),
        description=(
            "Time limit of one collection tick, vendor tool included (default 20 s); a tool that overruns "
            "is killed and the tick's values are unknown."
        ),
    )
    collector: Literal["auto", "nvml", "nvidia-smi", "xpu-smi", "cnmon"] = Field(
        default="auto",
        validation_alias=env_names("agent_collector"),
        description="Which collector to use (default auto: NVML, then nvidia-smi, then xpu-smi, then cnmon).",
    )
    xid_queue_capacity: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        validation_alias=env_names("agent_xid_queue_capacity"),
        description=(
            "XID events kept while the server cannot take them (default 10000); beyond it the oldest is "
            "dropped and counted."
        ),
    )
    kernel_log: str = Field(
        default="/dev/kmsg",
        max_length=4096,
        validation_alias=env_names("agent_kernel_log"),
        description=(
            "Where the NVIDIA driver's 'NVRM: Xid' lines are read from, the second XID source next to NVML "
            "events (default /dev/kmsg; read from the oldest record still buffered; empty = not read)."
        ),
    )
    reconnect_initial_seconds: float = Field(
        default=1.0,
        gt=0,
        le=600,
        validation_alias=env_names("agent_reconnect_initial_seconds"),
        description="First wait after a failed request to the server (default 1 s), doubled per failure.",
    )
    reconnect_max_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        validation_alias=env_names("agent_reconnect_max_seconds"),
        description="Longest wait between reconnect attempts (default 30 s).",
    )
    request_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        validation_alias=env_names("agent_request_timeout_seconds"),
        description="Time limit of one HTTP request to the server (default 5 s).",
    )
    simulate_gpus: int = Field(
        default=0,
        ge=0,
        le=64,
        validation_alias=env_names("agent_simulate_gpus"),
        description="Report this many simulated cards instead of real ones (default 0 = real hardware).",
    )
    simulate_speed: float = Field(
        default=60.0,
        gt=0,
        le=1_000_000,
        validation_alias=env_names("agent_simulate_speed"),
        description="Simulated hours per real hour (default 60: a simulated hour passes every minute).",
    )
    log_level: str = Field(
        default="info",
        pattern="^(debug|info|warning|error)$",
        validation_alias=env_names("agent_log_level"),
        description="Log level (debug, info, warning, error).",
    )
