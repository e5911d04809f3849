"""The runtime record and a round's operations (F-14, F-20, F-26, F-27, F-30…F-32, F-50)."""

from __future__ import annotations

import pytest

from heteroflow.serving.controller.core import runtime as rt_ops
from heteroflow.serving.controller.core.errors import IllegalTransitionError, RoundStateError
from heteroflow.serving.controller.core.gate import GateReason, GateResult
from heteroflow.serving.controller.core.phase import ROUND_PHASES, FtPhase
from heteroflow.serving.controller.core.ranks import ranks
from heteroflow.serving.controller.core.runtime import FallbackStrategy, FtRuntime, persisted, restore

from .helpers import context, runtime


def committed_round(rt: FtRuntime, dead: tuple[int, ...], request_id: str = "r1") -> FtRuntime:
    rt = rt_ops.start_round(rt, context(rt, dead=dead, request_id=request_id))
    rt = rt_ops.begin_apply(rt)
    rt = rt_ops.engines_recovered(rt)
    rt = rt_ops.record_commit(rt)
    rt = rt_ops.finish_round(rt)
    return rt_ops.publish_result(rt, ok=True)


def test_a1_one_round_removes_only_the_dead_rank_and_serves_the_rest() -> None:
    """A1: rank 1 DEAD, survivors UNHEALTHY → one apply, only rank 1 removed, survivors published."""
    rt = runtime()
    started = rt_ops.start_round(rt, context(rt, dead=(1,)))
    assert started.phase == FtPhase.DECIDING
    assert started.pending_removed == {1}
    assert started.dead_committed == frozenset()  # pending is never merged before commit (F-31)
    assert started.alive_dp_ranks == {0, 2, 3}
    done = committed_round(rt, (1,))
    assert done.phase == FtPhase.SCALED_DOWN_RUNNING
    assert done.dead_committed == {1}
    assert done.pending_removed == frozenset()
    assert done.alive_dp_ranks == {0, 2, 3}
    assert done.can_serve
    assert done.history == ("r1",)


def test_a3_rank_0_dead_moves_the_master_to_the_lowest_survivor_without_renumbering() -> None:
    """A3 / F-56: master = min(survivor); ids stay original."""
    rt = runtime()
    ctx = context(rt, dead=(0,))
    assert ctx.master_rank == 1
    assert ctx.removed_dp_ranks == {0}
    done = committed_round(rt, (0,))
    assert done.original_dp_ranks == {0, 1, 2, 3}
    assert done.alive_dp_ranks == {1, 2, 3}


def test_a4_second_round_carries_the_cumulative_set_and_moves_the_master_again() -> None:
    """A4 / F-31 / F-56: {0,1,2,3} → {1,2,3} → {2,3}; the second apply carries {0, 1}; master 1 → 2."""
    rt = committed_round(runtime(), (0,))
    ctx = context(rt, dead=(1,), request_id="r2")
    assert ctx.removed_dp_ranks == {0, 1}
    assert ctx.master_rank == 2
    rt = committed_round(rt, (1,), request_id="r2")
    assert rt.dead_committed == {0, 1}
    assert rt.alive_dp_ranks == {2, 3}
    assert rt.history == ("r1", "r2")


def test_a10_late_dead_is_absorbed_before_apply_only() -> None:
    """A10 / F-24: a survivor turned DEAD joins the cumulative set; after apply a DEAD fails the round."""
    rt = runtime()
    rt = rt_ops.start_round(rt, context(rt, dead=(1,)))
    rt = rt_ops.wait_for_engines(rt)
    rt = rt_ops.absorb_dead(rt, [3])
    assert rt.pending_removed == {1, 3}
    assert rt.context is not None
    assert rt.context.survivors == {0, 2}
    assert rt.context.removed_dp_ranks == {1, 3}
    rt = rt_ops.begin_apply(rt)
    with pytest.raises(RoundStateError, match="already applied"):
        rt_ops.absorb_dead(rt, [2])


def test_a10_no_survivor_left_is_refused() -> None:
    rt = runtime()
    rt = rt_ops.start_round(rt, context(rt, dead=(1, 2)))
    with pytest.raises(RoundStateError, match="no survivor"):
        rt_ops.absorb_dead(rt, [0, 3])
    with pytest.raises(RoundStateError, match="not survivors"):
        rt_ops.absorb_dead(rt, [1])


