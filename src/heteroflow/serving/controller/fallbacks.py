"""The fallbacks that really restart engines through the NodeManagers (``serving-ft.md`` F-14).

- InstanceReconfiguration (``terminate_instance_for_recovery()``): every engine of the instance is
  terminated and relaunched, with an empty retired set; success clears the scale-down history.
- EngineRelaunch: only original - dead_committed are relaunched in place, with their original ids and
  master = min(alive); retired ranks are never started; success keeps dead_committed.
- ScaleP2D: the decode instance of a P/D deployment. HeteroFlow has no P/D scheduler of its own, so the
  instance is rebuilt like a reconfiguration and the record says ScaleP2D; a deployment with a P/D
  scheduler reacts to the withdrawn view.

Every fallback first *replaces* each NodeManager's retired set with ``retired_set_for_fallback()`` (through
``EnginesStartRequest.retired_endpoint_ids``), then waits until every relaunched engine is ready again. A
failed attempt leaves the instance in RECONFIGURING with ``last_error`` and is tried again after a back-off.

Fallbacks converge: the view is SET as the fallback's last step (no wait for the periodic SET); the wait for
ready engines is derived (three times the instance's last measured start, at least 30 s, within
``fallback_ready_timeout_sec``); and at most ``fallback_max_attempts`` relaunches run within
``fallback_attempt_window_sec``, after which the instance stays RECONFIGURING with ``INTERVENTION_REQUIRED``
(status ``intervention_required``, the ``heteroflow_controller_intervention_required`` series, an error log)
until an operator acts (a restart of the controller starts counting again).

No rank is relaunched on a card with a standing hardware fault (``core/relaunch.py`` decides, before every
attempt): on Kubernetes its pod is deleted for replacement through the :class:`PodReplacement` port and the
relaunch waits until the pod has registered again (with other cards); locally the instance comes back without
those ranks (SCALED_DOWN_RUNNING) when the scale-down gate allows it, else the fallback stops with
``RELAUNCH_REFUSED`` (status ``relaunch``, the ``heteroflow_controller_relaunch_refused`` series, an error log)
and runs again only when the fault clears.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import structlog

from heteroflow.contracts.serving import EnginesStartRequest
from heteroflow.serving.controller.clients import PeerError
from heteroflow.serving.controller.core import overlay
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import DpRank, PodId
from heteroflow.serving.controller.core.relaunch import RelaunchKind, RelaunchPlan, plan_relaunch
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.pod_replacement import PodReplacementError
from heteroflow.serving.controller.ports import StrategyPorts

_log = structlog.get_logger(__name__)

RETRY_BACKOFF_SEC = (1.0, 5.0, 15.0, 60.0)
MIN_READY_TIMEOUT_SEC = 30.0
READY_TIMEOUT_FACTOR = 3.0
INTERVENTION_REQUIRED = "INTERVENTION_REQUIRED"
RELAUNCH_REFUSED = "RELAUNCH_REFUSED"


def relaunch_plan(ctrl: StrategyPorts, inst: Instance) -> RelaunchPlan:
    """Where this fallback may relaunch the instance's engines, given its standing hardware faults."""
    return plan_relaunch(
        topology=inst.topology,
        retired=rt.retired_set_for_fallback(inst.runtime),
        standing=inst.standing.faults.values(),
        can_replace_pods=ctrl.pod_replacement is not None,
        flags=ctrl.ft.gate_flags(),
        capability=inst.topology.capability,
    )


def _refuse(ctrl: StrategyPorts, inst: Instance, plan: RelaunchPlan, request_id: str) -> None:
    """Nothing is relaunched: say why, once, and wait for the fault to clear (never a relaunch loop)."""
    reason = f"{RELAUNCH_REFUSED}: {plan.reason}"
    inst.relaunches.plan = plan
    ctrl.metrics.relaunch_refused.labels(instance_id=inst.instance_id).set(1)
    ctrl.set_runtime(inst, replace(inst.runtime, last_error=reason))
    ctrl.history.add(
        request_id,
        "relaunch_refused",
        reason_code=plan.reason_code.value if plan.reason_code else None,
        ranks=sorted(plan.faulty),
        faults=list(plan.faults),
        gate_reasons=list(plan.gate_reasons),
    )
    _log.error("controller.relaunch_refused", instance_id=inst.instance_id, detail=reason)


def ready_timeout(ctrl: StrategyPorts, inst: Instance) -> float:
    """How long relaunched engines may take: three times the last measured start, within the configured bound."""
    bound = ctrl.ft.fallback_ready_timeout_sec
    if inst.relaunches.measured_start_sec is None:
        return bound
    return min(bound, max(MIN_READY_TIMEOUT_SEC, READY_TIMEOUT_FACTOR * inst.relaunches.measured_start_sec))


