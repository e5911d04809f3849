"""The per-instance runtime record, the per-round ScaleDownContext, and what survives a restart.

Purely computational: each operation takes a frozen :class:`FtRuntime` and returns the next one (phase
changes go through :func:`.phase.transition`, so an illegal one raises). ``serving-ft.md`` F-14, F-20,
F-26, F-27, F-30…F-32, F-50; RFC §3 and §5.

Rules kept here:

- ``Instance.endpoints`` never changes: ``original_dp_ranks`` is fixed at creation; ranks are never
  renumbered ({0,1,2,3} → {0,2,3} → {0,2}).
- ``pending_removed`` (this round's cumulative removal set) is never merged into ``dead_committed`` before
  commit (:func:`record_commit`), and is dropped when the round fails.
- A round applies at most once (:func:`begin_apply` raises the second time) and absorbs late DEADs only
  before apply (:func:`absorb_dead`).
- After commit nothing rolls back: later failures only set ``last_error`` (:func:`post_commit_error`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from .errors import RoundStateError
from .gate import GateResult
from .phase import ROUND_PHASES, FtPhase, transition
from .ranks import DpRank, InstanceId, RequestId, ranks


class FallbackStrategy(StrEnum):
    """What runs when a round fails or a decision is a reconfiguration (F-14); frozen when decided."""

    INSTANCE_RECONFIGURATION = "InstanceReconfiguration"
    """Terminate every engine of the instance and relaunch them all; success clears the scale-down history."""
    ENGINE_RELAUNCH = "EngineRelaunch"
    """Relaunch original - dead_committed in place, original ids, master = min(alive); keeps dead_committed."""
    SCALE_P2D = "ScaleP2D"
    """A decode instance of a P/D deployment; a rebuild of the instance as far as this record is concerned."""


@dataclass(frozen=True, slots=True)
class ScaleDownContext:
    """One round, frozen when the FaultManager decided it (RFC §2: "冻结 ScaleDownContext").

    ``candidates`` starts as the snapshot's DEAD ranks and grows only by :func:`absorb_dead` before apply;
    ``survivors`` are the active ranks that stay. Both are original global ranks.
    """

    request_id: RequestId
    instance_id: InstanceId
    generation: int
    """The runtime's generation when the round started."""
    candidates: frozenset[DpRank]
    survivors: frozenset[DpRank]
    dead_committed_at_start: frozenset[DpRank]
    fallback: FallbackStrategy
    decided_at: float
    """Monotonic seconds of the decision."""
    hardware_matched: bool = False
    """A matched hardware U+D started it (F-12): a failure then always goes to InstanceReconfiguration (F-14)."""
    hardware_keys: tuple[str, ...] = ()
    applied: bool = False

    @property
    def removed_dp_ranks(self) -> frozenset[DpRank]:
        """The cumulative removal set the apply carries: every committed rank plus this round's (F-25, F-56)."""
        return self.dead_committed_at_start | self.candidates

    @property
    def master_rank(self) -> DpRank:
        """min(survivor): the rank whose ip becomes ``dp_master_ip`` (F-25, F-56)."""
        if not self.survivors:
            raise RoundStateError(f"round {self.request_id!r} has no survivor")
        return min(self.survivors)


@dataclass(frozen=True, slots=True)
class WriteAheadRecord:
    """F-50: persisted with compare-and-swap before the guard and again before apply. Evidence only: it never
    resumes a round and is never merged into ``dead_committed``."""

    request_id: RequestId
    pending_removed: frozenset[DpRank]
    phase: FtPhase


@dataclass(frozen=True, slots=True)
class FtRuntime:
    """One instance's FT runtime (RFC §7's status entry, less what the shell adds: gate details, engines)."""

    instance_id: InstanceId
    original_dp_ranks: frozenset[DpRank]
    phase: FtPhase = FtPhase.NORMAL
    generation: int = 0
    """+1 on every phase change: lets the shell tell a stale view of this record from the current one."""
    dead_committed: frozenset[DpRank] = frozenset()
    pending_removed: frozenset[DpRank] = frozenset()
    request_id: RequestId | None = None
    """The current round's id; kept after it ends (status, evidence timeline) until the next round."""
    fallback: FallbackStrategy | None = None
    context: ScaleDownContext | None = None
    gate: GateResult | None = None
    serving_published: bool = True
    last_error: str | None = None
    history: tuple[str, ...] = field(default=())
    """Request ids of finished rounds, oldest first (bounded by :data:`HISTORY_LIMIT`)."""

    @property
    def alive_dp_ranks(self) -> frozenset[DpRank]:
        """original - dead_committed - pending_removed (F-31)."""
        return self.original_dp_ranks - self.dead_committed - self.pending_removed

    @property
    def active_dp_ranks(self) -> frozenset[DpRank]:
        """original - dead_committed: the ranks a fault snapshot is taken over (F-10)."""
        return self.original_dp_ranks - self.dead_committed

    @property
    def can_serve(self) -> bool:
        """F-40: only in NORMAL or SCALED_DOWN_RUNNING with the view published."""
        return self.phase in (FtPhase.NORMAL, FtPhase.SCALED_DOWN_RUNNING) and self.serving_published