def test_apply_is_never_sent_twice_in_a_round() -> None:
    rt = runtime()
    rt = rt_ops.begin_apply(rt_ops.start_round(rt, context(rt, dead=(1,))))
    assert rt.phase == FtPhase.SCALING_DOWN
    assert not rt.serving_published  # DEL precedes the apply (F-25)
    with pytest.raises(RoundStateError, match="never sent twice"):
        rt_ops.begin_apply(rt)


@pytest.mark.parametrize("stage", ["DECIDING", "WAITING_ENGINE_FAULT", "SCALING_DOWN", "POST_SCALE_CLEANUP"])
def test_a16_a_failed_round_goes_to_the_frozen_fallback_and_drops_pending(stage: str) -> None:
    """A16 / F-27: abort → RECONFIGURING with the fallback frozen at the decision; pending never committed."""
    rt = runtime()
    rt = rt_ops.start_round(rt, context(rt, dead=(1,), fallback=FallbackStrategy.SCALE_P2D))
    if stage != "DECIDING":
        rt = rt_ops.wait_for_engines(rt)
    if stage in ("SCALING_DOWN", "POST_SCALE_CLEANUP"):
        rt = rt_ops.begin_apply(rt)
    if stage == "POST_SCALE_CLEANUP":
        rt = rt_ops.engines_recovered(rt)
    assert rt.phase == FtPhase(stage)
    failed = rt_ops.fail_round(rt, "engine failed")
    assert failed.phase == FtPhase.RECONFIGURING
    assert failed.fallback == FallbackStrategy.SCALE_P2D
    assert failed.dead_committed == frozenset()
    assert failed.pending_removed == frozenset()
    assert failed.last_error == "engine failed"
    assert not failed.can_serve


def test_f14_matched_hardware_failure_always_goes_to_instance_reconfiguration() -> None:
    rt = runtime()
    rt = rt_ops.start_round(rt, context(rt, dead=(1,), fallback=FallbackStrategy.SCALE_P2D, hardware_matched=True))
    assert rt_ops.fail_round(rt, "x").fallback == FallbackStrategy.INSTANCE_RECONFIGURATION


def test_f27_after_commit_nothing_rolls_back() -> None:
    """F-27: a store, pod-stop or publish failure leaves SCALED_DOWN_RUNNING with last_error."""
    rt = runtime()
    rt = rt_ops.engines_recovered(rt_ops.begin_apply(rt_ops.start_round(rt, context(rt, dead=(1,)))))
    rt = rt_ops.record_commit(rt)
    with pytest.raises(RoundStateError, match="already committed"):
        rt_ops.fail_round(rt, "late")
    rt = rt_ops.post_commit_error(rt, "store unavailable")
    rt = rt_ops.finish_round(rt)
    assert rt.phase == FtPhase.SCALED_DOWN_RUNNING
    assert rt.last_error == "store unavailable"
    rt = rt_ops.post_commit_error(rt, "publish failed", publish_failed=True)
    assert not rt.serving_published
    assert not rt.can_serve
    assert rt_ops.publish_result(rt, ok=True).can_serve  # the periodic SET converges it


def test_f57_a_lost_node_manager_at_commit_reconfigures_keeping_the_commit() -> None:
    rt = runtime()
    rt = rt_ops.engines_recovered(rt_ops.begin_apply(rt_ops.start_round(rt, context(rt, dead=(1,)))))
    lost = rt_ops.node_manager_lost(rt, "pod-b never acknowledged the commit")
    assert lost.phase == FtPhase.RECONFIGURING
    assert lost.dead_committed == {1}
    assert lost.fallback == FallbackStrategy.INSTANCE_RECONFIGURATION


def test_out_of_order_round_operations_raise() -> None:
    rt = runtime()
    with pytest.raises(RoundStateError):
        rt_ops.begin_apply(rt)
    with pytest.raises(RoundStateError):
        rt_ops.record_commit(rt)
    started = rt_ops.start_round(rt, context(rt, dead=(1,)))
    with pytest.raises(RoundStateError):
        rt_ops.engines_recovered(started)
    with pytest.raises(RoundStateError):
        rt_ops.finish_round(started)
    with pytest.raises(IllegalTransitionError):
        rt_ops.start_round(started, context(rt, dead=(2,), request_id="r2"))


def test_a_round_needs_a_complete_new_dead_and_a_survivor() -> None:
    rt = committed_round(runtime(), (1,))
    with pytest.raises(RoundStateError, match="already committed"):
        rt_ops.start_round(rt, context(runtime(), dead=(1,)))
    with pytest.raises(RoundStateError, match="survivor"):
        rt_ops.start_round(rt, context(rt, dead=(0, 2, 3)))


