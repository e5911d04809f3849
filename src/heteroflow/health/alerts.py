"""Alert decisions for GPU_FAULT_PREDICTED (H-60…H-62). Purely computational, no side effects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from heteroflow.health.predictions import PredictionStatus

GPU_FAULT_PREDICTED = "GPU_FAULT_PREDICTED"
AlertStatus = Literal["open", "resolved"]


@dataclass(frozen=True, slots=True)
class PredictedFault:
    node_name: str
    gpu_index: int
    uuid: str | None
    window_days: int
    rule_version: str
    evidence: str


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
