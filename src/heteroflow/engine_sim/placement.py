"""Expert placement with EPLB redundancy: which logical expert sits in which physical slot of which rank.

Purely computational, no side effects. Ranks are original global DP ranks (one EP rank per DP rank).
Physical slot ``j`` of a rank holds one logical expert (or nothing, ``EMPTY``). A logical expert may have
several replicas; the forward pass computes each logical expert on exactly one of them, its *active*
replica (the lowest rank, then lowest slot), so that every token sees each expert once whatever the
membership, and greedy outputs do not change when ranks are removed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

EMPTY = -1


class PlacementError(ValueError):
    """A placement that cannot exist (bad sizes, unknown ranks)."""


class InsufficientExpertSlotsError(PlacementError):
    """Too few surviving slots to hold every logical expert once; the scale-down must fail."""


def redundant_experts_text(num_redundant_experts: int) -> str:
    """vLLM's refusal of a negative redundancy (``EPLBConfig.num_redundant_experts``, pydantic ``ge=0``)."""
    return (
        "1 validation error for EPLBConfig\nnum_redundant_experts\n  Input should be greater than or equal to 0 "
        f"[type=greater_than_equal, input_value={num_redundant_experts}, input_type=int]"
    )


def even_distribution_text(*, physical_experts: int, ep_size: int) -> str:
    """vLLM's refusal of physical experts that do not divide evenly over the EP ranks (FusedMoE with EPLB)."""
    return (
        "EPLB currently only supports even distribution of experts across ranks. "
        f"Got {physical_experts} experts and {ep_size} EP ranks."
    )


def launch_slots_per_rank(
    *, dp_size: int, num_experts: int, num_redundant_experts: int, slots_per_rank: int | None = None
) -> int:
    """The expert layout a launch gets, checked as vLLM 0.34 checks it at start; the slots per rank.

    vLLM refuses a negative ``num_redundant_experts`` (``EPLBConfig``, ``ge=0``) and, with EPLB and expert
    parallelism, ``num_experts + num_redundant_experts`` physical experts that are not a multiple of the EP
    size (one EP rank per DP rank here; ``fused_moe/layer.py``). Each rank then holds exactly
    ``(E + K) / dp_size`` slots: an explicit ``slots_per_rank`` (the simulator's own option) must say the same.
    Raises :class:`PlacementError` with vLLM's text, else the simulator's for the contradicting option.
    """
    if dp_size < 1 or num_experts < 1:
        raise PlacementError("dp_size and num_experts must be ≥ 1")
    if num_redundant_experts < 0:
        raise PlacementError(redundant_experts_text(num_redundant_experts))
    physical = num_experts + num_redundant_experts
    if physical % dp_size:
        raise PlacementError(even_distribution_text(physical_experts=physical, ep_size=dp_size))
    per_rank = physical // dp_size
    if slots_per_rank is not None and slots_per_rank != per_rank:
        raise PlacementError(
            f"--slots-per-rank {slots_per_rank} contradicts the expert layout: {num_experts} experts + "
            f"{num_redundant_experts} redundant over {dp_size} EP ranks are {per_rank} physical experts per rank"
        )
    return per_rank


def has_capacity(*, alive_ranks: int, slots_per_rank: int, num_experts: int) -> bool:
    """The engine's redundancy rule: ``(ep_world - dead) x slots_per_rank ≥ num_logical_experts``."""
    return alive_ranks * slots_per_rank >= num_experts


@dataclass(frozen=True, slots=True)
class ExpertPlacement:
    num_experts: int
    slots_per_rank: int
    slots: tuple[tuple[int, tuple[int, ...]], ...]
    """``(rank, logical expert per slot)`` pairs in ascending rank order."""

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(rank for rank, _ in self.slots)

    def slots_of(self, rank: int) -> tuple[int, ...]:
        for owner, experts in self.slots:
            if owner == rank:
                return experts
        raise PlacementError(f"rank {rank} holds no slots")

    def replicas(self) -> Mapping[int, tuple[tuple[int, int], ...]]:
        """Logical expert → its ``(rank, slot)`` replicas, in order of preference."""
        found: dict[int, list[tuple[int, int]]] = {e: [] for e in range(self.num_experts)}
        for rank, experts in self.slots:
            for slot, expert in enumerate(experts):
                if expert != EMPTY:
                    found[expert].append((rank, slot))
        return {e: tuple(places) for e, places in found.items()}

    def active_experts(self, rank: int) -> tuple[tuple[int, int], ...]:
        """``(slot, logical expert)`` pairs that ``rank`` computes: the experts whose active replica it holds."""
        return tuple(
            (places[0][1], expert)
            for expert, places in sorted(self.replicas().items())
            if places and places[0][0] == rank
        )

    def missing_experts(self) -> tuple[int, ...]:
        return tuple(e for e, places in self.replicas().items() if not places)

    def describe(self) -> dict[str, list[int]]:
        return {str(rank): list(experts) for rank, experts in self.slots}