def test_f20_dedup() -> None:
    """F-20: every candidate committed → success in SCALED_DOWN_RUNNING, failure elsewhere; a new one → proceed."""
    done = committed_round(runtime(), (1,))
    assert rt_ops.dedup_is_success(done, [1]) is True
    assert rt_ops.dedup_is_success(done, [1, 2]) is None
    relaunching = rt_ops.start_reconfiguration(done, FallbackStrategy.ENGINE_RELAUNCH, "x")
    assert rt_ops.dedup_is_success(relaunching, [1]) is False


def test_f14_relaunch_keeps_dead_committed_and_rebuild_clears_it() -> None:
    done = committed_round(runtime(), (1,))
    relaunch = rt_ops.start_reconfiguration(done, FallbackStrategy.ENGINE_RELAUNCH, "collection timeout")
    assert rt_ops.retired_set_for_fallback(relaunch) == {1}
    kept = rt_ops.fallback_succeeded(relaunch)
    assert kept.phase == FtPhase.SCALED_DOWN_RUNNING
    assert kept.dead_committed == {1}
    rebuild = rt_ops.start_reconfiguration(done, FallbackStrategy.INSTANCE_RECONFIGURATION, "all dead")
    assert rt_ops.retired_set_for_fallback(rebuild) == frozenset()
    cleared = rt_ops.fallback_succeeded(rebuild)
    assert cleared.phase == FtPhase.NORMAL
    assert cleared.dead_committed == frozenset()
    assert not cleared.serving_published  # the shell publishes through the overlay next
    fresh_relaunch = rt_ops.fallback_succeeded(
        rt_ops.start_reconfiguration(runtime(), FallbackStrategy.ENGINE_RELAUNCH, "x")
    )
    assert fresh_relaunch.phase == FtPhase.NORMAL  # SCALED_DOWN_RUNNING only with a non-empty dead_committed
    with pytest.raises(RoundStateError):
        rt_ops.fallback_succeeded(done)


def test_a18_feature_off_is_disabled_and_switches_only_from_normal() -> None:
    off = rt_ops.new_runtime("i", [0, 1], enabled=False)
    assert off.phase == FtPhase.DISABLED
    assert not off.can_serve
    on = rt_ops.set_feature(off, enabled=True)
    assert on.phase == FtPhase.NORMAL
    assert rt_ops.set_feature(on, enabled=True) is on
    scaled = committed_round(runtime(), (1,))
    with pytest.raises(IllegalTransitionError):
        rt_ops.set_feature(scaled, enabled=False)


def test_a_new_instance_is_unpublished_until_its_ready_set() -> None:
    fresh = rt_ops.new_runtime("i", [0, 1], enabled=True)
    assert not fresh.can_serve
    assert rt_ops.publish_result(fresh, ok=True).can_serve


def test_status_entry_has_the_rfc_keys() -> None:
    """RFC §7: the committed-but-unpublished case shows SCALED_DOWN_RUNNING, serving_published and can_serve false."""
    rt = runtime()
    rt = rt_ops.start_round(rt, context(rt, dead=(1,)))
    rt = rt_ops.record_gate(rt, GateResult(allowed=True))
    rt = rt_ops.finish_round(rt_ops.record_commit(rt_ops.engines_recovered(rt_ops.begin_apply(rt))))
    rt = rt_ops.post_commit_error(rt, "coordinator unreachable", publish_failed=True)
    assert rt_ops.status_entry(rt) == {
        "instance_id": "decode-0",
        "phase": "SCALED_DOWN_RUNNING",
        "original_dp_ranks": [0, 1, 2, 3],
        "request_id": "r1",
        "dead_committed": [1],
        "pending_removed_ranks": [],
        "alive_dp_ranks": [0, 2, 3],
        "fallback_strategy": "InstanceReconfiguration",
        "gate": {"allowed": True, "reason_codes": []},
        "engine_statuses": {},
        "serving_published": False,
        "last_error": "coordinator unreachable",
        "can_serve": False,
    }
    refused = rt_ops.record_gate(
        rt_ops.start_round(runtime(), context(runtime(), dead=(2,))),
        GateResult(allowed=False, reason_codes=(GateReason.EPLB_REQUIRED,)),
    )
    assert rt_ops.status_entry(refused)["gate"] == {"allowed": False, "reason_codes": ["EPLB_REQUIRED"]}
    with pytest.raises(RoundStateError):
        rt_ops.record_gate(runtime(), GateResult(allowed=True))


