"""Wire models of the platform API (requests are lenient where the spec says so, responses exact).

The agent's wire — registration and the heartbeat — lives in ``heteroflow.contracts.heartbeat``, which the agent
builds and the routes validate; the models here are the operator-facing API.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from heteroflow.core.clock import utc
from heteroflow.core.ids import Source
from heteroflow.health.text_codes import TextCode, evidence_lines


def _utc_instant(value: datetime) -> datetime:
    try:
        return utc(value)
    except OverflowError as exc:  # e.g. 0001-01-01T00:00+01:00 is in year 0 once in UTC
        raise ValueError("the time is outside years 1 to 9999 once converted to UTC") from exc


UtcTime = Annotated[datetime, AfterValidator(_utc_instant)]
"""A time parameter, as an aware UTC datetime (naive values are taken as UTC); one outside the calendar is a 422."""


class XidUnwatchedOut(BaseModel):
    index: int
    error: str


class XidCollectionOut(BaseModel):
    state: Literal["collected", "partial", "not_collected"]
    reason: str | None
    watched: list[int]
    unwatched: list[XidUnwatchedOut]
    lost: list[int] = Field(description="Cards NVML reports lost (fallen off the bus): their XIDs are not read.")
    sources: list[Literal["nvml", "kernel_log"]] = Field(
        default_factory=list,
        description="Where XIDs are read from: NVML events, the kernel log's 'NVRM: Xid' lines, or both.",
    )
    kernel_log: str | None = Field(
        default=None, description="Why the agent does not read the kernel log (e.g. no permission); null otherwise."
    )


class ToolStallOut(BaseModel):
    tool: str = Field(description="The vendor tool (nvidia-smi, xpu-smi, cnmon) or in-process library (nvml).")
    since: datetime = Field(description="Its first timed-out call without an answer since (the agent's clock).")
    timeouts: int | None = Field(description="Timed-out calls since then; null when the agent did not say.")


class NodeCredentialOut(BaseModel):
    state: Literal["issued", "released", "none"] = Field(
        description=(
            "issued: a credential speaks for the node; released: an operator released it and the creating token "
            "has not claimed a new one; none: registered before node credentials existed."
        )
    )
    issued_at: datetime | None = Field(description="When the credential was last issued; null before it was kept.")
    reissued: bool = Field(
        description=(
            "The credential was issued again after the node's registration (an operator's release claimed, or an "
            "administrator's token): who speaks for the node changed then. A node that never beat has none."
        )
    )
    released_at: datetime | None = Field(description="When an operator last released it; null: never.")


class NodeCardsOut(BaseModel):
    """What the node may report, and what it had refused, as this server process counted it since it started."""

    registered_cards: int = Field(description="The node's gpu_count: how many distinct card indexes it may report.")
    known_cards: int = Field(description="Cards (index and uuid) the server holds for the node.")
    new_cards_this_hour: int = Field(description="Uuids that replaced another at their index this hour.")
    new_cards_per_hour: int = Field(description="The bound (HETEROFLOW_MAX_NEW_CARDS_PER_NODE_HOUR).")
    xid_events_this_hour: int
    xid_events_per_hour: int = Field(description="The bound (HETEROFLOW_MAX_XID_EVENTS_PER_NODE_HOUR).")
    xid_events_per_beat: int = Field(description="The bound (HETEROFLOW_MAX_XID_EVENTS_PER_BEAT).")
    refused_index_total: int = Field(
        description="Cards refused: an index beyond the node's registered_cards slots (the first distinct ones)."
    )
    refused_new_card_total: int = Field(description="Cards refused: more new uuids this hour than the bound.")
    refused_xid_total: int = Field(description="XID events refused: a card the node lacks, or over a bound.")


class NodeOut(BaseModel):
    id: str
    name: str
    vendor: str
    model: str
    gpu_count: int
    source: Source
    tenant_id: str | None
    registered_at: datetime
    last_heartbeat: datetime | None
    online: bool
    xid_events: XidCollectionOut | None = Field(
        default=None, description="Whether the node's XID events are collected; null when the agent has not said."
    )
    tool_stalls: list[ToolStallOut] | None = Field(
        default=None,
        description="Vendor tools whose calls time out on the node without an answer since, and since when; "
        "null when the node's last beat named none.",
    )
    credential: NodeCredentialOut | None = Field(
        default=None, description="Who may speak for the node, and since when (see docs/reliability.md)."
    )
    cards: NodeCardsOut | None = Field(
        default=None, description="The bounds on what the node reports, and what they refused (docs/reliability.md)."
    )


class NodeList(BaseModel):
    items: list[NodeOut]
    total: int
    limit: int
    offset: int


class SampleOut(BaseModel):
    sampled_at: datetime
    uuid: str | None
    ecc_uncorrected_total: int | None
    ecc_corrected_total: int | None
    retired_pages: int | None
    remapped_rows_pending: int | None
    remapped_rows_failure: int | None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    ecc_sram_uncorrected_total: int | None = None
    ecc_sram_corrected_total: int | None = None


class SamplesOut(BaseModel):
    node_id: str
    gpu_index: int
    source: Source
    since: datetime
    limit: int
    truncated: bool = Field(description="True when more samples exist in the period; the newest are kept.")
    samples: list[SampleOut]


class CeFloodOut(BaseModel):
    evidence: EvidenceLineOut = Field(description="The weak signal's evidence line, with its code and parameters.")
    since: datetime = Field(description="The first evaluation in a row that found the flood (its sample time).")
    evaluated_at: datetime = Field(description="The newest evaluation that found it (its sample time).")


class CardCapabilityOut(BaseModel):
    node_id: str
    gpu_index: int
    uuid: str | None
    metrics: dict[str, Literal["collectable", "unknown"]]
    first_sample_at: datetime
    last_sample_at: datetime
    sample_count: int
    collection_stalled: bool
    trend_prediction_possible: bool
    semantics_unconfirmed: list[str] = Field(
        default_factory=list, description="Keys whose meaning the vendor has not confirmed (cnmon Ecc-Error)."
    )
    xid_events: Literal["collected", "not_collected", "lost", "unknown"] = Field(
        default="unknown", description="Whether this card's XID events are collected (unknown: the agent has not said)."
    )
    xid_events_reason: str | None = Field(default=None, description="Why XID events are not collected.")
    ce_flood: CeFloodOut | None = Field(
        default=None,
        description=(
            "The card's corrected ECC grew faster than the flood rate at the prediction worker's last evaluation: "
            "weak evidence (a degrading card can wedge its tools), never a prediction by itself; null otherwise."
        ),
    )
    node_name: str | None = Field(default=None, description="The node's name (null: the node was deleted).")


class XidEventOut(BaseModel):
    gpu_index: int
    uuid: str | None
    xid: int
    occurred_at: datetime = Field(description="When the agent saw it (clamped to the server's clock).")
    received_at: datetime


class XidEventsOut(BaseModel):
    node_id: str
    source: Source
    gpu_index: int | None = Field(description="The card asked for; null: every card of the node.")
    since: datetime
    limit: int
    truncated: bool = Field(description="More events than `limit` exist: the newest `limit` are listed.")
    events: list[XidEventOut] = Field(description="Newest first.")


class CapabilitiesOut(BaseModel):
    source: Source
    since: datetime
    stall_threshold_minutes: int
    cards: list[CardCapabilityOut]
    total: int = Field(default=0, description="Cards matching the filters, before paging.")
    offset: int = 0
    limit: int | None = Field(default=None, description="The page size asked for; null: every matching card.")
    sort: str = "node"
    unknown: str | None = Field(default=None, description="The `unknown` filter asked for (any, or a counter).")
    unknown_counts: dict[str, int] = Field(
        default_factory=dict,
        description="Per counter, the cards matching every filter but `unknown` whose counter was never known in "
        "the period: the fleet's counts, whatever page or `unknown` filter is shown.",
    )
    note: str
    note_code: str = Field(
        default="capabilities.observed",
        description="A stable code for `note`: a page shows the note in its own language by this code.",
    )


class ErrorOut(BaseModel):
    error: str
    detail: str


class CodedTextOut(BaseModel):
    """A text's stable code and parameters, so that a page can show it in its own language (docs/api.md)."""

    code: str | None = Field(description="Null: a text without a code (typed by an operator); show `text`.")
    params: dict[str, str] = Field(default_factory=dict)
    text: str = Field(description="The English text, as stored.")


