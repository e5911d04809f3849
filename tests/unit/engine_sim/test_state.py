from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from heteroflow.contracts.engine_protocol import TERMINAL_FAULT_INFO, ApplyParams, ApplyRequest
from heteroflow.engine_sim import state as sm

RECOVERY = 120.0


def scale_down(
    request_id: str, removed: list[int], *, ip: str | None = "127.0.0.1", port: int | None = 29700
) -> ApplyRequest:
    return ApplyRequest(
        instruction="scale_down",
        request_id=request_id,
        params=ApplyParams(removed_dp_ranks=removed, dp_master_ip=ip, dp_store_port=port),
    )


def unhealthy(rank: int = 1, dp_size: int = 4, dead: frozenset[int] = frozenset()) -> sm.EngineState:
    """An engine that saw a fault; ``dead``: ranks an earlier, committed scale_down removed (the only way a dead
    set arises: a launch has none)."""
    state = sm.initial_state(rank=rank, dp_size=dp_size)
    if dead:
        faulted = sm.on_collective_fault(
            state, fault_info="RuntimeError", mask=(1,) * dp_size, now=0.0, recovery_timeout=RECOVERY
        ).state
        running = sm.on_command(faulted, scale_down("earlier", sorted(dead))).state
        state = sm.on_rebuild_finished(
            running, request_id="earlier", ok=True, error=None, now=0.0, recovery_timeout=RECOVERY
        ).state
        assert (state.health, state.dead_ranks) == ("healthy", dead)
    return sm.on_collective_fault(
        state, fault_info="RuntimeError", mask=(1,) * dp_size, now=0.0, recovery_timeout=RECOVERY
    ).state


def test_fault_makes_a_healthy_engine_unhealthy_and_aborts_requests() -> None:
    t = sm.on_collective_fault(
        sm.initial_state(rank=1, dp_size=4),
        fault_info="RuntimeError",
        mask=(1, 1, 1, 1),
        now=5.0,
        recovery_timeout=RECOVERY,
    )
    assert t.state.health == "unhealthy"
    assert t.state.recovery_deadline == 125.0
    assert isinstance(t.actions[0], sm.AbortRequests)
    assert t.state.status_entry().model_dump(exclude_none=True) == {
        "id": 1,
        "status": "unhealthy",
        "fault_info": "RuntimeError",
        "mask": [1, 1, 1, 1],
    }


@pytest.mark.parametrize(
    "removed",
    [[], [4], [-1], [1], [0, 1, 2, 3], [2]],
    ids=["empty", "outside", "negative", "own rank", "every rank", "no newly dead"],
)
def test_every_scale_down_validation_is_a_recorded_rejection(removed: list[int]) -> None:
    st0 = unhealthy(dead=frozenset({2}))
    t = sm.on_command(st0, scale_down("r", removed))
    assert not t.accepted
    # vLLM 0.34's one text for all of them (engine_core_sentinel.py L280-290)
    assert t.message == f"Invalid removed_dp_ranks {sorted(removed)} for engine 1 (dp_rank=1, dead_dp_ranks=[2])"
    assert t.state.ft_error == t.message
    assert t.state.last_ft_request_id == "r"
    assert t.state.ft_state == "failed"
    assert t.state.health == "unhealthy"
    assert t.actions == ()


def test_commands_are_rejected_unless_unhealthy() -> None:
    healthy = sm.initial_state(rank=1, dp_size=4)
    assert sm.on_command(healthy, scale_down("r", [2])).message == "status is HEALTHY"
    dead = sm.on_worker_died(healthy, reason="killed", now=0.0, recovery_timeout=RECOVERY).state
    t = sm.on_command(dead, ApplyRequest(instruction="retry", request_id="q"))
    assert t.message == "status is DEAD"
    assert t.state.last_ft_request_id == "q"


def test_the_store_master_loss_needs_a_new_store_address() -> None:
    st0 = unhealthy(rank=1)
    t = sm.on_command(st0, scale_down("r", [0], ip=None, port=None))
    assert not t.accepted
    assert t.message == "dp_store_port and dp_master_ip required when the store master (rank 0) is removed"


def test_scale_down_plan_uses_sorted_alive_and_moves_the_store_when_its_master_is_removed() -> None:
    st0 = unhealthy(rank=3, dead=frozenset({2}))
    t = sm.on_command(st0, scale_down("r2", [0, 2], ip="10.0.0.2", port=29800))
    assert t.accepted
    (action,) = t.actions
    assert isinstance(action, sm.StartRebuild)
    plan = action.plan
    assert plan.members == (1, 3)
    assert plan.dense_rank == 1
    assert plan.dead_ranks == {0, 2}
    assert plan.newly_removed == {0}
    assert plan.new_store == sm.StoreAddress("10.0.0.2", 29800)
    assert plan.store_master == 1
    assert t.state.ft_state == "recovering"
    assert t.state.status_entry().status == "unhealthy"