def _attempt_allowed(ctrl: StrategyPorts, inst: Instance, request_id: str) -> bool:
    """Count one whole-instance attempt in the window; ``False`` (and INTERVENTION_REQUIRED) past the bound."""
    now = ctrl.clock.monotonic()
    window = ctrl.ft.fallback_attempt_window_sec
    inst.relaunches.times = [t for t in inst.relaunches.times if now - t < window]
    if len(inst.relaunches.times) < ctrl.ft.fallback_max_attempts:
        inst.relaunches.times.append(now)
        return True
    reason = (
        f"{INTERVENTION_REQUIRED}: {len(inst.relaunches.times)} whole-instance relaunches within "
        f"{window:g} s, the limit: the instance keeps failing, and the controller stopped relaunching it"
    )
    inst.relaunches.intervention_required = reason
    ctrl.metrics.intervention_required.labels(instance_id=inst.instance_id).set(1)
    ctrl.set_runtime(inst, replace(inst.runtime, last_error=reason))
    ctrl.history.add(request_id, "intervention_required", attempts=len(inst.relaunches.times), window_sec=window)
    _log.error("controller.intervention_required", instance_id=inst.instance_id, detail=reason)
    return False


async def run_fallback(ctrl: StrategyPorts, inst: Instance, fallback: rt.FallbackStrategy) -> None:
    # unique per run, like a round's: several instances fall back at the same generation (one node's fault)
    request_id = f"fb-{uuid.uuid4().hex[:16]}"
    record = ctrl.history.begin(
        request_id, instance_id=inst.instance_id, kind="fallback", trigger=inst.strategy.trigger
    )
    ctrl.history.add(request_id, "fallback", strategy=fallback.value, reason=inst.runtime.last_error)
    attempt = 0
    while inst.runtime.phase == FtPhase.RECONFIGURING:
        plan = relaunch_plan(ctrl, inst)
        if plan.kind == RelaunchKind.REFUSED:  # no relaunch is made, so none is counted
            _refuse(ctrl, inst, plan, request_id)
            ctrl.history.finish(request_id, "refused")
            ctrl.metrics.rounds.labels(kind="fallback", outcome="refused").inc()
            await ctrl.persist(inst, required=False)
            return
        if not _attempt_allowed(ctrl, inst, request_id):
            ctrl.history.finish(request_id, "intervention_required")
            ctrl.metrics.rounds.labels(kind="fallback", outcome="intervention_required").inc()
            await ctrl.persist(inst, required=False)
            return
        ctrl.metrics.relaunch_refused.labels(instance_id=inst.instance_id).set(0)
        shown = plan  # what the status shows while this attempt runs and after it succeeded
        inst.relaunches.plan = None if plan.kind == RelaunchKind.IN_PLACE else plan
        try:
            if plan.kind == RelaunchKind.REPLACE_PODS:
                await _replace_pods(ctrl, inst, plan, request_id)
                plan = relaunch_plan(ctrl, inst)  # on the replaced pods' new cards
                if plan.kind != RelaunchKind.IN_PLACE:
                    raise PodReplacementError(
                        f"pods {', '.join(shown.pods)} registered again on cards with a standing hardware fault"
                    )
            elif plan.kind == RelaunchKind.WITHOUT_RANKS:
                ctrl.history.add(request_id, "ranks_left_out", ranks=sorted(plan.faulty), faults=list(plan.faults))
                _log.warning("controller.ranks_left_out", instance_id=inst.instance_id, detail=plan.reason)
            await _relaunch(ctrl, inst, request_id, plan.retired)
        except (PeerError, TimeoutError, PodReplacementError) as exc:
            delay = RETRY_BACKOFF_SEC[min(attempt, len(RETRY_BACKOFF_SEC) - 1)]
            attempt += 1
            inst.relaunches.attempts += 1
            ctrl.history.add(request_id, "fallback_failed", attempt=attempt, error=str(exc), retry_in_sec=delay)
            ctrl.set_runtime(inst, replace(inst.runtime, last_error=f"{fallback.value} failed: {exc}"))
            _log.warning("controller.fallback_failed", instance_id=inst.instance_id, error=str(exc), attempt=attempt)
            await ctrl.clock.sleep(delay)  # back-off between attempts
            continue
        inst.relaunches.intervention_required = None
        inst.relaunches.replacing.clear()
        ctrl.metrics.intervention_required.labels(instance_id=inst.instance_id).set(0)
        left_out = plan.faulty if plan.kind == RelaunchKind.WITHOUT_RANKS else frozenset[DpRank]()
        ctrl.set_runtime(inst, rt.fallback_succeeded(inst.runtime, left_out=left_out))
        ctrl.history.mark(request_id, "committed_at")
        ctrl.reset_evidence(inst)
        if not inst.runtime.dead_committed:
            inst.relaunches.stopped_pods.clear()  # a rebuild brings every pod back
        await ctrl.persist(inst, required=False)
        ctrl.history.finish(request_id, "succeeded")
        ctrl.metrics.rounds.labels(kind="fallback", outcome="succeeded").inc()
        ctrl.metrics.stage_seconds.labels(stage="fallback").observe(ctrl.clock.monotonic() - record.started_monotonic)
        _log.info(
            "controller.fallback_succeeded",
            instance_id=inst.instance_id,
            strategy=fallback.value,
            phase=inst.runtime.phase.value,
            relaunch=shown.kind.value,
        )
        await ctrl.refresh_view(inst, by_strategy=True)
        if inst.runtime.serving_published:
            ctrl.history.mark(request_id, "serving_resumed_at")
        return


