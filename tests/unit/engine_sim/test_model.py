"""The tiny MoE (needs torch; skipped without the ``sim`` extra)."""

from __future__ import annotations

from types import ModuleType

import pytest

from heteroflow.engine_sim.placement import initial_placement, remove_ranks


@pytest.fixture
def model_module(torch: ModuleType) -> ModuleType:
    from heteroflow.engine_sim import model

    return model


def test_the_moe_output_is_the_same_whatever_the_placement(torch: ModuleType, model_module: ModuleType) -> None:
    moe = model_module.TinyMoE(seed=7, num_experts=4)
    full = initial_placement(dp_size=4, num_experts=4, num_redundant_experts=4, slots_per_rank=2)
    x = moe.prefill((3, 1, 4, 1, 5))
    for placement in (full, remove_ranks(full, {2}), remove_ranks(remove_ranks(full, {2}), {0})):
        total = sum(model_module.ExpertShard(moe, placement, r).contribution(x) for r in placement.ranks)
        reference = sum(g * moe.expert_forward(moe.expert(e), x) for e, g in moe.route(x))
        assert torch.equal(total, reference)


def test_a_shard_loads_only_the_experts_it_newly_computes(model_module: ModuleType) -> None:
    moe = model_module.TinyMoE(seed=7, num_experts=4)
    full = initial_placement(dp_size=4, num_experts=4, num_redundant_experts=4, slots_per_rank=2)
    shard = model_module.ExpertShard(moe, full, 3)
    assert shard.loaded == {}  # rank 3's replicas are redundant: rank 1 computes experts 2 and 3
    after = remove_ranks(remove_ranks(full, {2}), {0})  # experts 0 and 1 move into rank 3's slots
    assert after.slots_of(3) == (1, 0)
    assert shard.load(after) == [0, 1]


def test_weights_are_deterministic(torch: ModuleType, model_module: ModuleType) -> None:
    a = model_module.TinyMoE(seed=1, num_experts=2)
    b = model_module.TinyMoE(seed=1, num_experts=2)
    assert torch.equal(a.w_out, b.w_out)
    assert torch.equal(a.expert(1).w1, b.expert(1).w1)
    assert a.next_token(a.prefill((1, 2))) == b.next_token(b.prefill((1, 2)))