HISTORY_LIMIT = 32


def new_runtime(
    instance_id: InstanceId | str, original: Iterable[int], *, enabled: bool, serving_published: bool = False
) -> FtRuntime:
    """A fresh instance's runtime: NORMAL when the feature is on, else DISABLED; unpublished until the
    instance's READY publication (a SET through the overlay) succeeds."""
    original_ranks = ranks(original)
    if not original_ranks:
        raise RoundStateError("an instance has at least one DP rank")
    return FtRuntime(
        instance_id=InstanceId(instance_id),
        original_dp_ranks=original_ranks,
        phase=FtPhase.NORMAL if enabled else FtPhase.DISABLED,
        serving_published=serving_published,
    )


def _move(runtime: FtRuntime, target: FtPhase, **changes: object) -> FtRuntime:
    phase = transition(runtime.phase, target)
    return replace(runtime, phase=phase, generation=runtime.generation + 1, **changes)  # type: ignore[arg-type]


def set_feature(runtime: FtRuntime, *, enabled: bool) -> FtRuntime:
    """DISABLED ↔ NORMAL (F-30); a no-op when already there. Anything else raises (finish the round or the
    fallback first: switching off never abandons engines mid-transaction)."""
    target = FtPhase.NORMAL if enabled else FtPhase.DISABLED
    if runtime.phase == target:
        return runtime
    return _move(runtime, target)


# == a round =====================================================================================================
def start_round(runtime: FtRuntime, context: ScaleDownContext) -> FtRuntime:
    """NORMAL / SCALED_DOWN_RUNNING → DECIDING with the context's candidates pending (not committed)."""
    if context.instance_id != runtime.instance_id:
        raise RoundStateError(f"context of {context.instance_id!r} given to {runtime.instance_id!r}")
    _check_sets(runtime, candidates=context.candidates, survivors=context.survivors)
    return _move(
        runtime,
        FtPhase.DECIDING,
        pending_removed=context.candidates,
        request_id=context.request_id,
        fallback=context.fallback,
        context=context,
        last_error=None,
    )


def _check_sets(runtime: FtRuntime, *, candidates: frozenset[DpRank], survivors: frozenset[DpRank]) -> None:
    if not candidates:
        raise RoundStateError("a round needs at least one new DEAD rank")
    if not survivors:
        raise RoundStateError("a round needs at least one survivor")
    if candidates & runtime.dead_committed:
        raise RoundStateError(f"ranks {sorted(candidates & runtime.dead_committed)} are already committed")
    if candidates & survivors:
        raise RoundStateError(f"ranks {sorted(candidates & survivors)} cannot be both removed and surviving")
    if (candidates | survivors) != runtime.active_dp_ranks:
        raise RoundStateError("candidates | survivors must be exactly the active ranks (a complete U+D snapshot)")


def _round(runtime: FtRuntime) -> ScaleDownContext:
    if runtime.context is None or runtime.phase not in ROUND_PHASES:
        raise RoundStateError(f"no round in flight (phase {runtime.phase})")
    return runtime.context


def record_gate(runtime: FtRuntime, gate: GateResult) -> FtRuntime:
    """The round's gate outcome (F-21), shown in the status; a refusal is followed by :func:`fail_round`."""
    _round(runtime)
    return replace(runtime, gate=gate)


def wait_for_engines(runtime: FtRuntime) -> FtRuntime:
    """DECIDING → WAITING_ENGINE_FAULT: some survivor is HEALTHY or recovering; keep polling (F-24)."""
    _round(runtime)
    return _move(runtime, FtPhase.WAITING_ENGINE_FAULT)