class EvidenceLineOut(CodedTextOut):
    layer: str = Field(description="strong, trend or weak")
    signal: str = Field(description="The signal's code, e.g. uncorrectable_ecc.")


def coded_text(text: str | None, coder: Callable[[str], TextCode | None]) -> CodedTextOut | None:
    """The text with its code (null when no pattern knows it); null for no text."""
    if text is None:
        return None
    found = coder(text)
    return CodedTextOut(code=found.code if found else None, params=found.params if found else {}, text=text)


def evidence_out(evidence: str | None) -> list[EvidenceLineOut]:
    return [
        EvidenceLineOut(code=line.code, params=line.params, text=line.text, layer=line.layer, signal=line.signal)
        for line in evidence_lines(evidence)
    ]


class PredictionOut(BaseModel):
    id: str
    node_id: str
    gpu_index: int
    uuid: str | None
    source: Source
    rule_version: str = Field(description="Frozen when the prediction was made; never re-judged with another.")
    window_days: int = Field(description="Frozen hit window, days.")
    t0: datetime = Field(description="The time of the last sample the prediction was based on.")
    window_end: datetime = Field(description="t0 + window_days; the window is (t0, window_end].")
    status: Literal["pending", "hit", "miss", "voided"]
    signals: list[str]
    evidence: str
    created_at: datetime
    judged_at: datetime | None
    conclusion: str | None = Field(description="The backfill's conclusion, the voided reason included.")
    evidence_lines: list[EvidenceLineOut] = Field(
        default_factory=list, description="`evidence` line by line, each with its code and parameters."
    )
    conclusion_code: CodedTextOut | None = Field(default=None, description="`conclusion` with its code.")
    alert_id: str | None = Field(
        default=None, description="The node's GPU_FAULT_PREDICTED alert this card is in (null: simulated, or none)."
    )


