"""What the controller publishes to the Coordinator for an instance, and the publication (``serving-ft.md`` F-4,
F-40).

The view goes out as DEL/ADD/SET overlay operations (``core/overlay.py`` computes them): a DEL of a rank at its
first fault report (:func:`withdraw_faulted`), the round's and the fallbacks' operations (:func:`send`), and the
READY / RESUME / periodic SET (:func:`refresh`). The Coordinator holds back what a DEL withdrew from every ADD/SET of
no newer generation, so an ADD/SET after a DEL carries a newer generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import structlog

from heteroflow.contracts.serving import ServingEndpoint
from heteroflow.serving.controller.clients import PeerError
from heteroflow.serving.controller.core import overlay
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import DpRank
from heteroflow.serving.controller.instance import Instance, PodState
from heteroflow.serving.controller.ports import PublicationPorts

_log = structlog.get_logger(__name__)


def serving_endpoints(inst: Instance, ids: frozenset[DpRank]) -> list[ServingEndpoint]:
    found = []
    for rank in sorted(ids):
        endpoint = inst.topology.endpoint(rank)
        found.append(ServingEndpoint(id=endpoint.id, ip=endpoint.ip, port=endpoint.port))
    return found


def pods_ready(inst: Instance, pods: Mapping[str, PodState]) -> bool:
    """Every pod of the instance has sent a complete heartbeat (F-4): its engines have been ready."""
    for pod in inst.topology.pods:
        state = pods.get(pod.pod_id)
        if state is None or not state.heartbeat_complete:
            return False
    return True


def withdraw_faulted(ctrl: PublicationPorts, inst: Instance, rank: DpRank) -> None:
    """Stop the Coordinator sending to ``rank`` at once, at its first fault report (not when a round's DEL
    comes): a DEL of that rank with the current generation and ``faulted`` (requests waiting on it go
    elsewhere within the Coordinator's faulted bound)."""
    if inst.runtime.phase == FtPhase.DISABLED or rank in inst.publication.fault_withdrawn:
        return
    inst.publication.fault_withdrawn = inst.publication.fault_withdrawn | {rank}
    if rank not in inst.publication.published:
        return
    generation = inst.runtime.generation
    inst.publication.held_generation = max(inst.publication.held_generation or 0, generation)
    ctrl.history.add(
        inst.runtime.request_id if inst.strategy.running else None, "coordinator_del_faulted", endpoint_ids=[rank]
    )
    if ctrl.coordinator is None:
        inst.publication.published = inst.publication.published - {rank}
        return
    coordinator = ctrl.coordinator

    async def withdraw() -> None:
        try:
            await coordinator.withdraw(inst.instance_id, [rank], request_id=None, generation=generation, faulted=True)
        except PeerError as exc:  # the periodic SET leaves the rank out: it is the retry
            _log.warning(
                "controller.faulted_withdrawal_failed", instance_id=inst.instance_id, rank=rank, error=str(exc)
            )
            return
        inst.publication.published = inst.publication.published - {rank}
        _log.info("controller.faulted_rank_withdrawn", instance_id=inst.instance_id, rank=rank, generation=generation)

    ctrl.spawn(withdraw(), name=f"withdraw-{inst.instance_id}-{rank}")


async def send(
    ctrl: PublicationPorts, inst: Instance, op: overlay.CoordinatorOp, *, request_id: str | None = None
) -> None:
    """Send one overlay operation; raises :class:`PeerError` when the Coordinator did not take it."""
    ctrl.history.add(request_id, f"coordinator_{op.op.lower()}", endpoint_ids=sorted(op.endpoint_ids))
    if ctrl.coordinator is None:
        inst.publication.published = op.endpoint_ids if op.op != "DEL" else inst.publication.published - op.endpoint_ids
        return
    if (
        op.op != "DEL"
        and inst.publication.held_generation is not None
        and inst.runtime.generation <= inst.publication.held_generation
    ):
        # the Coordinator holds back what a DEL withdrew from every ADD/SET of no newer generation
        ctrl.set_runtime(inst, replace(inst.runtime, generation=inst.publication.held_generation + 1))
        ctrl.spawn(ctrl.persist(inst, required=False), name=f"persist-{inst.instance_id}")
    instance_id, generation = inst.instance_id, inst.runtime.generation
    if op.op == "DEL":
        await ctrl.coordinator.withdraw(
            instance_id, sorted(op.endpoint_ids), request_id=request_id, generation=generation
        )
        inst.publication.held_generation = max(inst.publication.held_generation or 0, generation)
        inst.publication.published = inst.publication.published - op.endpoint_ids
    elif op.op == "ADD":
        endpoints = serving_endpoints(inst, op.endpoint_ids)
        await ctrl.coordinator.add(
            instance_id, ctrl.model_of(inst), endpoints, generation=generation, request_id=request_id
        )
        inst.publication.published = inst.publication.published | op.endpoint_ids
    else:
        endpoints = serving_endpoints(inst, op.endpoint_ids)
        await ctrl.coordinator.set(instance_id, ctrl.model_of(inst), endpoints, generation=generation)
        inst.publication.published = op.endpoint_ids


async def refresh(ctrl: PublicationPorts, inst: Instance, *, by_strategy: bool = False) -> None:
    """The READY / RESUME / periodic SET, through the projection (F-40); ``serving_published`` follows.
    ``by_strategy``: called by the running strategy itself as its last step (a rebuild publishes at once,
    not at the next periodic SET)."""
    if (inst.strategy.running is not None and not by_strategy) or inst.runtime.phase not in (
        FtPhase.NORMAL,
        FtPhase.SCALED_DOWN_RUNNING,
        FtPhase.DISABLED,
    ):
        return
    if not pods_ready(inst, ctrl.pods):
        return
    op = overlay.refresh(inst.runtime)
    if inst.publication.fault_withdrawn:
        op = overlay.CoordinatorOp("SET", op.endpoint_ids - inst.publication.fault_withdrawn)
    try:
        await send(ctrl, inst, op)
    except PeerError as exc:
        ctrl.set_runtime(inst, rt.publish_result(inst.runtime, ok=False, error=f"SET failed: {exc}"))
        return
    ctrl.history.serving_resumed(inst.instance_id)
    if not inst.runtime.serving_published or inst.runtime.last_error is not None:
        ctrl.set_runtime(inst, rt.publish_result(inst.runtime, ok=True))