def absorb_dead(runtime: FtRuntime, newly_dead: Iterable[int]) -> FtRuntime:
    """A survivor turned DEAD before apply: it joins this round's cumulative removal set (F-24).

    Raises :class:`RoundStateError` after apply (a DEAD is absorbed only before apply) or when no survivor
    would be left (the shell then fails the round: A10).
    """
    context = _round(runtime)
    if context.applied:
        raise RoundStateError(f"round {context.request_id!r} already applied; a late DEAD fails it instead")
    dead = ranks(newly_dead)
    if not dead <= context.survivors:
        raise RoundStateError(f"ranks {sorted(dead - context.survivors)} are not survivors of this round")
    survivors = context.survivors - dead
    if not survivors:
        raise RoundStateError("every survivor is DEAD: no survivor left")
    context = replace(context, candidates=context.candidates | dead, survivors=survivors)
    return replace(runtime, context=context, pending_removed=context.candidates)


def begin_apply(runtime: FtRuntime) -> FtRuntime:
    """DECIDING / WAITING_ENGINE_FAULT → SCALING_DOWN: withdraw (DEL) then the round's single apply.

    The shell persists the write-ahead record of the returned runtime *before* it sends anything (F-50).
    A second call raises: apply is never sent twice in a round.
    """
    context = _round(runtime)
    if context.applied:
        raise RoundStateError(f"round {context.request_id!r} already applied; apply is never sent twice")
    return _move(runtime, FtPhase.SCALING_DOWN, context=replace(context, applied=True), serving_published=False)


def engines_recovered(runtime: FtRuntime) -> FtRuntime:
    """SCALING_DOWN → POST_SCALE_CLEANUP: every survivor healthy with empty ft_state (F-26)."""
    if not _round(runtime).applied:
        raise RoundStateError("engines cannot have recovered from an apply that was never sent")
    return _move(runtime, FtPhase.POST_SCALE_CLEANUP)


def record_commit(runtime: FtRuntime) -> FtRuntime:
    """finalize(commit) was acknowledged: the cumulative set becomes ``dead_committed`` (F-26).

    Stays in POST_SCALE_CLEANUP (pod stops, then :func:`finish_round`). From here on nothing rolls back.
    """
    context = _round(runtime)
    if runtime.phase != FtPhase.POST_SCALE_CLEANUP:
        raise RoundStateError(f"commit only in POST_SCALE_CLEANUP, not {runtime.phase}")
    return replace(
        runtime,
        dead_committed=runtime.dead_committed | context.candidates,
        pending_removed=frozenset(),
        generation=runtime.generation + 1,
    )


def finish_round(runtime: FtRuntime) -> FtRuntime:
    """POST_SCALE_CLEANUP → SCALED_DOWN_RUNNING; the shell then publishes (ADD survivors) and reports it with
    :func:`publish_result`. Until then ``serving_published`` stays false."""
    context = _round(runtime)
    if runtime.pending_removed or not context.candidates <= runtime.dead_committed:
        raise RoundStateError("finish_round before record_commit")
    return _move(
        runtime,
        FtPhase.SCALED_DOWN_RUNNING,
        context=None,
        history=(*runtime.history, context.request_id)[-HISTORY_LIMIT:],
    )


def fail_round(runtime: FtRuntime, error: str, *, terminal: bool = False) -> FtRuntime:
    """The round failed before commit: RECONFIGURING with the frozen fallback, pending dropped (F-27).

    ``terminal``: the engines said recovery is over (vLLM 0.34: a failed ``scale_down`` leaves them dead with
    "Recovery failed; full restart required"): the whole instance is rebuilt whatever fallback was frozen — a
    released engine cannot be relaunched in place with ranks already dead.
    The shell has sent finalize(abort) to every uncommitted NodeManager in its ``finally``.
    """
    context = _round(runtime)
    if runtime.phase == FtPhase.POST_SCALE_CLEANUP and not runtime.pending_removed:
        raise RoundStateError("the round already committed; use post_commit_error or node_manager_lost")
    whole = context.hardware_matched or terminal
    fallback = FallbackStrategy.INSTANCE_RECONFIGURATION if whole else context.fallback
    return _move(
        runtime,
        FtPhase.RECONFIGURING,
        pending_removed=frozenset(),
        fallback=fallback,
        context=None,
        serving_published=False,
        last_error=error,
        history=(*runtime.history, context.request_id)[-HISTORY_LIMIT:],
    )


