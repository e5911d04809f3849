"""Alert decisions for GPU_FAULT_PREDICTED (H-60…H-62). Purely computational, no side effects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from heteroflow.health.predictions import PredictionStatus

GPU_FAULT_PREDICTED = "GPU_FAULT_PREDICTED"
AlertStatus = Literal["open", "resolved"]
AlertSeverity = Literal["WARN", "CRITICAL"]
SEVERITY_RANK: dict[str, int] = {"WARN": 1, "CRITICAL": 2}
"""The order of severities: an alert's severity only ever rises while it is open."""
STRONG_SIGNALS = frozenset({"uncorrectable_ecc", "remap_failure"})
"""The rules' strong signals: the card is already failing (an uncorrectable error grew, spare rows ran out)."""


@dataclass(frozen=True, slots=True)
class PredictedFault:
    node_name: str
    gpu_index: int
    uuid: str | None
    window_days: int
    rule_version: str
    evidence: str


@dataclass(frozen=True, slots=True)
class AlertedCard:
    """One predicted card of a node-level GPU_FAULT_PREDICTED alert: its newest prediction under the alert."""

    gpu_index: int
    uuid: str | None
    source: str
    prediction_id: str
    signals: tuple[str, ...]
    status: PredictionStatus
    t0: datetime
    evidence: str

    @property
    def severity(self) -> AlertSeverity:
        return severity_of(self.signals)


def alerted_cards(predictions: Iterable[AlertedCard]) -> list[AlertedCard]:
    """Each card once (its newest prediction), the most severe first, then by index."""
    newest: dict[int, AlertedCard] = {}
    for card in predictions:
        if card.gpu_index not in newest or card.t0 > newest[card.gpu_index].t0:
            newest[card.gpu_index] = card
    return sorted(newest.values(), key=lambda c: (-SEVERITY_RANK[c.severity], c.gpu_index))


def predicted_fault_message(fault: PredictedFault) -> str:
    """Says "predicted", with window, evidence and rule version; never "failed", never an accuracy claim.

    Distinct from GPU_MEMORY_HIGH (memory full, the card is fine): this one means the hardware error counters
    are degrading — plan a maintenance window and prepare a replacement card.
    """
    card = f"GPU {fault.gpu_index}" + (f" ({fault.uuid})" if fault.uuid else "")
    return (
        f"Memory fault predicted on {fault.node_name} {card} within {fault.window_days} days "
        f"(experimental rule {fault.rule_version}). Hardware error counters are degrading: plan a maintenance "
        f"window and prepare a replacement card. Evidence: {fault.evidence.replace(chr(10), '; ')}"
    )


def severity_of(signals: Iterable[str]) -> AlertSeverity:
    """A strong signal (remap failure, uncorrectable growth) is CRITICAL; a trend alone is WARN."""
    return "CRITICAL" if any(code in STRONG_SIGNALS for code in signals) else "WARN"


def higher_severity(current: str, candidate: str) -> str:
    """The more severe of two severities (an unknown one ranks below WARN)."""
    return candidate if SEVERITY_RANK.get(candidate, 0) > SEVERITY_RANK.get(current, 0) else current


def resolution_by_backfill(latest_by_slot: Mapping[int, PredictionStatus], *, any_hit: bool) -> str | None:
    """The system resolves an open alert only when every slot's latest judgement is a miss.

    Once any of its predictions is a hit there is a hardware problem nobody has handled yet, and while a slot's
    latest judgement is voided nothing was observed: claiming recovery would be invented. Only a manual resolve
    (or the node's deletion) closes those.
    """
    if any_hit or not latest_by_slot:
        return None
    if all(status == "miss" for status in latest_by_slot.values()):
        return "window expired, no uncorrectable-ECC growth"
    return None
