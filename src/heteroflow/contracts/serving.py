"""The NodeManager ⇄ controller wire contract (``serving-ft.md`` F-1, F-2, F-4, F-23…F-27, RFC §4.4 and §6).

Imported by the NodeManager, the controller and the Coordinator, so it holds only pydantic models, route
paths and pure judgements: no web framework, no HTTP client.

Two directions:

- NodeManager → controller: :data:`REGISTER_PATH` (:class:`RegisterRequest` → :class:`RegisterResponse`),
  :data:`HEARTBEAT_PATH` (:class:`HeartbeatRequest` → :class:`HeartbeatResponse`) and
  :data:`REPORT_SOFTWARE_FAULT_PATH` (:class:`SoftwareFaultReport`): FT status changes (F-1) and process
  deaths (F-2, evidence ``ENGINE_DEAD``) share the RFC's single fault route and differ by ``evidence``.
- controller → NodeManager: the four FT routes (:data:`NM_FT_STATUS_PATH` …) and the beyond-the-anchor
  probe and nudge (F-52, F-54), plus the engine stop/start/restart routes the fallbacks use (F-14).

Endpoint ids are **original global DP ranks** everywhere (RFC §4.1): never local ranks, never renumbered. An
engine relaunched in a smaller world carries another FT id (:class:`EngineRank`); only its NodeManager sees that
id, and translates.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Literal, NewType

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from heteroflow.contracts.engine_protocol import EngineStatusEntry, Instruction, ProfileNameIn, is_terminal_failure

EndpointId = NewType("EndpointId", int)
"""An endpoint's id: the original global DP rank of the engine behind it."""

MAX_DP_SIZE = 65536
"""Most DP ranks one instance may declare: far above any expert-parallel deployment, and small enough that the
controller can hold a set of every rank (an unbounded size from one registration would exhaust its memory)."""

MAX_LEASE_SEC = 3600.0
"""Upper bound of a guard lease (F-23): a round never freezes a NodeManager for longer than an hour."""

# -- controller routes (called by the NodeManager) -------------------------------------------------------
REGISTER_PATH = "/controller/node_manager/register"
HEARTBEAT_PATH = "/controller/node_manager/heartbeat"
REPORT_SOFTWARE_FAULT_PATH = "/controller/report_software_fault"

# -- NodeManager routes (called by the controller) -------------------------------------------------------
NM_FT_PREFIX = "/node-manager/fault-tolerance"
NM_FT_STATUS_PATH = f"{NM_FT_PREFIX}/status"
NM_FT_APPLY_PATH = f"{NM_FT_PREFIX}/apply"
NM_FT_GUARD_PATH = f"{NM_FT_PREFIX}/guard"
NM_FT_FINALIZE_PATH = f"{NM_FT_PREFIX}/finalize"
NM_FT_PROBE_PATH = f"{NM_FT_PREFIX}/probe"
NM_FT_NUDGE_PATH = f"{NM_FT_PREFIX}/nudge"
NM_ENGINES_STOP_PATH = "/node-manager/engines/stop"
NM_ENGINES_START_PATH = "/node-manager/engines/start"
NM_ENGINES_RESTART_PATH = "/node-manager/engines/restart"
NM_STATUS_PATH = "/node-manager/status"

_FROZEN = ConfigDict(frozen=True, extra="ignore")
_STRICT = ConfigDict(frozen=True, extra="forbid")


def _unique_ranks(values: list[int]) -> list[int]:
    if any(not 0 <= value < MAX_DP_SIZE for value in values):
        raise ValueError(f"endpoint ids are DP ranks: 0 <= id < {MAX_DP_SIZE}")
    if len(set(values)) != len(values):
        raise ValueError("endpoint ids must not repeat")
    return sorted(values)


# == registration ==========================================================================================
class DeviceInfo(BaseModel):
    """One accelerator behind an endpoint; the controller maps hardware faults to ranks through it (F-3)."""

    model_config = _FROZEN

    device_id: str = Field(min_length=1, description="Card name or uuid as the hardware source names it.")
    index: StrictInt | None = Field(default=None, ge=0, description="Device index on the node.")