class PredictionList(BaseModel):
    items: list[PredictionOut]
    total: int
    limit: int
    offset: int
    current_rule_version: str


class BandOut(BaseModel):
    window_days: int
    pending: int
    hit: int
    miss: int
    voided: int
    matured: int = Field(description="hit + miss; voided never enters a denominator")
    failed_cards: int = Field(description="Monitorable cards with a failure event in the period (recall denominator).")
    predicted_cards: int = Field(description="Failed cards with a same-card prediction whose window held the failure.")
    missed_cards: int = Field(description="Failed cards without such a prediction.")
    unconfirmed_failed_cards: int = Field(
        default=0,
        description=(
            "Failed cards whose only failures were read from a counter whose meaning the vendor has not confirmed "
            "(Cambricon cnmon Ecc-Error): part of failed_cards, flagged so the recall is read with that caveat."
        ),
    )
    precision: float | None = Field(description="hit / (hit + miss); null when the evidence is insufficient.")
    recall: float | None = Field(description="predicted_cards / failed_cards; null when insufficient.")
    insufficient: list[str] = Field(description="Why the ratios are null, e.g. 'observed 3.0 of ≥ 8 days'.")
    insufficient_codes: list[CodedTextOut] = Field(
        default_factory=list, description="`insufficient` item by item, each with its code and parameters."
    )
    first_failure: BandOut | None = Field(
        default=None,
        description=(
            "The same figures for first failures only: predictions of cards with no uncorrectable error seen at "
            "their t0, and failed cards whose first failure in the period was their first uncorrectable error "
            "(same evidence gate; its own ratios null below it)."
        ),
    )


