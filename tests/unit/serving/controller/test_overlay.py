"""ServingOverlay (F-31, F-40; A4): every publication goes through one projection."""

from __future__ import annotations

from heteroflow.serving.controller.core import overlay
from heteroflow.serving.controller.core import runtime as rt_ops
from heteroflow.serving.controller.core.ranks import ranks
from heteroflow.serving.controller.core.runtime import FallbackStrategy

from .helpers import context, runtime


def test_projection_is_original_minus_committed_minus_pending() -> None:
    rt = runtime()
    assert overlay.refresh(rt).endpoint_ids == {0, 1, 2, 3}
    rt = rt_ops.start_round(rt, context(rt, dead=(1,)))
    assert overlay.refresh(rt).endpoint_ids == {0, 2, 3}  # pending excluded even before commit


def test_a4_del_add_and_set_across_two_rounds_never_re_add_a_dead_rank() -> None:
    rt = runtime()
    published = overlay.refresh(rt).endpoint_ids
    for request_id, dead in (("r1", 1), ("r2", 3)):
        rt = rt_ops.start_round(rt, context(rt, dead=(dead,), request_id=request_id))
        rt = rt_ops.begin_apply(rt)
        delete = overlay.withdraw(published)
        assert delete.op == "DEL"
        assert delete.endpoint_ids == published  # round 2's DEL already lacks rank 1: identity checks pass
        assert overlay.refresh(rt).endpoint_ids == frozenset()  # a periodic SET mid-round publishes nothing
        rt = rt_ops.finish_round(rt_ops.record_commit(rt_ops.engines_recovered(rt)))
        assert overlay.refresh(rt).endpoint_ids == ranks([0, 1, 2, 3]) - rt.dead_committed
        add = overlay.publish(rt)
        published = add.endpoint_ids
        rt = rt_ops.publish_result(rt, ok=True)
    assert published == {0, 2}
    assert overlay.refresh(rt) == overlay.CoordinatorOp("SET", ranks([0, 2]))


def test_reconfiguring_publishes_nothing_and_cannot_serve() -> None:
    rt = rt_ops.start_reconfiguration(runtime(), FallbackStrategy.INSTANCE_RECONFIGURATION, "all dead")
    assert overlay.refresh(rt).endpoint_ids == frozenset()
    assert not rt.can_serve


def test_can_serve_only_steady_and_published() -> None:
    rt = runtime()
    assert rt.can_serve
    assert not rt_ops.publish_result(rt, ok=False, error="coordinator down").can_serve
    assert not rt_ops.start_round(rt, context(rt, dead=(1,))).can_serve