class EndpointInfo(BaseModel):
    """One engine of this pod: its global DP rank, where it serves, and its devices."""

    model_config = _FROZEN

    id: StrictInt = Field(ge=0, lt=MAX_DP_SIZE, description="Original global DP rank (the engine's FT id).")
    ip: str = Field(min_length=1)
    port: StrictInt = Field(ge=1, le=65535)
    device_infos: list[DeviceInfo] = Field(default_factory=list)


class FtCapability(BaseModel):
    """Static facts the controller's gate needs (F-21); they must agree across an instance's pods."""

    model_config = _FROZEN

    engine_ft_enabled: StrictBool
    scale_down_supported: StrictBool
    external_lb: StrictBool
    auto_recovery_enabled: StrictBool
    eplb_enabled: StrictBool
    num_redundant_experts: StrictInt = Field(ge=0)
    num_logical_experts: StrictInt = Field(ge=1)
    slots_per_rank: StrictInt = Field(ge=1)
    tp_size: StrictInt = Field(ge=1)
    retry_supported: StrictBool = True
    """The engine knows ``retry`` (both profiles do): fast recovery is possible."""
    elastic_ep_supported: StrictBool = False
    """The engines answer vLLM 0.34's ``POST /is_scaling_elastic_ep`` (launched with ``--enable-elastic-ep``)."""
    protocol_profile: ProfileNameIn | Literal["mixed"] | None = None
    """The FT protocol profile the engines speak: pinned in the spec or discovered at first readiness;
    ``None`` until known (the configured flags are trusted meanwhile); ``mixed`` when an instance's pods
    disagree (the gate refuses: CAPABILITY_MISMATCH)."""


def relaunch_redundant_experts(*, members: int, tp_size: int, slots_per_rank: int, num_logical_experts: int) -> int:
    """The redundant experts of a launch over ``members`` DP ranks that keeps each EP rank's expert slots
    (``slots_per_rank``: what a card's memory holds) and fills them: ``members x TP x slots - logical``. Negative
    when those slots cannot hold every logical expert (the launch is refused: EXPERT_CAPACITY_INSUFFICIENT). The
    physical experts (logical + redundant) are then a multiple of the EP size, as vLLM's EPLB requires ("EPLB
    currently only supports even distribution of experts across ranks")."""
    return members * tp_size * slots_per_rank - num_logical_experts


def expert_capacity_shortfall(*, members: int, redundant: int, num_logical_experts: int) -> str:
    """Why a launch over ``members`` DP ranks is refused, given its :func:`relaunch_redundant_experts` (negative):
    the one sentence the NodeManager's spec check and the controller's relaunch plan both start their refusal with."""
    return (
        f"{members} DP ranks hold {redundant + num_logical_experts} expert slots, fewer than the "
        f"{num_logical_experts} logical experts"
    )


DISCOVERED_CAPABILITY_FIELDS = frozenset(
    {"scale_down_supported", "retry_supported", "protocol_profile", "elastic_ep_supported"}
)
"""What a NodeManager learns from its engines and may correct by registering again (an engine's build can
change under a restarted pod); every other field is configuration and fixed for the instance's life."""


class RegisterRequest(BaseModel):
    """``POST /controller/node_manager/register``: who this NodeManager is and what it runs."""

    model_config = _FROZEN

    pod_id: str = Field(min_length=1)
    pod_ip: str = Field(min_length=1)
    node_name: str = Field(default="", description="Kubernetes node (hardware faults are keyed by it).")
    node_manager_url: str = Field(min_length=1, description="Where the controller reaches this NodeManager.")
    instance_id: str = Field(min_length=1)
    role: Literal["prefill", "decode", "both"] = "both"
    dp_size: StrictInt = Field(ge=1, le=MAX_DP_SIZE)
    endpoints: list[EndpointInfo]
    ft_capability: FtCapability

    @field_validator("endpoints")
    @classmethod
    def _distinct_endpoints(cls, value: list[EndpointInfo]) -> list[EndpointInfo]:
        _unique_ranks([e.id for e in value])
        return sorted(value, key=lambda e: e.id)