async def _replace_pods(ctrl: StrategyPorts, inst: Instance, plan: RelaunchPlan, request_id: str) -> None:
    """Delete each pod of ``plan`` for replacement, then wait until every one has registered again."""
    replacement = ctrl.pod_replacement
    assert replacement is not None  # plan_relaunch replaces pods only where it can
    if inst.publication.published and ctrl.coordinator is not None:
        await ctrl.view(inst, overlay.withdraw(inst.publication.published), request_id=request_id)
    ctrl.history.add(
        request_id, "pods_replace", pods=list(plan.pods), ranks=sorted(plan.faulty), faults=list(plan.faults)
    )
    _log.warning("controller.pods_replace", instance_id=inst.instance_id, detail=plan.reason)
    for pod_id in plan.pods:
        inst.relaunches.replacing[PodId(pod_id)] = ctrl.pods.get(pod_id)  # before: it may register at once
        await replacement.replace(pod_id)
    timeout = ready_timeout(ctrl, inst)
    deadline = ctrl.clock.monotonic() + timeout
    poll = max(0.05, min(ctrl.ft.poll_interval_sec, 1.0))
    while True:
        waiting = [
            pod_id
            for pod_id in plan.pods
            if (state := ctrl.pods.get(pod_id)) is None or state is inst.relaunches.replacing[PodId(pod_id)]
        ]
        if not waiting:
            ctrl.history.add(request_id, "pods_replaced", pods=list(plan.pods))
            return
        if ctrl.clock.monotonic() > deadline:
            raise TimeoutError(f"pods {waiting} not registered again within {timeout:.0f} s of their deletion")
        await ctrl.clock.sleep(poll)  # the registration poll period


async def relaunch_engines(ctrl: StrategyPorts, inst: Instance, request_id: str, retired: frozenset[DpRank]) -> None:
    """Restart every engine of ``inst`` with ``retired`` as each NodeManager's retired set, the view withdrawn,
    and wait until the others are ready (a restore's planned relaunch, ``restore.py``). Raises
    :class:`PeerError` or :class:`TimeoutError`."""
    await _relaunch(ctrl, inst, request_id, retired)


async def _relaunch(ctrl: StrategyPorts, inst: Instance, request_id: str, retired: frozenset[DpRank]) -> None:
    runtime = inst.runtime
    alive = runtime.original_dp_ranks - retired
    master_ip = inst.topology.endpoint(min(alive)).ip
    body = EnginesStartRequest(retired_endpoint_ids=sorted(retired), dp_master_ip=master_ip)
    started = ctrl.clock.monotonic()
    if inst.publication.published and ctrl.coordinator is not None:
        await ctrl.view(inst, overlay.withdraw(inst.publication.published), request_id=request_id)
    for pod in inst.topology.pods:
        answer = await ctrl.nm.restart_engines(pod.node_manager_url, body)
        ctrl.history.add(
            request_id,
            "engines_restart",
            pod_id=pod.pod_id,
            retired=answer.retired_endpoint_ids,
            stopped=answer.stopped_endpoint_ids,
            started=answer.started_endpoint_ids,
        )
    await _until_ready(ctrl, inst, alive, request_id)
    inst.relaunches.measured_start_sec = ctrl.clock.monotonic() - started


async def _until_ready(ctrl: StrategyPorts, inst: Instance, alive: frozenset[int], request_id: str) -> None:
    timeout = ready_timeout(ctrl, inst)
    deadline = ctrl.clock.monotonic() + timeout
    poll = max(0.05, min(ctrl.ft.poll_interval_sec, 1.0))
    while True:
        ready: set[int] = set()
        for pod in inst.topology.pods:
            try:
                status = await ctrl.nm.node_status(pod.node_manager_url)
            except PeerError:
                continue
            for endpoint in status.get("endpoints", []):
                if isinstance(endpoint, dict) and endpoint.get("ready") and not endpoint.get("retired"):
                    ready.add(int(endpoint.get("endpoint_id", -1)))
        if alive <= ready:
            ctrl.history.add(request_id, "engines_ready", ranks=sorted(alive))
            return
        if ctrl.clock.monotonic() > deadline:
            raise TimeoutError(f"engines {sorted(alive - ready)} not ready within {timeout:.0f} s")
        await ctrl.clock.sleep(poll)  # the readiness poll period