def node_manager_lost(runtime: FtRuntime, error: str) -> FtRuntime:
    """POST_SCALE_CLEANUP → RECONFIGURING: a NodeManager never acknowledged finalize(commit) (F-57).

    Whatever was committed stays committed (the engines did it); the instance is reconfigured.
    """
    context = _round(runtime)
    if runtime.phase != FtPhase.POST_SCALE_CLEANUP:
        raise RoundStateError(f"a lost NodeManager at commit is a POST_SCALE_CLEANUP event, not {runtime.phase}")
    return _move(
        runtime,
        FtPhase.RECONFIGURING,
        dead_committed=runtime.dead_committed | context.candidates,
        pending_removed=frozenset(),
        fallback=FallbackStrategy.INSTANCE_RECONFIGURATION,
        context=None,
        serving_published=False,
        last_error=error,
        history=(*runtime.history, context.request_id)[-HISTORY_LIMIT:],
    )


def post_commit_error(runtime: FtRuntime, error: str, *, publish_failed: bool = False) -> FtRuntime:
    """A store, pod-stop or publish failure after commit: the phase stays, ``last_error`` is set (F-27)."""
    committed = runtime.phase == FtPhase.SCALED_DOWN_RUNNING or (
        runtime.phase == FtPhase.POST_SCALE_CLEANUP and not runtime.pending_removed
    )
    if not committed:
        raise RoundStateError(f"no committed round to report on in {runtime.phase}")
    return replace(
        runtime,
        last_error=error,
        serving_published=False if publish_failed else runtime.serving_published,
    )


def publish_result(runtime: FtRuntime, *, ok: bool, error: str | None = None) -> FtRuntime:
    """An ADD or SET of the projected view finished (F-40): ``serving_published`` follows it."""
    if ok:
        return replace(runtime, serving_published=True)
    return replace(runtime, serving_published=False, last_error=error or "publish failed")


# == reconfiguration (F-14) ======================================================================================
def start_reconfiguration(runtime: FtRuntime, fallback: FallbackStrategy, reason: str) -> FtRuntime:
    """NORMAL / SCALED_DOWN_RUNNING → RECONFIGURING: collection timeout, all DEAD, correlation expiry,
    unmappable hardware, fast-recovery failure (F-10, F-12)."""
    return _move(
        runtime, FtPhase.RECONFIGURING, fallback=fallback, serving_published=False, last_error=reason, context=None
    )


def fallback_succeeded(runtime: FtRuntime, *, left_out: frozenset[DpRank] = frozenset()) -> FtRuntime:
    """RECONFIGURING → NORMAL (a rebuild: dead_committed cleared) or SCALED_DOWN_RUNNING (a relaunch that kept
    a non-empty dead_committed). The shell then publishes through the overlay (``serving_published`` false).

    ``left_out``: ranks the fallback did not start because their cards have a standing hardware fault
    (``core/relaunch.py``); they are retired like committed ranks, beside what the fallback kept, and the
    instance runs SCALED_DOWN_RUNNING."""
    if runtime.phase != FtPhase.RECONFIGURING:
        raise RoundStateError(f"no fallback runs in {runtime.phase}")
    if left_out:
        if not left_out <= runtime.original_dp_ranks:
            raise RoundStateError(f"ranks {sorted(left_out - runtime.original_dp_ranks)} are not of the instance")
        retired = retired_set_for_fallback(runtime) | left_out
        if retired >= runtime.original_dp_ranks:
            raise RoundStateError("a fallback cannot leave every rank out")
        return _move(
            runtime, FtPhase.SCALED_DOWN_RUNNING, dead_committed=retired, serving_published=False, last_error=None
        )
    if runtime.fallback == FallbackStrategy.ENGINE_RELAUNCH and runtime.dead_committed:
        return _move(runtime, FtPhase.SCALED_DOWN_RUNNING, serving_published=False, last_error=None)
    return _move(runtime, FtPhase.NORMAL, dead_committed=frozenset(), serving_published=False, last_error=None)


def retired_set_for_fallback(runtime: FtRuntime) -> frozenset[DpRank]:
    """What every NodeManager's retired set is *replaced* with before the fallback runs (F-14): the
    controller's ``dead_committed`` for a relaunch, empty for a full rebuild."""
    if runtime.fallback == FallbackStrategy.ENGINE_RELAUNCH:
        return runtime.dead_committed
    return frozenset()


# == dedup (F-20) ================================================================================================
def dedup_is_success(runtime: FtRuntime, candidates: Iterable[int]) -> bool | None:
    """F-20: every candidate already committed → ``True`` in SCALED_DOWN_RUNNING (success without guard, DEL or
    apply), ``False`` in any other phase (the round fails); ``None`` when at least one candidate is new."""
    candidate_set = ranks(candidates)
    if candidate_set and not candidate_set <= runtime.dead_committed:
        return None
    return runtime.phase == FtPhase.SCALED_DOWN_RUNNING