class FtFlags(BaseModel):
    """Switches the controller pushes to its NodeManagers (configuration table of ``serving-ft.md``)."""

    model_config = _FROZEN

    enable_dp_scale_down_proxy: StrictBool = False
    """Derived by the controller: ``enable_fault_tolerance and enable_dp_scale_down``; off → FT routes 404."""
    enable_fast_recovery: StrictBool = False
    """Whether ``apply`` accepts ``retry`` (F-11)."""
    nudge_idle_survivors: StrictBool = False
    """Whether ``nudge`` sends a probe request to idle survivors (F-54)."""


class RegisterResponse(BaseModel):
    model_config = _FROZEN

    flags: FtFlags = FtFlags()
    heartbeat_interval_sec: float = Field(default=5.0, gt=0, le=300)
    retired_endpoint_ids: list[StrictInt] | None = None
    """The instance's ``dead_committed`` when the controller knows it (replaces the NodeManager's retired set)."""


# == heartbeat (F-4) ========================================================================================
class EngineRank(BaseModel):
    """The FT id an endpoint's engine was launched with (``--data-parallel-rank``) and that launch's DP size: the
    endpoint's own id and the instance's size, unless a relaunch without some ranks renumbered the survivors."""

    model_config = _FROZEN

    endpoint_id: StrictInt = Field(ge=0)
    engine_rank: StrictInt = Field(ge=0)
    dp_size: StrictInt = Field(ge=1, le=MAX_DP_SIZE)
    elastic_ep_resized: StrictBool = False
    """vLLM's elastic EP resized (or is resizing) this engine's world since its launch, outside HeteroFlow: its
    fault tolerance still counts the launch's ranks (vLLM 0.34 freezes them at start), so the controller never
    scales the instance down until it is relaunched (gate ``ELASTIC_EP_RESIZED``). Absent: no resize seen."""
    elastic_ep_requested_dp_size: StrictInt | None = Field(default=None, ge=1, le=MAX_DP_SIZE)
    """The DP size that resize asked for, when the engine said (``requested_data_parallel_size``)."""


class HeartbeatRequest(BaseModel):
    """``POST /controller/node_manager/heartbeat``: lifecycle and endpoint-set completeness, never ranks to remove.

    ``endpoint_ids`` are this pod's endpoints whose engine is running and has been ready, with committed
    (retired) ids filtered out; ``expected_endpoint_ids`` are every endpoint of the pod's spec.
    """

    model_config = _FROZEN

    pod_id: str = Field(min_length=1)
    instance_id: str = Field(min_length=1)
    endpoint_ids: list[StrictInt]
    expected_endpoint_ids: list[StrictInt]
    retired_endpoint_ids: list[StrictInt] = Field(default_factory=list)
    guard_request_id: str | None = None
    sent_at: datetime
    engine_ranks: list[EngineRank] = Field(default_factory=list, max_length=MAX_DP_SIZE)
    """Each running engine's launch rank and size (empty from a NodeManager that does not say)."""

    @field_validator("endpoint_ids", "expected_endpoint_ids", "retired_endpoint_ids")
    @classmethod
    def _ranks(cls, value: list[int]) -> list[int]:
        return _unique_ranks(value)


class HeartbeatResponse(BaseModel):
    model_config = _FROZEN

    flags: FtFlags | None = None
    """New switches when the controller's configuration changed; ``None`` keeps the current ones."""
    register_again: StrictBool = False
    """The controller does not know this pod (it restarted): register again."""


def heartbeat_complete(
    *,
    reported: Iterable[int],
    expected: Iterable[int],
    retired: Iterable[int],
    scale_down_enabled: bool,
) -> bool:
    """Whether a heartbeat's endpoint set is complete (F-4, RFC §6). Purely computational.

    Scale-down off (the baseline): every expected endpoint must be reported. On: the reported set must
    equal expected minus retired exactly, so an empty set is legal only when every local rank is committed dead.
    """
    reported_set, expected_set = set(reported), set(expected)
    if not scale_down_enabled:
        return expected_set <= reported_set
    return reported_set == expected_set - set(retired)


