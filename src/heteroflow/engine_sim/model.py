"""A tiny deterministic mixture-of-experts language model (torch, CPU, float64). Worker side only.

Per sequence: a recurrent state ``h ← tanh(E[token] + W_h h)`` (the dense, replicated part), then one MoE
layer ``y = h + Σ_top-2 g_e · expert_e(h)`` and greedy ``argmax(y W_out)``. Every weight derives from the
seed (expert ``e``'s from ``seed`` and ``e``), so a replica loaded on any rank is bit-identical, and each
logical expert is computed by exactly one replica: a token's MoE output is the sum of at most two non-zero
contributions and zeros, which is exact in any summation order. Everything is computed one vector at a
time, so results do not depend on how requests were batched or how many ranks there are. Greedy outputs
are therefore identical before a fault and after any recovery.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

with warnings.catch_warnings():
    # the CPU wheel warns once that NumPy is absent; the simulator does not use NumPy
    warnings.simplefilter("ignore")
    import torch

from heteroflow.engine_sim.placement import ExpertPlacement
from heteroflow.engine_sim.vocab import VOCAB_SIZE

D_MODEL = 16
D_FF = 32
TOP_K = 2
_DTYPE = torch.float64


@dataclass(frozen=True)
class ExpertWeights:
    w1: torch.Tensor
    w2: torch.Tensor


class TinyMoE:
    """The replicated dense part and the expert weight factory."""

    def __init__(self, *, seed: int, num_experts: int) -> None:
        self.seed = seed
        self.num_experts = num_experts
        g = torch.Generator().manual_seed(seed)
        self.embedding = torch.randn(VOCAB_SIZE, D_MODEL, generator=g, dtype=_DTYPE)
        self.w_h = torch.randn(D_MODEL, D_MODEL, generator=g, dtype=_DTYPE) * 0.5
        self.w_router = torch.randn(D_MODEL, num_experts, generator=g, dtype=_DTYPE)
        self.w_out = torch.randn(D_MODEL, VOCAB_SIZE, generator=g, dtype=_DTYPE)

    def expert(self, expert: int) -> ExpertWeights:
        """Expert ``expert``'s weights ("loading" a replica into a slot regenerates them exactly)."""
        g = torch.Generator().manual_seed(self.seed * 100_003 + expert + 1)
        w1 = torch.randn(D_MODEL, D_FF, generator=g, dtype=_DTYPE) / D_MODEL**0.5
        w2 = torch.randn(D_FF, D_MODEL, generator=g, dtype=_DTYPE) / D_FF**0.5
        return ExpertWeights(w1=w1, w2=w2)

    def initial_state(self) -> torch.Tensor:
        return torch.zeros(D_MODEL, dtype=_DTYPE)

    def advance(self, h: torch.Tensor, token: int) -> torch.Tensor:
        return torch.tanh(self.embedding[token] + torch.mv(self.w_h, h))

    def prefill(self, tokens: tuple[int, ...]) -> torch.Tensor:
        h = self.initial_state()
        for token in tokens:
            h = self.advance(h, token)
        return h

    def route(self, x: torch.Tensor) -> list[tuple[int, float]]:
        """The top-2 experts of a hidden vector with their softmax gates."""
        logits = torch.mv(self.w_router.t(), x)
        values, indices = torch.topk(logits, TOP_K)
        gates = torch.softmax(values, dim=0)
        return [(int(i), float(gv)) for i, gv in zip(indices.tolist(), gates.tolist(), strict=True)]

    @staticmethod
    def expert_forward(weights: ExpertWeights, x: torch.Tensor) -> torch.Tensor:
        return torch.mv(weights.w2.t(), torch.relu(torch.mv(weights.w1.t(), x)))

    def next_token(self, y: torch.Tensor) -> int:
        logits = torch.mv(self.w_out.t(), y)
        # rounding makes the argmax immune to last-bit differences between BLAS code paths
        return int(torch.argmax(torch.round(logits, decimals=9)).item())


class ExpertShard:
    """The experts this rank computes: the active replicas it holds under the current placement."""

    def __init__(self, model: TinyMoE, placement: ExpertPlacement, rank: int) -> None:
        self.model = model
        self.rank = rank
        self.placement = placement
        self.loaded: dict[int, ExpertWeights] = {}
        self.load(placement)

    def load(self, placement: ExpertPlacement) -> list[int]:
        """Switch to ``placement``; returns the experts whose weights had to be loaded."""
        wanted = {expert for _, expert in placement.active_experts(self.rank)}
        newly = sorted(wanted - set(self.loaded))
        self.loaded = {e: self.loaded.get(e) or self.model.expert(e) for e in sorted(wanted)}
        self.placement = placement
        return newly

    def contribution(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of the MoE output for hidden vector ``x`` (zeros if none of its experts)."""
        out = torch.zeros_like(x)
        for expert, gate in self.model.route(x):
            weights = self.loaded.get(expert)
            if weights is not None:
                out += gate * TinyMoE.expert_forward(weights, x)
        return out
