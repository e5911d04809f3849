"""Random fault sequences against the fake instance, driven by a minimal correct controller.

Invariants: a removed rank never comes back, healthy engines agree on the dead set, the dead set only
grows, and whatever survives serves the same greedy outputs as before any fault.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.testing import FakeEngineCluster

DP = 4


class FakeInstanceMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.cluster = FakeEngineCluster(dp_size=DP, num_experts=2, num_redundant_experts=2, slots_per_rank=1)
        self.run(self.cluster.start())
        self.baseline = self.run(conformance.outputs(self.cluster, 0))
        self.committed: set[int] = set()
        self.ids = itertools.count()

    def teardown(self) -> None:
        if hasattr(self, "cluster"):
            self.run(self.cluster.close())
            self.loop.close()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def statuses(self) -> dict[int, dict[str, Any] | None]:
        async def read() -> dict[int, dict[str, Any] | None]:
            return {r: await conformance.status_of(self.cluster, r) for r in range(DP)}

        return self.run(read())  # type: ignore[no-any-return]

    @rule(rank=st.integers(0, DP - 1))
    def kill_worker(self, rank: int) -> None:
        self.cluster.kill_worker(rank)
        self.run(self.cluster.settle())

    @rule(rank=st.integers(0, DP - 1))
    def transient(self, rank: int) -> None:
        if self.cluster.is_gone(rank):  # its engine exited (e.g. a scale-down it could not serve): no fault to take
            return
        self.run(conformance.inject(self.cluster, rank, "transient"))
        self.run(self.cluster.settle())

    @rule()
    def traffic(self) -> None:
        self.run(conformance.traffic(self.cluster, range(DP)))
        self.run(self.cluster.settle())

    @rule()
    def controller_round(self) -> None:
        """One round of the RFC's decision: complete U+D → scale_down; all U → retry; else wait."""
        status = {r: e["status"] for r, e in self.statuses().items() if e is not None and r not in self.committed}
        dead = {r for r, s in status.items() if s == "dead"}
        unhealthy = {r for r, s in status.items() if s == "unhealthy"}
        active = set(range(DP)) - self.committed
        if not unhealthy or dead | unhealthy != active:
            return
        request_id = f"round-{next(self.ids)}"
        if dead:
            body: dict[str, Any] = {
                "instruction": "scale_down",
                "request_id": request_id,
                "params": {"removed_dp_ranks": sorted(self.committed | dead)},
            }
        else:
            body = {"instruction": "retry", "request_id": request_id}
        for rank in sorted(unhealthy):
            self.run(conformance.apply(self.cluster, rank, body))
        self.run(self.cluster.let_time_pass(1.0))
        after = self.statuses()
        if all(after[r] is not None and after[r]["status"] == "healthy" for r in unhealthy):  # type: ignore[index]
            self.committed |= dead
            event(f"{body['instruction']} committed")
        else:
            event(f"{body['instruction']} failed")

    @rule(seconds=st.sampled_from([1.0, 10.0]))
    def time_passes(self, seconds: float) -> None:
        self.run(self.cluster.let_time_pass(seconds))

    @invariant()
    def removed_ranks_never_come_back_and_survivors_agree(self) -> None:
        healthy = {}
        for rank, core in self.cluster.cores.items():
            if self.cluster.is_gone(rank):
                continue
            state = core.state
            assert not (state.dead_ranks - self.committed)
            if state.health == "healthy" and state.running is None:
                healthy[rank] = state.dead_ranks
        assert not set(healthy) & self.committed
        assert len(set(healthy.values())) <= 1

    @invariant()
    def survivors_serve_the_same_outputs(self) -> None:
        for rank, core in self.cluster.cores.items():
            if not self.cluster.is_gone(rank) and core.state.serving:
                response = self.run(conformance.complete(self.cluster, rank, conformance.PROMPTS[0]))
                choice = response.json()["choices"][0] if response.status_code == 200 else None
                # vLLM 0.34 ends a request its fault aborted with 200 finish_reason "abort" and no text
                if choice is not None and choice["finish_reason"] != "abort":
                    assert choice["text"] == self.baseline[0]
                return


TestFakeInstance = FakeInstanceMachine.TestCase
TestFakeInstance.settings = settings(max_examples=80, stateful_step_count=20, deadline=None)