# == fault reports (F-1, F-2) ================================================================================
class FaultEvidence(StrEnum):
    FT_STATUS = "FT_STATUS"
    """The engine's FT status answered ``unhealthy`` or ``dead``."""
    FT_UNREACHABLE = "FT_UNREACHABLE"
    """The status route timed out or refused the connection after the engine had been ready: DEAD (RFC §4.4)."""
    FT_PROTOCOL_ERROR = "FT_PROTOCOL_ERROR"
    """The answer broke the protocol (missing, duplicate or unknown engine id): never healthy, never DEAD."""
    ENGINE_DEAD = "ENGINE_DEAD"
    """The ProcessSupervisor saw the engine's API server or one of its worker subprocesses exit (F-2)."""


TERMINAL_FAILURE = is_terminal_failure
"""vLLM's terminal recovery failure of one status entry (re-exported for the controller's pure core)."""

ReportedStatus = Literal["diagnosing", "unhealthy", "dead", "protocol_error"]
"""``diagnosing`` (vLLM 0.34): a fault that cannot take a command yet — never DEAD, never a protocol error."""


class EngineIdentity(BaseModel):
    """Which process serves an endpoint: a changed identity means the engine was restarted (F-52)."""

    model_config = _FROZEN

    pid: StrictInt
    start_time: float
    """Process start, seconds since the epoch (from ``/proc``), so a reused pid is still told apart."""


class SoftwareFaultReport(BaseModel):
    """``POST /controller/report_software_fault``: one endpoint's new fault evidence."""

    model_config = _FROZEN

    instance_id: str = Field(min_length=1)
    pod_id: str = Field(min_length=1)
    endpoint_id: StrictInt = Field(ge=0)
    status: ReportedStatus
    evidence: FaultEvidence
    fault_info: str | None = None
    detail: str = ""
    engine_status: EngineStatusEntry | None = None
    identity: EngineIdentity | None = None
    exit_code: StrictInt | None = None
    observed_at: datetime


# == the NodeManager's FT routes (RFC §6) =====================================================================
class FtStatusRequest(BaseModel):
    model_config = _STRICT

    endpoint_ids: list[StrictInt] = Field(min_length=1)

    @field_validator("endpoint_ids")
    @classmethod
    def _ranks(cls, value: list[int]) -> list[int]:
        return _unique_ranks(value)


class EndpointFtStatus(BaseModel):
    """One endpoint's answer; ``status`` is ``None`` exactly when ``error`` says why (never "healthy")."""

    model_config = _FROZEN

    endpoint_id: StrictInt
    status: EngineStatusEntry | None = None
    error: Literal["unreachable", "protocol_error", "not_running"] | None = None
    detail: str = ""
    identity: EngineIdentity | None = None


class FtStatusResponse(BaseModel):
    model_config = _FROZEN

    entries: list[EndpointFtStatus]


class ApplyInstructionParams(BaseModel):
    """Only engine-defined parameters (F-56); ``dp_store_port`` is filled in by the NodeManager (F-25)."""

    model_config = _STRICT

    removed_dp_ranks: list[StrictInt] | None = None
    dp_master_ip: str | None = Field(default=None, min_length=1)

    @field_validator("removed_dp_ranks")
    @classmethod
    def _ranks(cls, value: list[int] | None) -> list[int] | None:
        return None if value is None else _unique_ranks(value)


class NmApplyRequest(BaseModel):
    """``POST …/apply``: sent once per round to every NodeManager with routable survivors."""

    model_config = _STRICT

    instruction: str = Field(min_length=1)
    request_id: str = Field(min_length=1)
    params: ApplyInstructionParams = ApplyInstructionParams()
    endpoint_ids: list[StrictInt] | None = None
    """Survivors to command; default: every local endpoint that is neither retired nor being removed."""