def test_a_re_elected_master_that_dies_later_also_moves_the_store() -> None:
    st0 = unhealthy(rank=3, dead=frozenset({0}))
    assert st0.store_master == 1  # rank 0 scaled down earlier: master = min(alive)
    plan = sm.on_command(st0, scale_down("r", [1], port=29900)).actions[0]
    assert isinstance(plan, sm.StartRebuild)
    assert plan.plan.new_store is not None
    assert plan.plan.store_master == 2


def test_keeping_the_master_keeps_the_store() -> None:
    plan = sm.on_command(unhealthy(rank=1), scale_down("r", [2], ip=None, port=None)).actions[0]
    assert isinstance(plan, sm.StartRebuild)
    assert plan.plan.new_store is None


def test_success_commits_the_cumulative_dead_set() -> None:
    st0 = sm.on_command(unhealthy(rank=1), scale_down("r", [2])).state
    done = sm.on_rebuild_finished(st0, request_id="r", ok=True, error=None, now=1.0, recovery_timeout=RECOVERY).state
    assert done.health == "healthy"
    assert done.dead_ranks == {2}
    # vLLM 0.34: the healthy push replaces the entry, dropping last_ft_request_id, ft_error and ft_state
    assert done.status_entry().model_dump(exclude_none=True) == {"id": 1, "status": "healthy"}
    again = sm.on_command(
        sm.on_collective_fault(
            done, fault_info="RuntimeError", mask=(1, 1, 0, 1), now=2.0, recovery_timeout=RECOVERY
        ).state,
        scale_down("r2", [3]),  # incremental: the engine keeps the cumulative set itself
    )
    assert again.accepted
    assert isinstance(again.actions[0], sm.StartRebuild)
    assert again.actions[0].plan.dead_ranks == {2, 3}


def test_a_failed_scale_down_is_terminal() -> None:
    st0 = sm.on_command(unhealthy(rank=1), scale_down("r", [2])).state
    t = sm.on_rebuild_finished(st0, request_id="r", ok=False, error="too few slots", now=1.0, recovery_timeout=RECOVERY)
    assert t.state.health == "dead"
    assert t.state.ft_state == "failed"
    assert t.state.ft_error == "too few slots"
    assert any(isinstance(a, sm.ExitProcess) for a in t.actions)


def test_a_failed_retry_leaves_the_engine_unhealthy_with_the_timer_from_the_fault() -> None:
    before = unhealthy(rank=1)
    st0 = sm.on_command(before, ApplyRequest(instruction="retry", request_id="q")).state
    assert st0.recovery_deadline == before.recovery_deadline  # one timer from the fault (both releases)
    t = sm.on_rebuild_finished(st0, request_id="q", ok=False, error="peer missing", now=50.0, recovery_timeout=RECOVERY)
    assert t.state.health == "unhealthy"
    assert t.state.ft_state == "failed"
    assert t.state.recovery_deadline == before.recovery_deadline
    assert sm.on_command(t.state, ApplyRequest(instruction="retry", request_id="q2")).accepted


def test_no_command_within_the_recovery_timeout_exits() -> None:
    st0 = unhealthy()
    assert sm.on_tick(st0, now=119.9).actions == ()
    t = sm.on_tick(st0, now=120.0)
    assert isinstance(t.actions[0], sm.ExitProcess)
    assert sm.on_tick(t.state, now=121.0).actions == ()  # exits once


def test_finishing_a_command_that_is_not_running_is_illegal() -> None:
    with pytest.raises(sm.IllegalTransitionError):
        sm.on_rebuild_finished(unhealthy(), request_id="x", ok=True, error=None, now=0.0, recovery_timeout=RECOVERY)


@pytest.mark.parametrize(("rank", "dp_size"), [(4, 4), (-1, 4), (0, 0)])
def test_contradictory_launch_parameters_are_refused(rank: int, dp_size: int) -> None:
    with pytest.raises(sm.ConfigurationError):
        sm.initial_state(rank=rank, dp_size=dp_size)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_launch_is_a_contiguous_world_without_dead_ranks(rank: int) -> None:
    """A relaunch without a lost rank is a smaller world (3 of 4): ranks range(3), master 0, no dead set; it
    scales down again like any instance."""
    fresh = sm.initial_state(rank=rank, dp_size=3)
    assert (fresh.members, fresh.dead_ranks, fresh.store_master) == ((0, 1, 2), frozenset(), 0)
    if rank == 0:
        return
    faulted = sm.on_collective_fault(fresh, fault_info="RuntimeError", mask=(0, 1, 1), now=0.0, recovery_timeout=1.0)
    t = sm.on_command(faulted.state, scale_down("r", [0], port=29900))
    assert isinstance(t.actions[0], sm.StartRebuild)
    plan = t.actions[0].plan
    assert (plan.members, plan.dense_rank, plan.store_master) == ((1, 2), rank - 1, 1)
    assert plan.new_store == sm.StoreAddress("127.0.0.1", 29900)


