from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.engine_sim.placement import (
    EMPTY,
    InsufficientExpertSlotsError,
    PlacementError,
    has_capacity,
    initial_placement,
    remove_ranks,
)


def test_initial_placement_spreads_replicas_round_robin() -> None:
    p = initial_placement(dp_size=4, num_experts=4, num_redundant_experts=4, slots_per_rank=2)
    assert p.describe() == {"0": [0, 1], "1": [2, 3], "2": [0, 1], "3": [2, 3]}
    assert p.active_experts(0) == ((0, 0), (1, 1))
    assert p.active_experts(2) == ()


def test_unused_slots_stay_empty() -> None:
    p = initial_placement(dp_size=3, num_experts=4, num_redundant_experts=1, slots_per_rank=2)
    assert p.slots_of(2) == (0, EMPTY)


def test_too_few_slots_for_the_physical_experts_is_refused() -> None:
    with pytest.raises(PlacementError):
        initial_placement(dp_size=2, num_experts=4, num_redundant_experts=1, slots_per_rank=2)


def test_lost_experts_move_into_redundant_slots() -> None:
    p = initial_placement(dp_size=4, num_experts=4, num_redundant_experts=4, slots_per_rank=2)
    after = remove_ranks(remove_ranks(p, {2}), {0})
    assert after.ranks == (1, 3)
    assert after.missing_experts() == ()
    assert after.slots_of(1) == (2, 3)  # survivors' experts that were not lost stay put


def test_insufficient_slots_fail_the_scale_down() -> None:
    p = initial_placement(dp_size=4, num_experts=4, num_redundant_experts=4, slots_per_rank=2)
    with pytest.raises(InsufficientExpertSlotsError, match="slots"):
        remove_ranks(p, {0, 2, 3})


def test_unknown_ranks_are_refused() -> None:
    p = initial_placement(dp_size=2, num_experts=2, num_redundant_experts=0, slots_per_rank=1)
    with pytest.raises(PlacementError, match="hold no slots"):
        remove_ranks(p, {5})


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, int, int, int, list[int]]:
    dp = draw(st.integers(1, 8))
    experts = draw(st.integers(1, 12))
    redundant = draw(st.integers(0, 8))
    minimum = -(-(experts + redundant) // dp)
    slots = draw(st.integers(minimum, minimum + 3))
    order = draw(st.permutations(range(dp)))
    cut = draw(st.integers(0, dp))
    return dp, experts, redundant, slots, list(order[:cut])


@given(scenarios())
def test_every_expert_survives_exactly_when_capacity_allows(case: tuple[int, int, int, int, list[int]]) -> None:
    dp, experts, redundant, slots, removal_order = case
    p = initial_placement(dp_size=dp, num_experts=experts, num_redundant_experts=redundant, slots_per_rank=slots)
    for step, rank in enumerate(removal_order, start=1):
        alive = dp - step
        if not has_capacity(alive_ranks=alive, slots_per_rank=slots, num_experts=experts):
            with pytest.raises(InsufficientExpertSlotsError):
                remove_ranks(p, {rank})
            return
        before = {r: p.slots_of(r) for r in p.ranks if r != rank}
        p = remove_ranks(p, {rank})
        assert p.missing_experts() == ()
        assert rank not in p.ranks
        # only slots whose expert was redundant or empty may change
        for r, old in before.items():
            for slot, expert in enumerate(old):
                if p.slots_of(r)[slot] != expert:
                    assert expert == EMPTY or sum(e == expert for _, es in p.slots for e in es) >= 1
        # each logical expert has exactly one active replica
        active = [e for r in p.ranks for _, e in p.active_experts(r)]
        assert sorted(active) == list(range(experts))