class EngineApplyResult(BaseModel):
    model_config = _FROZEN

    endpoint_id: StrictInt
    http_status: StrictInt | None
    """The engine's HTTP status (202 = accepted, not done); ``None`` when it could not be reached."""
    detail: str = ""


class NmApplyResponse(BaseModel):
    model_config = _FROZEN

    request_id: str
    instruction: Instruction
    accepted: StrictBool
    results: list[EngineApplyResult]
    fenced_endpoint_ids: list[StrictInt] = Field(default_factory=list)


class GuardRequest(BaseModel):
    model_config = _STRICT

    request_id: str = Field(min_length=1)
    lease_sec: float = Field(gt=0, le=MAX_LEASE_SEC, allow_inf_nan=False)


class GuardResponse(BaseModel):
    model_config = _FROZEN

    request_id: str
    lease_sec: float
    renewed: StrictBool


class FinalizeRequest(BaseModel):
    model_config = _STRICT

    request_id: str = Field(min_length=1)
    commit: StrictBool
    retired_endpoint_ids: list[StrictInt] = Field(default_factory=list)

    @field_validator("retired_endpoint_ids")
    @classmethod
    def _ranks(cls, value: list[int]) -> list[int]:
        return _unique_ranks(value)


class FinalizeResponse(BaseModel):
    model_config = _FROZEN

    request_id: str
    commit: StrictBool
    repeated: StrictBool
    """True for an idempotent repeat of a finalize already done (F-57)."""
    retired_endpoint_ids: list[StrictInt]
    fenced_endpoint_ids: list[StrictInt] = Field(default_factory=list)


class ProbeRequest(BaseModel):
    """``POST …/probe`` (F-52, guarded) and ``POST …/nudge`` (F-54): one short completion per endpoint."""

    model_config = _STRICT

    request_id: str = Field(min_length=1)
    endpoint_ids: list[StrictInt] | None = None
    max_tokens: StrictInt = Field(default=1, ge=1, le=16)
    timeout_sec: float = Field(default=5.0, gt=0, le=60, allow_inf_nan=False)


class ProbeResult(BaseModel):
    model_config = _FROZEN

    endpoint_id: StrictInt
    ok: StrictBool
    detail: str = ""
    latency_sec: float | None = None
    identity: EngineIdentity | None = None


class ProbeResponse(BaseModel):
    model_config = _FROZEN

    request_id: str
    ok: StrictBool
    results: list[ProbeResult]


# == engine lifecycle routes (fallbacks, F-14) ================================================================
class EnginesStopRequest(BaseModel):
    model_config = _STRICT

    endpoint_ids: list[StrictInt] | None = None
    """Default: every local endpoint."""


class EnginesStartRequest(BaseModel):
    """Start (or restart) the local engines that are not retired.

    ``retired_endpoint_ids`` replaces (never merges) the retired set with the controller's
    ``dead_committed`` (F-14); ``[]`` is a full rebuild; ``None`` keeps the current set.
    """

    model_config = _STRICT

    retired_endpoint_ids: list[StrictInt] | None = None
    dp_master_ip: str | None = Field(default=None, min_length=1)
    dp_master_port: StrictInt | None = Field(default=None, ge=1, le=65535)

    @field_validator("retired_endpoint_ids")
    @classmethod
    def _ranks(cls, value: list[int] | None) -> list[int] | None:
        return None if value is None else _unique_ranks(value)


