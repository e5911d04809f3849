"""Where a whole-instance fallback may relaunch its engines: never on a card with a standing hardware fault
(F-14 with F-3). Purely computational, no side effects.

A *standing* fault is a hardware fault at level 5 or 6 that its source has not cleared since (the card was not
reported healthy again, or replaced): L5 means the card must be reset before it is trusted again and L6 that it
is gone or needs replacement, and a relaunch resets nothing, so an engine started on such a card meets the same
fault. An L4 fault (a contained error: the card keeps working) and an L1-L3 one do not stand in the way of a
relaunch. A fault the controller could not map onto ranks (UNMAPPABLE) names no rank, so it keeps none off its
card: the relaunch stays in place, as the original strategy.

:func:`plan_relaunch` turns the ranks a fallback would start and those on a standing fault into one of four
plans, by platform:

- ``IN_PLACE`` — no rank to start is on a faulty card: every NodeManager restarts its engines where they are.
- ``REPLACE_PODS`` — Kubernetes: each pod holding such a rank is deleted, so that its StatefulSet creates it
  again and the scheduler gives it healthy cards (the device plugin no longer offers the faulty one); the
  relaunch waits until every replaced pod has registered again.
- ``WITHOUT_RANKS`` — local (no pod can be replaced): the instance comes back without those ranks, a smaller DP
  size, when the gate a scale-down round passes allows that many survivors; they are retired like committed
  ranks and the instance runs SCALED_DOWN_RUNNING.
- ``REFUSED`` — locally, when it cannot come back without them (the gate refuses, or every rank is on a faulty
  card), and anywhere when the ranks left to start cannot hold every logical expert in their slots: nothing is
  relaunched, the status says why (``reason_code`` and an English ``reason``) and the controller relaunches
  again only when the fault clears or an operator acts — never a relaunch loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from heteroflow.contracts.serving import FtCapability, expert_capacity_shortfall, relaunch_redundant_experts

from . import gate
from .normalizer import HardwareFault, MappingKind, map_hardware_fault
from .ranks import DpRank, PodId, ranks
from .topology import InstanceTopology

STANDING_FAULT_MIN_LEVEL = 5
"""L5 (reset before trusted again) and L6 (gone / replace): a relaunch on the card meets the fault again."""


def is_standing(fault: HardwareFault) -> bool:
    """Whether ``fault`` keeps an engine off its card until the source clears it."""
    return fault.level >= STANDING_FAULT_MIN_LEVEL


class RelaunchKind(StrEnum):
    IN_PLACE = "IN_PLACE"
    REPLACE_PODS = "REPLACE_PODS"
    WITHOUT_RANKS = "WITHOUT_RANKS"
    REFUSED = "REFUSED"


class RelaunchReason(StrEnum):
    """Why a fallback does not relaunch every rank where it ran; the dashboard words each in its language."""

    PODS_REPLACED = "standing_fault_pods_replaced"
    """Kubernetes: the pods of the faulty cards are deleted for replacement."""
    RANKS_LEFT_OUT = "standing_fault_ranks_left_out"
    """Local: the instance comes back without the ranks on faulty cards."""
    SCALE_DOWN_REFUSED = "standing_fault_scale_down_refused"
    """Local: the instance cannot run without them (the scale-down gate refuses)."""
    EVERY_RANK_FAULTY = "standing_fault_every_rank"
    """Local: every rank to start is on a faulty card."""
    EXPERT_CAPACITY = "relaunch_expert_capacity_insufficient"
    """The ranks to start cannot hold every logical expert in their slots: the engines would refuse to start."""


@dataclass(frozen=True, slots=True)
class RelaunchPlan:
    kind: RelaunchKind
    retired: frozenset[DpRank]
    """The retired set every NodeManager's is replaced with (the fallback's own, plus ranks left out)."""
    faulty: frozenset[DpRank] = frozenset()
    """Ranks the fallback would start on a card with a standing fault."""
    faults: tuple[str, ...] = ()
    """The keys of those standing faults."""
    pods: tuple[PodId, ...] = ()
    """``REPLACE_PODS``: the pods to delete for replacement."""
    reason_code: RelaunchReason | None = None
    reason: str = ""
    """An English sentence saying what the controller does and why; empty for ``IN_PLACE``."""
    gate_reasons: tuple[str, ...] = ()
    """``REFUSED`` by the gate: its reason codes."""


def faulty_ranks(
    standing: Iterable[HardwareFault], topology: InstanceTopology
) -> tuple[frozenset[DpRank], tuple[str, ...]]:
    """The ranks of ``topology`` on a card (or node) of a standing fault, and those faults' keys. Mapped against
    the topology as it is now, so a replaced pod's new cards are no longer hit."""
    hit: set[int] = set()
    keys: list[str] = []
    for fault in standing:
        if not is_standing(fault):
            continue
        mapping = map_hardware_fault(fault, topology)
        if mapping.kind == MappingKind.MAPPED and mapping.ranks:
            hit |= mapping.ranks
            keys.append(fault.key)
    return ranks(hit), tuple(sorted(keys))


