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
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from heteroflow.serving.controller.clients import PeerError
from heteroflow.serving.controller.core import overlay
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.wire import EnginesStartRequest

if TYPE_CHECKING:
    from heteroflow.serving.controller.service import Controller, Instance

_log = structlog.get_logger(__name__)

READY_TIMEOUT_SEC = 300.0
"""How long relaunched engines may take to be ready (model loading on real hardware takes minutes)."""
RETRY_BACKOFF_SEC = (1.0, 5.0, 15.0, 60.0)


async def run_fallback(ctrl: Controller, inst: Instance, fallback: rt.FallbackStrategy) -> None:
    # unique per run, like a round's: several instances fall back at the same generation (one node's fault)
    request_id = f"fb-{uuid.uuid4().hex[:16]}"
    record = ctrl.history.begin(request_id, instance_id=inst.instance_id, kind="fallback")
    ctrl.history.add(request_id, "fallback", strategy=fallback.value, reason=inst.runtime.last_error)
    attempt = 0
    while inst.runtime.phase == FtPhase.RECONFIGURING:
        try:
            await _relaunch(ctrl, inst, request_id)
        except (PeerError, TimeoutError) as exc:
            delay = RETRY_BACKOFF_SEC[min(attempt, len(RETRY_BACKOFF_SEC) - 1)]
            attempt += 1
            inst.fallback_attempts += 1
            ctrl.history.add(request_id, "fallback_failed", attempt=attempt, error=str(exc), retry_in_sec=delay)
            ctrl.set_runtime(inst, replace(inst.runtime, last_error=f"{fallback.value} failed: {exc}"))
            _log.warning("controller.fallback_failed", instance_id=inst.instance_id, error=str(exc), attempt=attempt)
            await asyncio.sleep(delay)  # back-off between attempts
            continue
        ctrl.set_runtime(inst, rt.fallback_succeeded(inst.runtime))
        ctrl.reset_evidence(inst)
        if not inst.runtime.dead_committed:
            inst.stopped_pods.clear()  # a rebuild brings every pod back
        await ctrl.persist(inst, required=False)
        ctrl.history.finish(request_id, "succeeded")
        ctrl.metrics.rounds.labels(kind="fallback", outcome="succeeded").inc()
        ctrl.metrics.stage_seconds.labels(stage="fallback").observe(ctrl.clock.monotonic() - record.started_monotonic)
        _log.info(
            "controller.fallback_succeeded",
            instance_id=inst.instance_id,
            strategy=fallback.value,
            phase=inst.runtime.phase.value,
        )
        await ctrl.refresh_view(inst, by_strategy=True)
        return


async def _relaunch(ctrl: Controller, inst: Instance, request_id: str) -> None:
    runtime = inst.runtime
    retired = rt.retired_set_for_fallback(runtime)
    alive = runtime.original_dp_ranks - retired
    master_ip = inst.topology.endpoint(min(alive)).ip
    body = EnginesStartRequest(retired_endpoint_ids=sorted(retired), dp_master_ip=master_ip)
    if inst.published and ctrl.coordinator is not None:
        await ctrl.view(inst, overlay.withdraw(inst.published), request_id=request_id)
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


async def _until_ready(ctrl: Controller, inst: Instance, alive: frozenset[int], request_id: str) -> None:
    deadline = ctrl.clock.monotonic() + READY_TIMEOUT_SEC
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
            raise TimeoutError(f"engines {sorted(alive - ready)} not ready within {READY_TIMEOUT_SEC:.0f} s")
        await asyncio.sleep(poll)  # the readiness poll period