class EnginesResponse(BaseModel):
    model_config = _FROZEN

    stopped_endpoint_ids: list[StrictInt] = Field(default_factory=list)
    started_endpoint_ids: list[StrictInt] = Field(default_factory=list)
    retired_endpoint_ids: list[StrictInt] = Field(default_factory=list)


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer of the NodeManager: a machine-readable code and a sentence."""

    model_config = _FROZEN

    error: str
    detail: str


# == controller → Coordinator: the serving view (F-40, F-41) ===================================================
COORDINATOR_DEL_PATH = "/coordinator/manage/del"
COORDINATOR_ADD_PATH = "/coordinator/manage/add"
COORDINATOR_SET_PATH = "/coordinator/manage/set"
COORDINATOR_INSTANCES_PATH = "/coordinator/instances"
COORDINATOR_CLIENT_OUTCOMES_PATH = "/coordinator/client_outcomes"
"""What clients saw in a time window (held, re-routed, resumed, failed, the longest wait): the cluster token."""


class ServingEndpoint(BaseModel):
    """One engine the Coordinator may route OpenAI requests to."""

    model_config = _STRICT

    id: StrictInt = Field(ge=0, description="Original global DP rank.")
    ip: str = Field(min_length=1)
    port: StrictInt = Field(ge=1, le=65535)


class ViewDelRequest(BaseModel):
    """DEL: withdraw endpoints from an instance's published view (the controller sends the view published now)."""

    model_config = _STRICT

    instance_id: str = Field(min_length=1)
    endpoint_ids: list[StrictInt]
    request_id: str | None = None
    """The round that withdraws them (for the Coordinator's log)."""
    generation: StrictInt | None = Field(default=None, ge=0)
    """The runtime generation the withdrawal was decided at: an ADD or SET of no newer generation (one sent
    before the DEL and delivered after it) cannot publish these endpoints again. ``None``: no such guard."""
    faulted: StrictBool = False
    """The endpoints were reported unhealthy or dead: requests still waiting for their first byte from them are
    abandoned after the Coordinator's faulted first-byte bound and sent elsewhere."""

    @field_validator("endpoint_ids")
    @classmethod
    def _ranks(cls, value: list[int]) -> list[int]:
        return _unique_ranks(value)


class ViewAddRequest(BaseModel):
    """ADD: publish endpoints (merged into the instance's view); SET: the instance's whole view (replaces it).

    ``model`` is the served model name the OpenAI requests carry; ``generation`` orders SETs: one older than
    the last applied for the instance is ignored (a late refresh never undoes a newer view).
    """

    model_config = _STRICT

    instance_id: str = Field(min_length=1)
    model: str = Field(min_length=1)
    endpoints: list[ServingEndpoint]
    generation: StrictInt = Field(default=0, ge=0)
    request_id: str | None = None

    @field_validator("endpoints")
    @classmethod
    def _distinct(cls, value: list[ServingEndpoint]) -> list[ServingEndpoint]:
        _unique_ranks([e.id for e in value])
        return sorted(value, key=lambda e: e.id)


ViewSetRequest = ViewAddRequest


class PublishedInstance(BaseModel):
    model_config = _FROZEN

    instance_id: str
    model: str
    endpoints: list[ServingEndpoint]
    generation: int


class ViewResponse(BaseModel):
    """Every management answer and ``GET /coordinator/instances``: the views as they are now."""

    model_config = _FROZEN

    instances: list[PublishedInstance]


# == hardware faults (F-3, F-12): a source → the controller ====================================================
REPORT_HARDWARE_FAULT_PATH = "/controller/report_hardware_fault"


class HardwareFaultReport(BaseModel):
    """One card- or node-level hardware fault, normalised by its source (MindCluster, HeteroFlow GPU health,
    an operator's CLI). ``cleared``: the fault is gone (its key may start a window again later)."""

    model_config = _STRICT

    node_name: str = Field(min_length=1, max_length=253)
    card: str = Field(default="", max_length=128, description="Card name, GPU uuid or index; empty = node-level.")
    fault_code: str = Field(min_length=1, max_length=128)
    level: StrictInt = Field(ge=1, le=6, description="L1…L6; only L4-L6 open a correlation window (F-12).")
    source: str = Field(default="api", min_length=1, max_length=64)
    detail: str = Field(default="", max_length=1000)
    cleared: StrictBool = False


class HardwareFaultAnswer(BaseModel):
    model_config = _FROZEN

    key: str
    mappings: dict[str, str]
    """instance id → MAPPED ranks / NOT_AFFECTED / UNMAPPABLE with the reason, for the reporter's log."""
