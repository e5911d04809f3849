"""The agent ⇄ platform server wire: registration and the heartbeat (``docs/agent.md``, ``docs/api.md``).

The agent builds these models (``heteroflow.agent.heartbeat``, ``heteroflow.agent.client``) and the server's
routes validate against the same ones (``heteroflow.platform_server.routes.nodes``), so what one sends is what the
other reads. Requests are lenient where the design says so — a bad value in a heartbeat is unknown, never a
rejection of the beat — and answers exact.

Unknown is never 0: a health counter the agent could not read is absent from its stat, a telemetry value it
could not read is null, and the server keeps both as unknown.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema, field_validator

from heteroflow.contracts.text import text_problem

MAX_GPU_STATS = 256
MAX_XID_EVENTS = 1000

NodeSource = Literal["real", "simulated"]
"""Whether a node's readings come from real cards or from the simulator (``heteroflow.core.ids.Source``)."""


class NodeRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hostname: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    vendor: str = Field(min_length=1, max_length=64)
    model: str = Field(default="", max_length=200)
    gpu_count: int = Field(ge=0, le=1024)
    source: NodeSource = "real"

    @field_validator("vendor", "model")
    @classmethod
    def _printable(cls, value: str) -> str:
        problem = text_problem(value)
        if problem is not None:
            raise ValueError(f"must be printable text: {problem}")
        return value


class NodeRegistered(BaseModel):
    node_id: str
    created: bool
    heartbeat_interval_seconds: float
    node_credential: str | None = Field(
        default=None,
        description=(
            "The node's own credential, shown once when it is issued (a new node, or a node that had none): "
            "send it as X-HeteroFlow-Node-Credential on every heartbeat and re-registration of this node."
        ),
    )


class GpuStat(BaseModel):
    """One GPU in a heartbeat. Every value is taken leniently: a bad value is unknown, never a rejection."""

    model_config = ConfigDict(extra="allow")

    index: JsonValue = None
    uuid: JsonValue = None
    sampled_at: JsonValue = None
    telemetry_at: JsonValue = Field(
        default=None, description="When the agent read the metrics below (the health counters have `sampled_at`)."
    )
    temperature_c: JsonValue = None
    utilization_pct: JsonValue = None
    memory_used_mib: JsonValue = None
    memory_total_mib: JsonValue = None
    power_w: JsonValue = None
    ecc_uncorrected_total: JsonValue = None
    ecc_corrected_total: JsonValue = None
    retired_pages: JsonValue = None
    remapped_rows_pending: JsonValue = None
    remapped_rows_failure: JsonValue = None
    remapped_rows_correctable: JsonValue = None
    remapped_rows_uncorrectable: JsonValue = None
    ecc_sram_uncorrected_total: JsonValue = None
    ecc_sram_corrected_total: JsonValue = None
    semantics_unconfirmed: JsonValue = None


class XidEventIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    index: JsonValue = None
    uuid: JsonValue = None
    xid: JsonValue = None
    occurred_at: JsonValue = None


class XidUnwatched(BaseModel):
    index: int
    error: str


class XidCollection(BaseModel):
    """The agent's word on its XID source, the heartbeat's ``xid_collection``: what the agent sends. The server
    reads the field leniently (``heteroflow.health.xid_collection``): an unusable object means "not said"."""

    state: Literal["collected", "partial", "not_collected"]
    reason: str | None = Field(default=None, description="Why not (every card), or why partly.")
    watched: list[int] = Field(default_factory=list, description="Card indexes registered for XID events.")
    unwatched: list[XidUnwatched] = Field(default_factory=list, description="Cards that could not be registered.")
    lost: list[int] = Field(default_factory=list, description="Cards NVML reports lost: their XIDs are not read.")
    wait_failures_total: int = Field(default=0, description="Failed waits for events (not the idle timeout).")
    sources: list[str] = Field(default_factory=list, description="Where XIDs are read from: nvml, kernel_log.")
    kernel_log: str | None = Field(default=None, description="Why the kernel log is not read; null otherwise.")


# On the heartbeat path each stat stays a plain dict: the lenient parsing of health.heartbeat reads it
# directly, and validating JsonValue fields model by model would cost more than the rest of the beat.
# The published schema still describes the fields.
GpuStatObject = Annotated[dict[str, Any], WithJsonSchema(GpuStat.model_json_schema())]
XidEventObject = Annotated[dict[str, Any], WithJsonSchema(XidEventIn.model_json_schema())]


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="allow")

    gpu_stats: list[GpuStatObject] = Field(default_factory=list, max_length=MAX_GPU_STATS)
    xid_events: list[XidEventObject] = Field(default_factory=list, max_length=MAX_XID_EVENTS)
    xid_collection: JsonValue = Field(
        default=None,
        description=(
            "The agent's XID source (an XidCollection): {state: collected|partial|not_collected, reason, "
            "watched: [index], unwatched: [{index, error}], lost: [index], wait_failures_total, sources, "
            "kernel_log}. Read leniently; absent = unknown."
        ),
    )
    tool_stalls: JsonValue = Field(
        default=None,
        description=(
            "Vendor tools whose last call timed out on this node: [{tool, since (ISO time of the first timed-out "
            "call without an answer since), timeouts}]; absent while every tool answers. Read leniently."
        ),
    )


class XidEventsResult(BaseModel):
    received: int
    stored: int = Field(description="New events stored by this beat (re-sent ones are not counted again).")
    rejected: list[str] = Field(description="Why an event was unusable; the agent should drop those.")
    retry: bool = Field(description="True when the events could not be stored now: keep and re-send them.")


class HeartbeatAccepted(BaseModel):
    status: Literal["ok"] = "ok"
    server_time: datetime
    xid_events: XidEventsResult
