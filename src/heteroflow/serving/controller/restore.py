"""Capacity back: a scaled-down instance brought back to its configured size by a planned relaunch at full size.

After a DP scale-down the instance runs SCALED_DOWN_RUNNING with ``dead_committed`` retired for good: no engine
protocol of a released vLLM lets a removed rank join the running group again. vLLM 0.34's elastic EP
(``docs/engine-builds.md``) resizes over the contiguous ranks ``range(new_data_parallel_size)``, so it cannot fill
the holes an FT ``scale_down`` left; and although it could grow a world HeteroFlow relaunched smaller (contiguous,
no dead set), vLLM's FT sentinel keeps the DP size it was built with, so a world grown that way could not scale
down soundly at its next fault. A restore therefore relaunches every rank of the instance at its configured size,
as the whole-instance reconfiguration does, but planned:

1. **Refused unless capacity is back** (:func:`refusal`, HTTP 409 with the reason): the instance runs scaled
   down, no strategy runs, every pod of the topology is registered and heard from, none is being replaced, and
   no rank's cards carry a standing L5-L6 hardware fault (``core/relaunch.py`` plans an in-place relaunch of
   every rank). A replaced card or a recreated pod registers again and clears what stood in the way.
2. **The relaunch** (:func:`run`): RECONFIGURING with InstanceReconfiguration (so that a controller restarted
   meanwhile finishes it as a rebuild), the instance's view withdrawn from the Coordinator — the model's
   requests go to its other instances, or are held up to the client deadline where it has none — every
   NodeManager's retired set emptied and its engines restarted, every rank waited for, then NORMAL with
   ``dead_committed`` cleared and the view published again.
3. **A failure leaves the degraded instance serving**: a NodeManager refusing the start or an engine not ready
   in time ends the restore ``failed``, and the survivors are relaunched as they ran (EngineRelaunch: the same
   retired set) through the fallback path, back to SCALED_DOWN_RUNNING and published.

Every restore is one record of the round history (kind ``restore``: ``restore_requested``,
``engines_restart``, ``engines_ready``, ``restored`` or ``restore_failed`` then ``degraded_relaunch``), a
structured log line (``controller.restore_*``, the audit trail: who asked, which ranks), the metric
``heteroflow_controller_rounds{kind="restore"}``, and the instance status's ``restore`` object.

The automatic policy (``auto_restore``, off by default) restores an instance that has run scaled down, quiet
(no evidence, no strategy) and with its capacity back for ``auto_restore_delay_sec``; a failed restore is not
tried again automatically until the degraded instance's evidence changes (a new round) or an operator asks.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

import structlog

from heteroflow.serving.controller import fallbacks
from heteroflow.serving.controller.clients import PeerError
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.relaunch import RelaunchKind, plan_relaunch
from heteroflow.serving.controller.instance import Instance, PodState, RestoreState
from heteroflow.serving.controller.ports import ShellPorts, StrategyPorts

_log = structlog.get_logger(__name__)

RESTORING = "RESTORING"
"""The ``last_error`` prefix while a restore runs (the phase reads RECONFIGURING)."""


class RestoreRefusedError(Exception):
    """The instance cannot be restored now (HTTP 409); the message says why."""


class CapacityPorts(ShellPorts, Protocol):
    """What :func:`refusal` reads besides the shell's: the pods' registrations (the status view has them too)."""

    @property
    def pods(self) -> Mapping[str, PodState]: ...


def refusal(ctrl: CapacityPorts, inst: Instance, *, pod_lost_after_sec: float) -> str | None:
    """Why ``inst`` cannot be restored now, or ``None`` when it can."""
    runtime = inst.runtime
    if inst.strategy.running is not None:
        return f"a {inst.strategy.running} strategy is running for the instance"
    if runtime.phase != FtPhase.SCALED_DOWN_RUNNING or not runtime.dead_committed:
        return f"the instance runs {runtime.phase.value} at {len(runtime.alive_dp_ranks)} ranks: nothing to restore"
    if inst.evidence.snapshot.entries or inst.evidence.hardware:
        return "fault evidence is pending for the instance: its round decides first"
    now = ctrl.clock.monotonic()
    for pod in inst.topology.pods:
        state = ctrl.pods.get(pod.pod_id)
        if state is None:
            return f"pod {pod.pod_id} is not registered: its capacity is not back"
        if now - state.last_seen > pod_lost_after_sec:
            return f"pod {pod.pod_id} has been silent for {now - state.last_seen:.0f} s"
    if inst.relaunches.replacing:
        return f"pods {sorted(inst.relaunches.replacing)} are being replaced"
    plan = plan_relaunch(
        topology=inst.topology,
        retired=frozenset(),
        standing=inst.standing.faults.values(),
        can_replace_pods=False,
        flags=ctrl.ft.gate_flags(),
        capability=inst.topology.capability,
    )
    if plan.kind != RelaunchKind.IN_PLACE:
        return f"capacity is not back: {plan.reason}"
    return None


def begin(ctrl: StrategyPorts, inst: Instance, *, requested_by: str, pod_lost_after_sec: float) -> str:
    """Check and record a restore of ``inst``; its request id. Raises :class:`RestoreRefusedError`."""
    why = refusal(ctrl, inst, pod_lost_after_sec=pod_lost_after_sec)
    if why is not None:
        raise RestoreRefusedError(why)
    request_id = f"rs-{uuid.uuid4().hex[:16]}"
    ranks = tuple(sorted(inst.runtime.dead_committed))
    ctrl.history.begin(request_id, instance_id=inst.instance_id, kind="restore")
    ctrl.history.add(
        request_id,
        "restore_requested",
        requested_by=requested_by,
        ranks=list(ranks),
        alive=sorted(inst.runtime.alive_dp_ranks),
        original=sorted(inst.runtime.original_dp_ranks),
        round=inst.runtime.request_id,
    )
    inst.restores.last = RestoreState(
        state="running",
        request_id=request_id,
        requested_by=requested_by,
        ranks=ranks,
        started_at=ctrl.clock.now(),
        started_monotonic=ctrl.clock.monotonic(),
        degraded_round=inst.runtime.request_id,
    )
    inst.restores.ready_since = None
    _log.warning(
        "controller.restore_started",
        instance_id=inst.instance_id,
        request_id=request_id,
        requested_by=requested_by,
        ranks=list(ranks),
    )
    return request_id


async def run(ctrl: StrategyPorts, inst: Instance, request_id: str) -> None:
    """The planned relaunch at full size; on failure, the degraded instance relaunched as it ran."""
    try:
        await _run(ctrl, inst, request_id)
    except Exception as exc:  # a bug, not a refused start: the status must not say "running" for ever
        last = inst.restores.last
        if last is not None and last.state == "running":
            inst.restores.last = replace(last, state="failed", finished_at=ctrl.clock.now(), error=repr(exc))
            ctrl.history.finish(request_id, "failed")
        raise


async def _run(ctrl: StrategyPorts, inst: Instance, request_id: str) -> None:
    state = inst.restores.last
    assert state is not None  # begin() recorded it
    assert state.request_id == request_id
    size = len(inst.runtime.original_dp_ranks)
    reason = f"{RESTORING}: a planned relaunch at the configured size ({size} ranks), by {state.requested_by}"
    before = inst.runtime.phase.value
    ctrl.set_runtime(inst, rt.start_reconfiguration(inst.runtime, rt.FallbackStrategy.INSTANCE_RECONFIGURATION, reason))
    ctrl.history.add(request_id, "phase", **{"from": before, "to": inst.runtime.phase.value})
    await ctrl.persist(inst, required=False)
    try:
        await fallbacks.relaunch_engines(ctrl, inst, request_id, frozenset())
    except (PeerError, TimeoutError) as exc:
        await _failed(ctrl, inst, state, f"{type(exc).__name__}: {exc}")
        return
    ctrl.set_runtime(inst, rt.fallback_succeeded(inst.runtime))
    ctrl.history.add(request_id, "phase", **{"from": FtPhase.RECONFIGURING.value, "to": inst.runtime.phase.value})
    ctrl.reset_evidence(inst)
    inst.relaunches.stopped_pods.clear()
    inst.relaunches.plan = None
    await ctrl.persist(inst, required=False)
    await ctrl.refresh_view(inst, by_strategy=True)
    seconds = ctrl.clock.monotonic() - state.started_monotonic
    ctrl.history.add(
        request_id, "restored", ranks=sorted(inst.runtime.alive_dp_ranks), published=sorted(inst.publication.published)
    )
    ctrl.history.stage(request_id, "restore", seconds)
    ctrl.history.finish(request_id, "succeeded")
    ctrl.metrics.rounds.labels(kind="restore", outcome="succeeded").inc()
    ctrl.metrics.stage_seconds.labels(stage="restore").observe(seconds)
    inst.restores.last = replace(state, state="succeeded", finished_at=ctrl.clock.now(), seconds=round(seconds, 3))
    _log.info("controller.restore_succeeded", instance_id=inst.instance_id, request_id=request_id, seconds=seconds)


async def _failed(ctrl: StrategyPorts, inst: Instance, state: RestoreState, error: str) -> None:
    request_id = state.request_id
    ctrl.history.add(request_id, "restore_failed", error=error)
    _log.error("controller.restore_failed", instance_id=inst.instance_id, request_id=request_id, error=error)
    # dead_committed is untouched: relaunch the survivors as they ran, retired ranks left out (EngineRelaunch)
    ctrl.set_runtime(
        inst,
        replace(
            inst.runtime,
            fallback=rt.FallbackStrategy.ENGINE_RELAUNCH,
            last_error=f"restore failed: {error}; relaunching the instance scaled down as it ran",
        ),
    )
    await ctrl.run_fallback(inst, rt.FallbackStrategy.ENGINE_RELAUNCH)
    ctrl.history.add(request_id, "degraded_relaunch", phase=inst.runtime.phase.value, can_serve=inst.runtime.can_serve)
    ctrl.history.finish(request_id, "failed")
    ctrl.metrics.rounds.labels(kind="restore", outcome="failed").inc()
    inst.restores.last = replace(
        state,
        state="failed",
        finished_at=ctrl.clock.now(),
        seconds=round(ctrl.clock.monotonic() - state.started_monotonic, 3),
        error=error,
        degraded_phase=inst.runtime.phase.value,
    )


def auto_due(ctrl: StrategyPorts, inst: Instance, *, pod_lost_after_sec: float) -> bool:
    """The policy: restore ``inst`` now (``auto_restore`` on, capacity back and quiet for the delay)."""
    if not ctrl.ft.auto_restore:
        return False
    if refusal(ctrl, inst, pod_lost_after_sec=pod_lost_after_sec) is not None:
        inst.restores.ready_since = None
        return False
    last = inst.restores.last
    if last is not None and last.state == "failed" and last.degraded_round == inst.runtime.request_id:
        return False  # this degraded instance failed to restore: an operator asks again, or a later round
    now = ctrl.clock.monotonic()
    if inst.restores.ready_since is None:
        inst.restores.ready_since = now
    return now - inst.restores.ready_since >= ctrl.ft.auto_restore_delay_sec
