"""FtGate: the round's static admission checks, with reason codes (F-21, F-55). Purely computational.

The gate is the first step inside a round (RFC §2), not a service: the shell calls :func:`evaluate` in
DECIDING; a refusal is recorded in the runtime's ``gate`` and the frozen fallback runs. Fused MC2 is not
checked (it is not a gate: a test shows MC2 off is no rejection), and the redundant-expert count is not a
budget of removable ranks — the engine judges the slots after apply — unless ``gate_expert_capacity`` asks
for the arithmetic check (F-55; default off, recorded as a warning either way).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from heteroflow.contracts.serving import FtCapability


class GateReason(StrEnum):
    """Reason codes as in MindIE-Motor (``engine-protocol.md``)."""

    FEATURE_DISABLED = "FEATURE_DISABLED"
    ENGINE_FT_REQUIRED = "ENGINE_FT_REQUIRED"
    EXTERNAL_LB_REQUIRED = "EXTERNAL_LB_REQUIRED"
    AUTO_RECOVERY_CONFLICT = "AUTO_RECOVERY_CONFLICT"
    ENGINE_SCALE_DOWN_UNSUPPORTED = "ENGINE_SCALE_DOWN_UNSUPPORTED"
    EPLB_REQUIRED = "EPLB_REQUIRED"
    EXPERT_REDUNDANCY_REQUIRED = "EXPERT_REDUNDANCY_REQUIRED"
    EXPERT_CAPACITY_INSUFFICIENT = "EXPERT_CAPACITY_INSUFFICIENT"
    NO_SURVIVOR = "NO_SURVIVOR"
    TOPOLOGY_INCOMPLETE = "TOPOLOGY_INCOMPLETE"
    CAPABILITY_MISMATCH = "CAPABILITY_MISMATCH"
    ELASTIC_EP_RESIZED = "ELASTIC_EP_RESIZED"
    """vLLM's elastic EP resized the engines' world outside HeteroFlow: their fault tolerance still counts the
    launch's ranks (vLLM 0.34 freezes them at start), so a ``scale_down`` would name ranks of another world."""


@dataclass(frozen=True, slots=True)
class GateResult:
    allowed: bool
    reason_codes: tuple[GateReason, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GateFlags:
    enable_fault_tolerance: bool = True
    enable_dp_scale_down: bool = False
    gate_expert_capacity: bool = False


def expert_capacity(capability: FtCapability, *, survivors: int) -> tuple[int, int]:
    """(physical slots left, logical experts): surviving EP ranks x slots per rank vs logical experts (F-55).
    In DP+EP each DP rank holds ``tp_size`` EP ranks."""
    return survivors * capability.tp_size * capability.slots_per_rank, capability.num_logical_experts


def evaluate(
    *,
    flags: GateFlags,
    capability: FtCapability | None,
    survivors: int,
    topology_error: str | None = None,
    capability_mismatch: bool = False,
    elastic_ep_resized: Mapping[int, int | None] | None = None,
) -> GateResult:
    """Every failing check's reason code, in a fixed order; ``allowed`` when there is none.

    ``capability`` is ``None`` when the pods' capabilities could not be agreed or are missing (fail closed);
    ``topology_error`` is the text of a :class:`TopologyError` met while planning the round;
    ``elastic_ep_resized`` the ranks whose engine's world elastic EP resized since launch, with the DP size
    asked for where the engine said it (their NodeManagers' heartbeats).
    """
    reasons: list[GateReason] = []
    warnings: list[str] = []
    if not (flags.enable_fault_tolerance and flags.enable_dp_scale_down):
        reasons.append(GateReason.FEATURE_DISABLED)
    if capability_mismatch:
        reasons.append(GateReason.CAPABILITY_MISMATCH)
    if topology_error is not None or (capability is None and not capability_mismatch):
        reasons.append(GateReason.TOPOLOGY_INCOMPLETE)
        if topology_error:
            warnings.append(topology_error)
    if capability is not None:
        if not capability.engine_ft_enabled:
            reasons.append(GateReason.ENGINE_FT_REQUIRED)
        if capability.protocol_profile == "mixed" and not capability_mismatch:
            reasons.append(GateReason.CAPABILITY_MISMATCH)  # the pods' engines speak different profiles
        if not capability.scale_down_supported:
            # vLLM 0.32/0.33 know only retry: DP scale-down needs vLLM 0.34 or later
            reasons.append(GateReason.ENGINE_SCALE_DOWN_UNSUPPORTED)
        if not capability.external_lb:
            reasons.append(GateReason.EXTERNAL_LB_REQUIRED)
        if capability.auto_recovery_enabled:
            reasons.append(GateReason.AUTO_RECOVERY_CONFLICT)
        if not capability.eplb_enabled:
            reasons.append(GateReason.EPLB_REQUIRED)
        if capability.num_redundant_experts <= 0:
            reasons.append(GateReason.EXPERT_REDUNDANCY_REQUIRED)
        slots, logical = expert_capacity(capability, survivors=survivors)
        if survivors > 0 and slots < logical:
            warnings.append(f"expert capacity: {slots} physical slots left for {logical} logical experts")
            if flags.gate_expert_capacity:
                reasons.append(GateReason.EXPERT_CAPACITY_INSUFFICIENT)
    if elastic_ep_resized:
        reasons.append(GateReason.ELASTIC_EP_RESIZED)
        sizes = sorted({size for size in elastic_ep_resized.values() if size is not None})
        asked = f" (DP size asked: {', '.join(map(str, sizes))})" if sizes else ""
        warnings.append(
            f"elastic EP resized the world of ranks {sorted(elastic_ep_resized)} outside HeteroFlow{asked}: the "
            "engines' fault tolerance still counts the ranks they were launched with, so no scale_down until the "
            "instance is relaunched"
        )
    if survivors < 1:
        reasons.append(GateReason.NO_SURVIVOR)
    return GateResult(allowed=not reasons, reason_codes=tuple(reasons), warnings=tuple(warnings))