# == persistence and restart (F-32, F-50) =========================================================================
@dataclass(frozen=True, slots=True)
class PersistedRuntime:
    """What the store keeps (F-32): never per-rank first-seen times, never engine statuses."""

    instance_id: InstanceId
    phase: FtPhase
    generation: int
    original_dp_ranks: frozenset[DpRank]
    dead_committed: frozenset[DpRank]
    fallback: FallbackStrategy | None
    write_ahead: WriteAheadRecord | None = None


def persisted(runtime: FtRuntime) -> PersistedRuntime:
    """The subset to store after every change; a round in flight carries its write-ahead record (F-50)."""
    write_ahead = None
    if runtime.phase in ROUND_PHASES and runtime.request_id is not None:
        write_ahead = WriteAheadRecord(
            request_id=runtime.request_id, pending_removed=runtime.pending_removed, phase=runtime.phase
        )
    return PersistedRuntime(
        instance_id=runtime.instance_id,
        phase=runtime.phase,
        generation=runtime.generation,
        original_dp_ranks=runtime.original_dp_ranks,
        dead_committed=runtime.dead_committed,
        fallback=runtime.fallback,
        write_ahead=write_ahead,
    )


@dataclass(frozen=True, slots=True)
class Restored:
    """A restarted controller's runtime for one instance and what the shell must do with it (F-32)."""

    runtime: FtRuntime
    abort_request_id: RequestId | None
    """The interrupted round to finalize(abort) at every NodeManager (or leave its lease to expire)."""
    run_fallback: FallbackStrategy | None
    """The fallback to run (or resume) now; ``None``: nothing to run."""


def restore(record: PersistedRuntime) -> Restored:
    """F-32. A round that was in flight becomes RECONFIGURING + its persisted fallback and is never replayed;
    that covers the window where a NodeManager committed and the controller had not persisted yet (its
    ``dead_committed`` is the older one; the fallback's retired-set replacement makes both sides agree).
    SCALED_DOWN_RUNNING is kept; RECONFIGURING resumes its fallback. Every restored runtime starts with
    ``serving_published=false``: the next SET through the overlay converges it."""
    base = FtRuntime(
        instance_id=record.instance_id,
        original_dp_ranks=record.original_dp_ranks,
        phase=record.phase,
        generation=record.generation,
        dead_committed=record.dead_committed,
        fallback=record.fallback,
        serving_published=False,
    )
    abort = record.write_ahead.request_id if record.write_ahead is not None else None
    if record.phase in ROUND_PHASES:
        fallback = record.fallback or FallbackStrategy.INSTANCE_RECONFIGURATION
        runtime = replace(
            base,
            phase=FtPhase.RECONFIGURING,
            generation=record.generation + 1,
            fallback=fallback,
            request_id=abort,
            last_error="controller restarted during a round; it is not replayed",
        )
        return Restored(runtime=runtime, abort_request_id=abort, run_fallback=fallback)
    if record.phase == FtPhase.RECONFIGURING:
        fallback = record.fallback or FallbackStrategy.INSTANCE_RECONFIGURATION
        return Restored(runtime=replace(base, fallback=fallback), abort_request_id=None, run_fallback=fallback)
    return Restored(runtime=base, abort_request_id=None, run_fallback=None)


# == status (RFC §7) ==============================================================================================
def status_entry(runtime: FtRuntime, *, engine_statuses: dict[int, str] | None = None) -> dict[str, object]:
    """One instance's entry of ``GET /controller/fault_tolerance/status``, with RFC §7's keys."""
    gate = runtime.gate
    return {
        "instance_id": runtime.instance_id,
        "phase": runtime.phase.value,
        "original_dp_ranks": sorted(runtime.original_dp_ranks),
        "request_id": runtime.request_id,
        "dead_committed": sorted(runtime.dead_committed),
        "pending_removed_ranks": sorted(runtime.pending_removed),
        "alive_dp_ranks": sorted(runtime.alive_dp_ranks),
        "fallback_strategy": runtime.fallback.value if runtime.fallback is not None else None,
        "gate": {
            "allowed": gate.allowed if gate is not None else True,
            "reason_codes": [reason.value for reason in gate.reason_codes] if gate is not None else [],
        },
        "engine_statuses": dict(engine_statuses or {}),
        "serving_published": runtime.serving_published,
        "last_error": runtime.last_error,
        "can_serve": runtime.can_serve,
    }
