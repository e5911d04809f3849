"""Random fault sequences through the pure core, driven as the shell will drive it (hypothesis state machine).

Reports, clock advances, decisions, survivor polls, restarts and fallbacks interleave at random.
Invariants: a committed rank never re-enters the serving view (until a full rebuild clears the history);
at most one apply per round; original ids are never renumbered; pending and committed never overlap; a
round always ends committed or fallen back, never stuck (checked at teardown by letting the deadlines pass).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from heteroflow.contracts.serving import EndpointFtStatus
from heteroflow.serving.controller.core import overlay
from heteroflow.serving.controller.core import runtime as rt_ops
from heteroflow.serving.controller.core.decision import DecisionInput, Reconfigure, StartScaleDown, decide
from heteroflow.serving.controller.core.errors import RoundStateError
from heteroflow.serving.controller.core.gate import GateFlags, evaluate
from heteroflow.serving.controller.core.normalizer import FtSnapshot, observe, reset
from heteroflow.serving.controller.core.phase import ROUND_PHASES, FtPhase
from heteroflow.serving.controller.core.ranks import RequestId
from heteroflow.serving.controller.core.readiness import PollLimits, after_apply, before_apply
from heteroflow.serving.controller.core.runtime import FallbackStrategy, ScaleDownContext

from .helpers import capability, entry, report, runtime

ORIGINAL = frozenset(range(5))
DEADLINE = 30.0
BEFORE = st.sampled_from(["unhealthy"] * 12 + ["healthy", "recovering", "dead", "unreachable"])
AFTER = st.sampled_from(["healthy"] * 12 + ["recovering", "recovering", "dead", "unreachable"])
FALLBACKS = st.sampled_from(list(FallbackStrategy))


def _entry(rank: int, status: str) -> EndpointFtStatus:
    if status == "unreachable":
        return entry(rank, None, error="unreachable")
    if status == "recovering":
        return entry(rank, "unhealthy", ft_state="recovering")
    return entry(rank, status)


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rt = runtime(tuple(sorted(ORIGINAL)))
        self.snap = FtSnapshot()
        self.now = 0.0
        self.rounds = 0
        self.applies: Counter[str] = Counter()
        self.committed: set[int] = set()
        self.stage_started = 0.0
        self.original_fallback = FallbackStrategy.INSTANCE_RECONFIGURATION

    # -- the outside world --------------------------------------------------------------------------------
    @rule(rank=st.sampled_from(sorted(ORIGINAL)), status=st.sampled_from(["dead", "unhealthy", "protocol_error"]))
    def fault_report(self, rank: int, status: str) -> None:
        self.snap = observe(self.snap, report(rank, status), now=self.now, dead_committed=self.rt.dead_committed)

    @rule(dead=st.frozensets(st.sampled_from(sorted(ORIGINAL)), min_size=1, max_size=2), then_decide=st.booleans())
    def fault_wave(self, dead: frozenset[int], then_decide: bool) -> None:
        """Some ranks die and every other active rank sees the collective fail: a complete U+D, mostly."""
        for rank in sorted(self.rt.active_dp_ranks):
            status = "dead" if rank in dead else "unhealthy"
            self.snap = observe(self.snap, report(rank, status), now=self.now, dead_committed=self.rt.dead_committed)
        if then_decide:
            self.decide_and_act()

    @rule(seconds=st.sampled_from([0.5, 2.0, 5.0, 20.0, 61.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(fallback=FALLBACKS)
    def deployment_fallback(self, fallback: FallbackStrategy) -> None:
        self.original_fallback = fallback

    # -- the FaultManager ---------------------------------------------------------------------------------
    @rule()
    def decide_and_act(self) -> None:
        data = DecisionInput(runtime=self.rt, snapshot=self.snap, original_fallback=self.original_fallback)
        decision = decide(data, now=self.now)
        if isinstance(decision, StartScaleDown):
            gate = evaluate(
                flags=GateFlags(enable_dp_scale_down=True), capability=capability(), survivors=len(decision.survivors)
            )
            assert gate.allowed
            self.rounds += 1
            context = ScaleDownContext(
                request_id=RequestId(f"r{self.rounds}"),
                instance_id=self.rt.instance_id,
                generation=self.rt.generation,
                candidates=decision.candidates,
                survivors=decision.survivors,
                dead_committed_at_start=self.rt.dead_committed,
                fallback=decision.fallback,
                decided_at=self.now,
            )
            assert context.candidates.isdisjoint(self.rt.dead_committed)  # every round needs a new DEAD
            self.rt = rt_ops.start_round(self.rt, context)
            self.stage_started = self.now
        elif isinstance(decision, Reconfigure):
            self.rt = rt_ops.start_reconfiguration(self.rt, decision.fallback, decision.reason)

    # -- the round ------------------------------------------------------------------------------------------
    def _in_round(self) -> bool:
        return self.rt.phase in ROUND_PHASES

    def _fail(self, reason: str) -> None:
        self.rt = rt_ops.fail_round(self.rt, reason)
        event("round failed")
        self.snap = reset()

    @precondition(lambda self: self.rt.phase in (FtPhase.DECIDING, FtPhase.WAITING_ENGINE_FAULT))
    @rule(data=st.data())
    def poll_before_apply(self, data: st.DataObject) -> None:
        assert self.rt.context is not None
        survivors = sorted(self.rt.context.survivors)
        statuses = data.draw(st.lists(BEFORE, min_size=len(survivors), max_size=len(survivors)))
        verdict = before_apply(
            [_entry(r, s) for r, s in zip(survivors, statuses, strict=True)],
            survivors=survivors,
            limits=PollLimits(deadline=self.stage_started + DEADLINE),
            now=self.now,
        )
        if verdict.verdict == "fail":
            self._fail(verdict.reason)
        elif verdict.verdict == "absorb":
            self.rt = rt_ops.absorb_dead(self.rt, verdict.absorbed)
            event("absorbed")
        elif verdict.verdict == "poll" and self.rt.phase == FtPhase.DECIDING:
            self.rt = rt_ops.wait_for_engines(self.rt)
        elif verdict.verdict == "ready":
            self.apply()

    @precondition(lambda self: self.rt.phase in (FtPhase.DECIDING, FtPhase.WAITING_ENGINE_FAULT))
    @rule()
    def round_goes_well(self) -> None:
        """Every survivor apply-ready, then healthy: the whole round at once (consecutive rounds get likely)."""
        assert self.rt.context is not None
        survivors = sorted(self.rt.context.survivors)
        verdict = before_apply(
            [entry(r, "unhealthy") for r in survivors],
            survivors=survivors,
            limits=PollLimits(deadline=self.stage_started + DEADLINE),
            now=self.now,
        )
        if verdict.verdict == "fail":
            self._fail(verdict.reason)
            return
        self.apply()
        self._after([entry(r, "healthy") for r in survivors])

    @precondition(lambda self: self.rt.phase in ROUND_PHASES)
    @rule()
    def apply(self) -> None:
        """The shell may try at any moment; the core admits at most one apply per round."""
        request_id = self.rt.request_id
        assert request_id is not None
        try:
            self.rt = rt_ops.begin_apply(self.rt)
        except RoundStateError:
            return
        self.applies[request_id] += 1
        event("apply")
        self.stage_started = self.now

    @precondition(lambda self: self.rt.phase == FtPhase.SCALING_DOWN)
    @rule(data=st.data())
    def poll_after_apply(self, data: st.DataObject) -> None:
        assert self.rt.context is not None
        assert self.rt.request_id is not None
        survivors = sorted(self.rt.context.survivors)
        statuses = data.draw(st.lists(AFTER, min_size=len(survivors), max_size=len(survivors)))
        self._after([_entry(r, s) for r, s in zip(survivors, statuses, strict=True)])

    def _after(self, polls: list[EndpointFtStatus]) -> None:
        assert self.rt.context is not None
        assert self.rt.request_id is not None
        survivors = sorted(self.rt.context.survivors)
        verdict = after_apply(
            polls,
            survivors=survivors,
            request_id=self.rt.request_id,
            limits=PollLimits(deadline=self.stage_started + DEADLINE),
            now=self.now,
        )
        if verdict.verdict == "fail":
            self._fail(verdict.reason)
        elif verdict.verdict == "commit":
            self.rt = rt_ops.record_commit(rt_ops.engines_recovered(self.rt))
            self.committed |= self.rt.dead_committed
            self.rt = rt_ops.publish_result(rt_ops.finish_round(self.rt), ok=True)
            event(f"commit; {len(self.rt.history)} rounds in history")
            self.snap = reset()

    @precondition(lambda self: self.rt.phase == FtPhase.RECONFIGURING)
    @rule()
    def fallback_done(self) -> None:
        rebuild = self.rt.fallback != FallbackStrategy.ENGINE_RELAUNCH
        self.rt = rt_ops.publish_result(rt_ops.fallback_succeeded(self.rt), ok=True)
        if rebuild:
            self.committed.clear()  # a full rebuild empties the scale-down history (F-14)
        self.snap = reset()

    @rule()
    def controller_restart(self) -> None:
        restored = rt_ops.restore(rt_ops.persisted(self.rt))
        assert restored.runtime.phase not in ROUND_PHASES  # never a replayed round (F-32)
        if self.rt.phase in ROUND_PHASES:
            assert restored.abort_request_id == self.rt.request_id
        self.rt = restored.runtime
        self.snap = reset()  # first-seen times are in memory only (F-13)

    # -- invariants -----------------------------------------------------------------------------------------
    @invariant()
    def committed_rank_never_serves(self) -> None:
        assert self.committed.isdisjoint(overlay.refresh(self.rt).endpoint_ids)
        assert self.committed <= self.rt.dead_committed

    @invariant()
    def apply_at_most_once_per_round(self) -> None:
        assert all(count == 1 for count in self.applies.values())

    @invariant()
    def ids_never_renumbered(self) -> None:
        assert self.rt.original_dp_ranks == ORIGINAL
        assert self.rt.alive_dp_ranks <= ORIGINAL
        assert self.rt.pending_removed.isdisjoint(self.rt.dead_committed)
        if self.rt.context is not None:
            ctx = self.rt.context
            assert ctx.removed_dp_ranks == self.rt.dead_committed | self.rt.pending_removed
            assert ctx.survivors
            assert ctx.master_rank == min(ctx.survivors)
            assert ctx.survivors | ctx.candidates == self.rt.active_dp_ranks

    @invariant()
    def a_round_is_well_formed(self) -> None:
        assert (self.rt.phase in ROUND_PHASES) == (self.rt.context is not None)

    def teardown(self) -> None:
        """Never stuck: once the deadlines pass, any round in flight ends committed or fallen back."""
        self.now += 2 * DEADLINE + 1
        for _ in range(3):
            if self.rt.phase in (FtPhase.DECIDING, FtPhase.WAITING_ENGINE_FAULT):
                assert self.rt.context is not None
                survivors = sorted(self.rt.context.survivors)
                verdict = before_apply(
                    [entry(r, "unhealthy") for r in survivors],
                    survivors=survivors,
                    limits=PollLimits(deadline=self.stage_started + DEADLINE),
                    now=self.now,
                )
                assert verdict.verdict == "fail"
                self._fail(verdict.reason)
            elif self.rt.phase == FtPhase.SCALING_DOWN:
                assert self.rt.context is not None
                assert self.rt.request_id is not None
                survivors = sorted(self.rt.context.survivors)
                verdict = after_apply(
                    [entry(r, "unhealthy", ft_state="recovering") for r in survivors],
                    survivors=survivors,
                    request_id=self.rt.request_id,
                    limits=PollLimits(deadline=self.stage_started + DEADLINE),
                    now=self.now,
                )
                assert verdict.verdict == "fail"
                self._fail(verdict.reason)
        assert self.rt.phase not in ROUND_PHASES


CoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCoreMachine = CoreMachine.TestCase
