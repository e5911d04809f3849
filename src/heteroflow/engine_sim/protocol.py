"""Wire models of the vLLM engine fault-tolerance protocol (``engine-protocol.md``).

This module is shared by the engine simulator and by the consumers of the protocol (the NodeManager's
EngineFtManager and EngineFtService), so it imports nothing but pydantic: no torch, no web framework.

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

EngineHealth = Literal["healthy", "unhealthy", "dead"]
FtState = Literal["recovering", "failed"]
Instruction = Literal["scale_down", "retry"]
INSTRUCTIONS: tuple[Instruction, ...] = ("scale_down", "retry")


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