def plan_relaunch(
    *,
    topology: InstanceTopology,
    retired: frozenset[DpRank],
    standing: Iterable[HardwareFault],
    can_replace_pods: bool,
    flags: gate.GateFlags,
    capability: FtCapability | None,
) -> RelaunchPlan:
    """How a fallback whose retired set is ``retired`` relaunches ``topology``'s engines, given the ``standing``
    hardware faults. ``can_replace_pods``: the controller can have a pod deleted for replacement (Kubernetes).

    A released engine cannot be started with ranks already dead, so a relaunch without some ranks starts the
    others as a smaller, contiguous DP world (the NodeManagers renumber them, ``node_manager/spec.py``). Each card
    keeps its expert slots, so the smaller world must still hold every logical expert: checked here, before
    anything is stopped, whatever ``gate_expert_capacity`` says (an engine judges the slots after a scale_down,
    but a fresh launch that cannot place its experts does not start at all)."""
    start = topology.original_dp_ranks - retired
    hit, keys = faulty_ranks(standing, topology)
    faulty = ranks(hit & start)
    if not faulty:
        return _within_capacity(RelaunchPlan(RelaunchKind.IN_PLACE, retired=retired), topology, capability)
    listed = ", ".join(str(r) for r in sorted(faulty))
    if can_replace_pods:
        pods = tuple(sorted(pod.pod_id for pod in topology.pods if pod.dp_ranks & faulty))
        plan = RelaunchPlan(
            RelaunchKind.REPLACE_PODS,
            retired=retired,
            faulty=faulty,
            faults=keys,
            pods=pods,
            reason_code=RelaunchReason.PODS_REPLACED,
            reason=(
                f"ranks {listed} run on cards with a standing hardware fault: pods {', '.join(pods)} are deleted "
                "for replacement, and the instance is relaunched once they have registered again"
            ),
        )
        return _within_capacity(plan, topology, capability)
    survivors = start - faulty
    if not survivors:
        return RelaunchPlan(
            RelaunchKind.REFUSED,
            retired=retired,
            faulty=faulty,
            faults=keys,
            reason_code=RelaunchReason.EVERY_RANK_FAULTY,
            reason=(
                f"every rank to start ({listed}) runs on a card with a standing hardware fault: nothing is "
                "relaunched until the fault clears or the cards are replaced"
            ),
        )
    verdict = gate.evaluate(flags=flags, capability=capability, survivors=len(survivors))
    if not verdict.allowed:
        codes = tuple(r.value for r in verdict.reason_codes)
        return RelaunchPlan(
            RelaunchKind.REFUSED,
            retired=retired,
            faulty=faulty,
            faults=keys,
            reason_code=RelaunchReason.SCALE_DOWN_REFUSED,
            reason=(
                f"ranks {listed} run on cards with a standing hardware fault and the instance cannot run without "
                f"them ({', '.join(codes)}): nothing is relaunched until the fault clears or the cards are replaced"
            ),
            gate_reasons=codes,
        )
    plan = RelaunchPlan(
        RelaunchKind.WITHOUT_RANKS,
        retired=ranks(retired | faulty),
        faulty=faulty,
        faults=keys,
        reason_code=RelaunchReason.RANKS_LEFT_OUT,
        reason=(
            f"ranks {listed} run on cards with a standing hardware fault: the instance is relaunched without "
            f"them ({len(survivors)} of {len(topology.original_dp_ranks)} DP ranks)"
        ),
    )
    return _within_capacity(plan, topology, capability)


def _within_capacity(plan: RelaunchPlan, topology: InstanceTopology, capability: FtCapability | None) -> RelaunchPlan:
    """``plan``, or ``REFUSED`` when the ranks it starts cannot hold every logical expert in their slots."""
    members = len(topology.original_dp_ranks - plan.retired)
    if capability is None or members == len(topology.original_dp_ranks):
        return plan
    redundant = relaunch_redundant_experts(
        members=members,
        tp_size=capability.tp_size,
        slots_per_rank=capability.slots_per_rank,
        num_logical_experts=capability.num_logical_experts,
    )
    if redundant >= 0:
        return plan
    return replace(
        plan,
        kind=RelaunchKind.REFUSED,
        reason_code=RelaunchReason.EXPERT_CAPACITY,
        reason=(
            expert_capacity_shortfall(
                members=members, redundant=redundant, num_logical_experts=capability.num_logical_experts
            )
            + ": the engines cannot start that small, so nothing is relaunched until the cards are back or replaced"
        ),
        gate_reasons=(gate.GateReason.EXPERT_CAPACITY_INSUFFICIENT.value,),
    )