class OtherSourceOut(BaseModel):
    """Predictions of the source the statistics do not report, so that a reader knows which one they are of."""

    source: Source = Field(description="The source these statistics are not of.")
    predictions: int = Field(description="Its predictions since `since` (by t0), in the caller's scope.")
    note: str = Field(description="One English sentence: which source is reported, and how to ask for the other.")
    note_code: Literal["stats.other_source"] = Field(
        default="stats.other_source",
        description=(
            "A stable code for `note`; its parameters are the answer's `source`, and `source` and `predictions` here."
        ),
    )


class PredictionStatsOut(BaseModel):
    source: Source = Field(description="The source these statistics are of: `real` unless asked otherwise.")
    since: datetime
    until: datetime
    rule_version: str
    monitorable_cards: int
    card_days: float
    span_days: float | None
    min_matured: int
    min_span_days: float
    windows: list[BandOut]
    disclaimer: str
    disclaimer_code: str = Field(
        default="prediction.uncalibrated",
        description="A stable code for `disclaimer` (its parameters are min_matured and min_span_days).",
    )
    other_source: OtherSourceOut | None = Field(
        default=None,
        description=(
            "Set when the other source has predictions in the period: these statistics are not of them "
            "(ask again with `source`). Null when it has none."
        ),
    )


class AlertCardOut(BaseModel):
    """One predicted card of a GPU_FAULT_PREDICTED alert: its newest prediction under the alert."""

    gpu_index: int
    uuid: str | None
    source: Source = Field(description="The card's data source: a link to its history names it.")
    severity: str = Field(description="CRITICAL for a strong signal (remap failure, uncorrectable growth), else WARN.")
    signals: list[str]
    prediction_id: str
    status: str = Field(description="The prediction's status: pending, hit, miss or voided.")
    t0: datetime
    evidence: list[EvidenceLineOut]


class AlertOut(BaseModel):
    id: str
    type: str
    severity: str = Field(
        description="CRITICAL or WARN. GPU_FAULT_PREDICTED: the most severe of its cards' (it rises as cards join)."
    )
    node_id: str
    node_name: str
    status: Literal["open", "resolved"]
    message: str
    created_at: datetime
    resolved_at: datetime | None
    resolved_by: str | None
    resolution: str | None
    backlog: bool = Field(description="Open longer than the backlog threshold (72 h): operations backlog.")
    backlog_since: datetime | None
    message_code: CodedTextOut | None = Field(default=None, description="`message` with its code and parameters.")
    message_evidence: list[EvidenceLineOut] = Field(
        default_factory=list, description="The evidence a GPU_FAULT_PREDICTED message quotes, line by line."
    )
    resolution_code: CodedTextOut | None = Field(
        default=None, description="`resolution` with its code (null code: a reason typed by an operator)."
    )
    acknowledged_at: datetime | None = Field(default=None, description="The newest acknowledgement's time.")
    acknowledged_by: str | None = Field(default=None, description="Who acknowledged it last.")
    acknowledgement: str | None = Field(default=None, description="The newest acknowledgement's note.")
    cards: list[AlertCardOut] = Field(
        default_factory=list,
        description="GPU_FAULT_PREDICTED: every predicted card of the node under this alert, the most severe first.",
    )


class AlertList(BaseModel):
    items: list[AlertOut]
    total: int
    limit: int
    offset: int


class AlertEventOut(BaseModel):
    at: datetime
    actor: str
    action: str
    note: str
    note_code: CodedTextOut | None = Field(default=None, description="`note` with its code and parameters.")
    note_evidence: list[EvidenceLineOut] = Field(
        default_factory=list, description="The evidence a raised GPU_FAULT_PREDICTED note quotes, line by line."
    )


class AlertDetail(BaseModel):
    alert: AlertOut
    history: list[AlertEventOut]


class AcknowledgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = Field(
        default="", max_length=2000, description="What is being done (kept in the history); may be empty."
    )


class ResolveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=2000, description="Why the alert is resolved (kept in the history).")