def initial_placement(
    *, dp_size: int, num_experts: int, num_redundant_experts: int, slots_per_rank: int
) -> ExpertPlacement:
    """Round-robin: physical slot ``p`` holds logical expert ``p mod E`` for the first ``E + K`` slots."""
    if dp_size < 1 or num_experts < 1 or num_redundant_experts < 0 or slots_per_rank < 1:
        raise PlacementError("dp_size, num_experts and slots_per_rank must be ≥ 1, redundant experts ≥ 0")
    physical = num_experts + num_redundant_experts
    if dp_size * slots_per_rank < physical:
        raise PlacementError(
            f"{dp_size} ranks x {slots_per_rank} slots cannot hold {num_experts} experts "
            f"+ {num_redundant_experts} redundant replicas"
        )
    table = []
    for rank in range(dp_size):
        experts = []
        for slot in range(slots_per_rank):
            p = rank * slots_per_rank + slot
            experts.append(p % num_experts if p < physical else EMPTY)
        table.append((rank, tuple(experts)))
    return ExpertPlacement(num_experts=num_experts, slots_per_rank=slots_per_rank, slots=tuple(table))


def remove_ranks(placement: ExpertPlacement, removed: Iterable[int]) -> ExpertPlacement:
    """The placement after ``removed`` ranks are gone, with every lost expert re-assigned.

    Surviving replicas stay where they are (no weight moves for experts that were not lost). Each lost
    expert, in ascending order, takes the first empty surviving slot, else the last slot of the expert with
    the most surviving replicas (a redundant replica, so nothing else is lost). Raises
    :class:`InsufficientExpertSlotsError` when the survivors' slots cannot hold every expert once.
    """
    gone = set(removed)
    unknown = gone - set(placement.ranks)
    if unknown:
        raise PlacementError(f"ranks {sorted(unknown)} hold no slots")
    survivors = [(rank, list(experts)) for rank, experts in placement.slots if rank not in gone]
    if not has_capacity(
        alive_ranks=len(survivors), slots_per_rank=placement.slots_per_rank, num_experts=placement.num_experts
    ):
        raise InsufficientExpertSlotsError(
            f"{len(survivors)} surviving ranks x {placement.slots_per_rank} slots < "
            f"{placement.num_experts} logical experts"
        )
    held = Counter(e for _, experts in survivors for e in experts if e != EMPTY)
    for lost in range(placement.num_experts):
        if held[lost]:
            continue
        target = _free_slot(survivors) or _redundant_slot(survivors, held)
        rank_index, slot = target
        previous = survivors[rank_index][1][slot]
        if previous != EMPTY:
            held[previous] -= 1
        survivors[rank_index][1][slot] = lost
        held[lost] += 1
    return ExpertPlacement(
        num_experts=placement.num_experts,
        slots_per_rank=placement.slots_per_rank,
        slots=tuple((rank, tuple(experts)) for rank, experts in survivors),
    )


def _free_slot(survivors: list[tuple[int, list[int]]]) -> tuple[int, int] | None:
    for index, (_, experts) in enumerate(survivors):
        for slot, expert in enumerate(experts):
            if expert == EMPTY:
                return index, slot
    return None


def _redundant_slot(survivors: list[tuple[int, list[int]]], held: Counter[int]) -> tuple[int, int]:
    most = max((count, expert) for expert, count in held.items() if count > 0)
    if most[0] < 2:  # pragma: no cover - excluded by the capacity check (pigeonhole)
        raise InsufficientExpertSlotsError("no redundant replica left to overwrite")
    expert = most[1]
    for index in range(len(survivors) - 1, -1, -1):
        experts = survivors[index][1]
        for slot in range(len(experts) - 1, -1, -1):
            if experts[slot] == expert:
                return index, slot
    raise AssertionError("unreachable")  # pragma: no cover
