"""The EngineFtService state machine (guard / apply / finalize), pure: no HTTP, no clock but numbers."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from heteroflow.serving.node_manager import service
from heteroflow.serving.node_manager.service import FtServiceState


def guarded(request_id: str = "r1", *, lease: float = 60.0, now: float = 0.0) -> FtServiceState:
    state, outcome = service.guard(FtServiceState(), request_id=request_id, lease_sec=lease, now=now)
    assert not outcome.renewed
    return state


def test_guard_freezes_for_the_lease_and_the_same_id_renews() -> None:
    state = guarded(lease=10.0, now=100.0)
    assert state.is_frozen(109.9)
    assert not state.is_frozen(110.0)
    renewed, outcome = service.guard(state, request_id="r1", lease_sec=10.0, now=105.0)
    assert outcome.renewed
    assert renewed.is_frozen(114.9)
    assert renewed.lease_left(110.0) == pytest.approx(5.0)


def test_another_id_is_refused_while_frozen_and_takes_over_after_expiry() -> None:
    state = guarded(lease=10.0)
    with pytest.raises(service.GuardConflictError):
        service.guard(state, request_id="r2", lease_sec=10.0, now=9.99)
    taken, outcome = service.guard(state, request_id="r2", lease_sec=10.0, now=10.0)
    assert taken.owner == "r2"
    assert not outcome.renewed
    assert not taken.applied


@pytest.mark.parametrize("lease", [0.0, -1.0, 3600.01, float("inf")])
def test_lease_must_be_in_zero_to_an_hour(lease: float) -> None:
    with pytest.raises(service.InvalidCommandError):
        service.guard(FtServiceState(), request_id="r1", lease_sec=lease, now=0.0)


def test_lease_of_exactly_an_hour_is_legal() -> None:
    assert guarded(lease=3600.0).is_frozen(3599.0)


def test_apply_needs_the_callers_live_guard_and_happens_once() -> None:
    with pytest.raises(service.NotGuardedError):
        service.apply(FtServiceState(), request_id="r1", instruction="scale_down", fast_recovery_enabled=False, now=0)
    state = guarded()
    with pytest.raises(service.GuardConflictError):
        service.apply(state, request_id="r2", instruction="scale_down", fast_recovery_enabled=False, now=1)
    state, instruction = service.apply(
        state, request_id="r1", instruction="scale_down", fast_recovery_enabled=False, now=1
    )
    assert instruction == "scale_down"
    assert state.applied
    with pytest.raises(service.AlreadyAppliedError):
        service.apply(state, request_id="r1", instruction="scale_down", fast_recovery_enabled=False, now=2)


def test_apply_after_the_lease_expired_is_refused() -> None:
    with pytest.raises(service.NotGuardedError, match="expired"):
        service.apply(guarded(lease=5.0), request_id="r1", instruction="scale_down", fast_recovery_enabled=False, now=6)


@pytest.mark.parametrize(
    ("instruction", "fast_recovery", "ok"),
    [
        ("scale_down", False, True),
        ("retry", True, True),
        ("retry", False, False),
        ("scale_up", True, False),
        ("SCALE_DOWN", False, False),
        ("", True, False),
    ],
)
def test_only_scale_down_and_retry_with_fast_recovery(instruction: str, fast_recovery: bool, ok: bool) -> None:
    if ok:
        assert service.check_instruction(instruction, fast_recovery_enabled=fast_recovery) == instruction
    else:
        with pytest.raises(service.InvalidCommandError):
            service.check_instruction(instruction, fast_recovery_enabled=fast_recovery)


def test_invalid_instruction_is_refused_before_the_guard_is_consumed() -> None:
    state = guarded()
    with pytest.raises(service.InvalidCommandError):
        service.apply(state, request_id="r1", instruction="retry", fast_recovery_enabled=False, now=1)
    state, _ = service.apply(state, request_id="r1", instruction="scale_down", fast_recovery_enabled=False, now=1)
    assert state.applied


def test_commit_registers_retired_ids_and_unfreezes() -> None:
    state, outcome = service.finalize(guarded(), request_id="r1", commit=True, retired=[1, 3], now=5.0)
    assert state.retired == {1, 3}
    assert outcome.newly_retired == {1, 3}
    assert not outcome.repeated
    assert state.owner is None
    assert not state.is_frozen(5.0)
    assert state.unfrozen_at == 5.0


def test_repeated_commit_is_idempotent_and_abort_after_commit_is_refused() -> None:
    state, _ = service.finalize(guarded(), request_id="r1", commit=True, retired=[1], now=5.0)
    again, outcome = service.finalize(state, request_id="r1", commit=True, retired=[1], now=6.0)
    assert outcome.repeated
    assert again.retired == {1}
    with pytest.raises(service.StaleRequestError, match="committed"):
        service.finalize(again, request_id="r1", commit=False, retired=[], now=7.0)


def test_commit_after_abort_is_refused_and_a_repeated_abort_is_fine() -> None:
    state, _ = service.finalize(guarded(), request_id="r1", commit=False, retired=[], now=5.0)
    assert state.retired == frozenset()
    _, outcome = service.finalize(state, request_id="r1", commit=False, retired=[], now=6.0)
    assert outcome.repeated
    with pytest.raises(service.StaleRequestError, match="aborted"):
        service.finalize(state, request_id="r1", commit=True, retired=[1], now=7.0)


def test_stale_finalize_after_a_newer_guard_never_unfreezes_the_newer_round() -> None:
    old = guarded("r1", lease=5.0)
    newer, _ = service.guard(old, request_id="r2", lease_sec=30.0, now=6.0)  # r1 expired, r2 took over
    for commit in (False, True):
        with pytest.raises(service.StaleRequestError):
            service.finalize(newer, request_id="r1", commit=commit, retired=[2], now=7.0)
    assert newer.owner == "r2"
    assert newer.is_frozen(7.0)
    assert newer.retired == frozenset()


def test_finalized_round_cannot_guard_again() -> None:
    state, _ = service.finalize(guarded(), request_id="r1", commit=False, retired=[], now=1.0)
    with pytest.raises(service.StaleRequestError):
        service.guard(state, request_id="r1", lease_sec=10.0, now=2.0)


def test_owner_may_finalize_after_its_lease_expired_if_nobody_took_over() -> None:
    state, _ = service.finalize(guarded(lease=1.0), request_id="r1", commit=True, retired=[0], now=50.0)
    assert state.retired == {0}


def test_finalize_with_no_round_is_stale() -> None:
    with pytest.raises(service.StaleRequestError, match="no round"):
        service.finalize(FtServiceState(), request_id="r9", commit=False, retired=[], now=0.0)


def test_suicide_waits_for_the_grace_and_never_fires_while_guarded() -> None:
    idle = FtServiceState(retired=frozenset({3}))
    dead = {1: 100.0, 3: 0.0}
    assert service.suicide_due(dead_since=dead, state=idle, now=159.0, grace_sec=60.0) == ()
    assert service.suicide_due(dead_since=dead, state=idle, now=160.0, grace_sec=60.0) == (1,)
    frozen, _ = service.guard(idle, request_id="r1", lease_sec=100.0, now=150.0)
    assert service.suicide_due(dead_since=dead, state=frozen, now=200.0, grace_sec=60.0) == ()
    # the grace restarts when the guard ends without retiring the rank (abort)
    aborted, _ = service.finalize(frozen, request_id="r1", commit=False, retired=[], now=200.0)
    assert service.suicide_due(dead_since=dead, state=aborted, now=259.0, grace_sec=60.0) == ()
    assert service.suicide_due(dead_since=dead, state=aborted, now=260.0, grace_sec=60.0) == (1,)
    committed, _ = service.finalize(frozen, request_id="r1", commit=True, retired=[1], now=200.0)
    assert service.suicide_due(dead_since=dead, state=committed, now=1000.0, grace_sec=60.0) == ()


IDS = st.sampled_from(["a", "b", "c"])


class GuardMachine(RuleBasedStateMachine):
    """Random guard/apply/finalize traffic from three rounds; invariants of F-23, F-27, F-57."""

    def __init__(self) -> None:
        super().__init__()
        self.state = FtServiceState()
        self.now = 0.0
        self.applies: dict[str, int] = {}

    @rule(seconds=st.floats(min_value=0, max_value=20))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @rule(request_id=IDS, lease=st.floats(min_value=0.5, max_value=15))
    def guard(self, request_id: str, lease: float) -> None:
        before = self.state
        try:
            self.state, _ = service.guard(self.state, request_id=request_id, lease_sec=lease, now=self.now)
        except service.GuardConflictError:
            assert before.is_frozen(self.now)
            assert before.owner != request_id
        except service.StaleRequestError:
            assert before.finalized(request_id) is not None

    @rule(request_id=IDS)
    def apply(self, request_id: str) -> None:
        try:
            self.state, _ = service.apply(
                self.state, request_id=request_id, instruction="scale_down", fast_recovery_enabled=False, now=self.now
            )
        except service.FtServiceError:
            return
        self.applies[request_id] = self.applies.get(request_id, 0) + 1

    @rule(request_id=IDS, commit=st.booleans(), retired=st.frozensets(st.integers(0, 7), max_size=3))
    def finalize(self, request_id: str, commit: bool, retired: frozenset[int]) -> None:
        before = self.state
        try:
            self.state, _ = service.finalize(
                self.state, request_id=request_id, commit=commit, retired=retired, now=self.now
            )
        except service.StaleRequestError:
            assert self.state == before  # a refused finalize changes nothing, never unfreezes anyone
            return
        prior = before.finalized(request_id)
        if prior is not None:
            assert prior.commit == commit
            assert not prior.superseded
        else:
            assert before.owner == request_id
        if commit:
            assert retired <= self.state.retired

    @invariant()
    def apply_is_never_repeated(self) -> None:
        assert all(count == 1 for count in self.applies.values())

    @invariant()
    def retired_only_grows(self) -> None:
        committed = [r for r in self.state.history if r.commit]
        for rnd in committed:
            assert rnd.retired <= self.state.retired

    @precondition(lambda self: self.state.owner is not None)
    @invariant()
    def an_owner_is_never_a_finalized_round(self) -> None:
        assert self.state.owner is not None
        assert self.state.finalized(self.state.owner) is None


TestGuardMachine = GuardMachine.TestCase


def test_a_superseded_round_is_stale_for_good() -> None:
    newer, _ = service.guard(guarded("r1", lease=5.0), request_id="r2", lease_sec=5.0, now=6.0)
    done, _ = service.finalize(newer, request_id="r2", commit=False, retired=[], now=7.0)
    with pytest.raises(service.StaleRequestError):
        service.guard(done, request_id="r1", lease_sec=5.0, now=8.0)
    for commit in (True, False):
        with pytest.raises(service.StaleRequestError, match="newer round"):
            service.finalize(done, request_id="r1", commit=commit, retired=[1], now=8.0)
