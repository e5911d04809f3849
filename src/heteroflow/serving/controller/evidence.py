"""On-demand evidence around the FaultManager's decision: collecting status nobody reported yet, and the
idle-survivor nudge (F-54). Both only ask the NodeManagers; the controller never talks to an engine."""

from __future__ import annotations

import asyncio
import uuid

import structlog

from heteroflow.contracts.serving import FaultEvidence, ProbeRequest, SoftwareFaultReport
from heteroflow.serving.controller.clients import PeerError
from heteroflow.serving.controller.core import normalizer
from heteroflow.serving.controller.core.ranks import DpRank
from heteroflow.serving.controller.core.topology import PodTopology
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import EvidencePorts

_log = structlog.get_logger(__name__)

COLLECT_SPACING_SEC = 0.05
"""At most one on-demand status collection per instance in this interval (after the previous one answered).

A survivor's collective fails 0.1-0.3 s after its peer died, and the decision waits for every survivor's report:
asking every 50 ms puts that report at the controller within one status query of the failure (at 0.25 s it
waited 0.1-0.25 s of nothing, the largest share of the control plane's time in a round). The cost is one status
query per pod per 50 ms, only while a snapshot is incomplete (bounded by the collection timeout), one at a time."""
RECHECK_SPACING_SEC = 0.25
"""At most one re-check of unreachable-only DEAD evidence per instance in this interval (a stalled API server
answers again in seconds, not milliseconds)."""


def collect_missing(ctrl: EvidencePorts, inst: Instance) -> None:
    """An incomplete snapshot: ask the NodeManagers at once for the FT status of the ranks nobody reported
    on yet, instead of waiting up to a poll period for their own pollers (the same status route a round
    polls; the controller still never talks to an engine), and again every ``COLLECT_SPACING_SEC`` while the
    snapshot stays incomplete. What they answer is folded in as evidence."""
    now = ctrl.clock.monotonic()
    if inst.collection.collecting or not ctrl.ft.scale_down_enabled:
        return  # a collection in flight wakes the strategy center when it ends
    snapshot = normalizer.classify(inst.evidence.snapshot, inst.runtime.active_dp_ranks)
    unheard = inst.runtime.active_dp_ranks - snapshot.dead - snapshot.unhealthy
    if not unheard or not (snapshot.dead or snapshot.unhealthy):
        return
    again = inst.collection.collected_at + COLLECT_SPACING_SEC
    if now < again:
        # still incomplete: ask again as soon as the spacing allows, never only at the next periodic scan
        # (the decision's own wait, the collection timeout, bounds how long this goes on)
        inst.strategy.wake_by(again)
        return
    inst.collection.collecting = True

    async def query(pod: PodTopology) -> None:
        ids = sorted(pod.dp_ranks & unheard)
        if not ids:
            return
        try:
            answer = await ctrl.nm.status(pod.node_manager_url, ids)
        except PeerError:
            return  # the NodeManager's own poller still reports
        for entry in answer.entries:
            status = entry.status
            if status is None or status.status not in ("diagnosing", "unhealthy", "dead"):
                continue
            ctrl.report(
                SoftwareFaultReport(
                    instance_id=inst.instance_id,
                    pod_id=pod.pod_id,
                    endpoint_id=entry.endpoint_id,
                    status=status.status,
                    evidence=FaultEvidence.FT_STATUS,
                    engine_status=status,
                    detail="collected by the controller",
                    observed_at=ctrl.clock.now(),
                )
            )

    async def collect() -> None:
        try:
            await asyncio.gather(*(query(pod) for pod in inst.topology.pods))
        finally:
            inst.collection.collecting = False
            inst.collection.collected_at = ctrl.clock.monotonic()
            ctrl.wake()  # decide again: complete now, or collect again after the spacing

    ctrl.spawn(collect(), name=f"collect-{inst.instance_id}")


def nudge_idle(ctrl: EvidencePorts, inst: Instance) -> None:
    """F-54: a DEAD is known but survivors stay HEALTHY for lack of traffic; with ``nudge_idle_survivors``
    each of their NodeManagers sends one bounded request so they meet the fault in their collective."""
    if not ctrl.ft.nudge_idle_survivors or inst.collection.nudged:
        return
    snapshot = normalizer.classify(inst.evidence.snapshot, inst.runtime.active_dp_ranks)
    idle = inst.runtime.active_dp_ranks - snapshot.dead - snapshot.unhealthy
    if not snapshot.dead or not idle:
        return
    inst.collection.nudged = True
    request_id = f"nudge-{uuid.uuid4().hex[:12]}"
    _log.info("controller.nudge", instance_id=inst.instance_id, ranks=sorted(idle), dead=sorted(snapshot.dead))

    async def nudge() -> None:
        for pod in inst.topology.pods:
            ids = sorted(pod.dp_ranks & idle)
            if not ids:
                continue
            try:
                await ctrl.nm.nudge(
                    pod.node_manager_url, ProbeRequest(request_id=request_id, endpoint_ids=ids, timeout_sec=5.0)
                )
            except PeerError as exc:  # best effort: the collection timeout still ends the wait
                _log.warning("controller.nudge_failed", pod_id=pod.pod_id, error=str(exc))

    ctrl.spawn(nudge(), name=f"nudge-{inst.instance_id}")


def recheck_unreachable(ctrl: EvidencePorts, inst: Instance) -> None:
    """Unreachable is not dead by itself: a rank whose only DEAD evidence is a status timeout
    (``FT_UNREACHABLE``) is asked about again through its NodeManager every ``RECHECK_SPACING_SEC`` while no
    round has started. If the same engine (the identity the report carried) answers healthy, the evidence is
    withdrawn (``withdraw_evidence``), ending the COLLECTING wait for it. The supervisor's word
    wins: ``not_running`` or another identity keeps the DEAD; a supervisor's ``ENGINE_DEAD`` never reverts."""
    ranks = {
        rank: inst.evidence.unreachable.get(rank)
        for rank, entry in inst.evidence.snapshot.entries.items()
        if entry.status == "dead"
        and entry.evidence == FaultEvidence.FT_UNREACHABLE
        and rank in inst.evidence.unreachable
    }
    if not ranks or inst.collection.rechecking or inst.strategy.running is not None:
        return
    now = ctrl.clock.monotonic()
    again = inst.collection.rechecked_at + RECHECK_SPACING_SEC
    if now < again:
        inst.strategy.wake_by(again)
        return
    inst.collection.rechecking = True

    async def query(pod: PodTopology) -> None:
        ids = sorted(pod.dp_ranks & set(ranks))
        if not ids:
            return
        try:
            answer = await ctrl.nm.status(pod.node_manager_url, ids)
        except PeerError:
            return
        for entry in answer.entries:
            rank = DpRank(entry.endpoint_id)
            known = ranks.get(rank)
            same = known is None or entry.identity == known
            if entry.status is not None and entry.status.status == "healthy" and same and entry.identity is not None:
                ctrl.withdraw_evidence(inst, rank, why="the same engine answered healthy again")

    async def recheck() -> None:
        try:
            await asyncio.gather(*(query(pod) for pod in inst.topology.pods))
        finally:
            inst.collection.rechecking = False
            inst.collection.rechecked_at = ctrl.clock.monotonic()
            ctrl.wake()

    ctrl.spawn(recheck(), name=f"recheck-{inst.instance_id}")