def test_generation_grows_on_every_phase_change() -> None:
    rt = runtime()
    seen = [rt.generation]
    rt = rt_ops.start_round(rt, context(rt, dead=(1,)))
    seen.append(rt.generation)
    rt = rt_ops.begin_apply(rt)
    seen.append(rt.generation)
    assert seen == sorted(set(seen))


# == F-32 / F-50 / A17 ========================================================================================
def in_phase(phase: FtPhase) -> FtRuntime:
    rt = runtime()
    rt = rt_ops.start_round(rt, context(rt, dead=(1,), fallback=FallbackStrategy.ENGINE_RELAUNCH))
    if phase == FtPhase.DECIDING:
        return rt
    rt = rt_ops.wait_for_engines(rt)
    if phase == FtPhase.WAITING_ENGINE_FAULT:
        return rt
    rt = rt_ops.begin_apply(rt)
    if phase == FtPhase.SCALING_DOWN:
        return rt
    return rt_ops.engines_recovered(rt)


@pytest.mark.parametrize("phase", sorted(ROUND_PHASES))
def test_a17_restart_mid_round_is_reconfiguring_with_the_persisted_fallback_never_a_replay(phase: FtPhase) -> None:
    """A17 / F-32: a persisted round phase restarts as RECONFIGURING + its fallback; the old round is aborted."""
    record = persisted(in_phase(phase))
    assert record.write_ahead is not None
    assert record.write_ahead.request_id == "r1"
    assert record.write_ahead.pending_removed == {1}
    assert record.dead_committed == frozenset()  # the write-ahead record is evidence, never merged (F-50)
    restored = restore(record)
    assert restored.runtime.phase == FtPhase.RECONFIGURING
    assert restored.run_fallback == FallbackStrategy.ENGINE_RELAUNCH
    assert restored.abort_request_id == "r1"
    assert restored.runtime.context is None  # nothing to replay: no apply can be sent from here
    assert restored.runtime.pending_removed == frozenset()
    assert not restored.runtime.can_serve
    with pytest.raises(RoundStateError):
        rt_ops.begin_apply(restored.runtime)


def test_a17_commit_window_restart_is_a_fallback_not_a_replay() -> None:
    """F-32: a NodeManager committed, the controller had not persisted: the record still says
    POST_SCALE_CLEANUP without the new dead rank → RECONFIGURING; the fallback replaces the retired sets."""
    rt = in_phase(FtPhase.POST_SCALE_CLEANUP)
    record = persisted(rt)  # the last write before the crash
    restored = restore(record)
    assert restored.runtime.phase == FtPhase.RECONFIGURING
    assert restored.runtime.dead_committed == frozenset()
    assert rt_ops.retired_set_for_fallback(restored.runtime) == frozenset()


def test_f32_scaled_down_running_is_kept_unpublished_until_set() -> None:
    done = committed_round(runtime(), (1,))
    restored = restore(persisted(done))
    assert restored.runtime.phase == FtPhase.SCALED_DOWN_RUNNING
    assert restored.runtime.dead_committed == {1}
    assert restored.run_fallback is None
    assert restored.abort_request_id is None
    assert not restored.runtime.serving_published
    assert rt_ops.publish_result(restored.runtime, ok=True).can_serve


def test_f32_reconfiguring_resumes_its_fallback() -> None:
    rt = rt_ops.start_reconfiguration(runtime(), FallbackStrategy.SCALE_P2D, "correlation expired")
    restored = restore(persisted(rt))
    assert restored.runtime.phase == FtPhase.RECONFIGURING
    assert restored.run_fallback == FallbackStrategy.SCALE_P2D


def test_persisted_subset_has_no_in_memory_evidence() -> None:
    fields = set(rt_ops.PersistedRuntime.__dataclass_fields__)
    assert fields == {
        "instance_id",
        "phase",
        "generation",
        "original_dp_ranks",
        "dead_committed",
        "fallback",
        "write_ahead",
    }
    assert persisted(runtime()).write_ahead is None
    assert ranks([3, 1]) == {1, 3}


def test_post_commit_errors_only_after_the_commit() -> None:
    rt = runtime()
    recovered = rt_ops.engines_recovered(rt_ops.begin_apply(rt_ops.start_round(rt, context(rt, dead=(1,)))))
    with pytest.raises(RoundStateError):
        rt_ops.post_commit_error(recovered, "too early")
    with pytest.raises(RoundStateError):
        rt_ops.post_commit_error(runtime(), "nothing committed")