class EngineMachine(RuleBasedStateMachine):
    """Random event sequences against the invariants of engine-protocol.md."""

    @initialize(dp_size=st.integers(2, 6), data=st.data())
    def start(self, dp_size: int, data: st.DataObject) -> None:
        self.rank = data.draw(st.integers(0, dp_size - 1))
        self.dp_size = dp_size
        self.state = sm.initial_state(rank=self.rank, dp_size=dp_size)
        self.now = 0.0
        self.dead_history = self.state.dead_ranks
        self.ids = 0

    @rule()
    def collective_fault(self) -> None:
        before = self.state
        self.state = sm.on_collective_fault(
            before, fault_info="RuntimeError", mask=(1,) * self.dp_size, now=self.now, recovery_timeout=RECOVERY
        ).state
        if before.health == "healthy" and before.running is None and before.exiting is None:
            assert self.state.health == "unhealthy"

    @rule()
    def worker_dies(self) -> None:
        self.state = sm.on_worker_died(self.state, reason="killed", now=self.now, recovery_timeout=RECOVERY).state
        assert self.state.health == "dead"

    @rule(removed=st.lists(st.integers(-1, 7), max_size=4), retry=st.booleans(), with_store=st.booleans())
    def command(self, removed: list[int], retry: bool, with_store: bool) -> None:
        self.ids += 1
        request = (
            ApplyRequest(instruction="retry", request_id=f"r{self.ids}")
            if retry
            else scale_down(
                f"r{self.ids}", removed, ip="127.0.0.1" if with_store else None, port=29000 if with_store else None
            )
        )
        before = self.state
        t = sm.on_command(before, request)
        self.state = t.state
        assert t.state.last_ft_request_id == request.request_id
        if t.accepted:
            assert before.health == "unhealthy"
            assert before.running is None
            assert t.state.running is not None
            plan = t.state.running
            assert self.rank in plan.members
            assert self.rank not in plan.dead_ranks
            assert plan.members == tuple(sorted(plan.members))
            if not retry:
                assert plan.newly_removed
                assert not plan.newly_removed & before.dead_ranks
        else:
            assert t.state.health == before.health
            assert t.state.running == before.running

    @precondition(lambda self: self.state.running is not None)
    @rule(ok=st.booleans())
    def rebuild_finishes(self, ok: bool) -> None:
        running = self.state.running
        assert running is not None
        self.state = sm.on_rebuild_finished(
            self.state,
            request_id=running.request_id,
            ok=ok,
            error=None if ok else "boom",
            now=self.now,
            recovery_timeout=RECOVERY,
        ).state
        if ok:
            assert self.state.health == "healthy"
            assert self.state.dead_ranks == running.dead_ranks
        elif running.instruction == "scale_down":
            assert self.state.health == "dead"
            assert self.state.exiting is not None

    @rule(seconds=st.floats(0, 200))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.state = sm.on_tick(self.state, now=self.now).state

    @invariant()
    def dead_set_only_grows_and_never_holds_this_rank(self) -> None:
        assert self.dead_history <= self.state.dead_ranks
        assert self.rank not in self.state.dead_ranks
        assert len(self.state.dead_ranks) < self.dp_size
        self.dead_history = self.state.dead_ranks

    @invariant()
    def status_fields_follow_the_schema(self) -> None:
        entry = self.state.status_entry()
        assert entry.id == self.rank
        # vLLM 0.34: fault_info while unhealthy, and on the dead engine of a failed scale_down (its terminal reason)
        terminal = entry.status == "dead" and entry.fault_info == TERMINAL_FAULT_INFO
        assert (entry.fault_info is not None) == (entry.status == "unhealthy" or terminal)
        assert (entry.mask is not None) == (entry.status == "unhealthy")
        if self.state.running is not None:
            assert entry.ft_state == "recovering"
            assert entry.status == "unhealthy"
        if entry.status == "healthy":
            assert self.state.running is None

    @invariant()
    def the_store_master_is_a_member(self) -> None:
        assert self.state.store_master in self.state.members


TestEngineMachine = EngineMachine.TestCase
TestEngineMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
