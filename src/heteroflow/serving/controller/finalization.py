"""finalize at every NodeManager of an instance, and what a restarted controller does with a round it finds
interrupted (F-32): abort it everywhere, persist, then run (or resume) its fallback. Never a replay."""

from __future__ import annotations

from heteroflow.contracts.serving import FinalizeRequest
from heteroflow.serving.controller.clients import NodeManagerClient, PeerError
from heteroflow.serving.controller.core.ranks import DpRank
from heteroflow.serving.controller.history import RoundHistory
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import StrategyPorts


async def finalize_everywhere(
    *,
    nm: NodeManagerClient,
    history: RoundHistory,
    inst: Instance,
    request_id: str,
    commit: bool,
    retired: frozenset[DpRank],
) -> dict[str, bool]:
    """finalize on every pod of the instance; which pods acknowledged (a stale id is refused: fine)."""
    acked: dict[str, bool] = {}
    body = FinalizeRequest(request_id=request_id, commit=commit, retired_endpoint_ids=sorted(retired))
    for pod in inst.topology.pods:
        try:
            answer = await nm.finalize(pod.node_manager_url, body)
            acked[pod.pod_id] = True
            history.add(request_id, "finalize", pod_id=pod.pod_id, commit=commit, repeated=answer.repeated)
        except PeerError as exc:
            acked[pod.pod_id] = False
            history.add(request_id, "finalize_failed", pod_id=pod.pod_id, commit=commit, error=str(exc))
    return acked


async def resume_after_restart(ctrl: StrategyPorts, inst: Instance) -> None:
    """Abort the interrupted round at every NodeManager, then run (or resume) the fallback; run by the strategy
    center as the instance's strategy, which owns the pending abort and fallback it clears."""
    slot = inst.strategy
    if slot.pending_abort is not None:
        await ctrl.finalize_everywhere(inst, slot.pending_abort, commit=False, retired=inst.runtime.dead_committed)
        slot.pending_abort = None
    await ctrl.persist(inst, required=False)
    fallback, slot.pending_fallback = slot.pending_fallback, None
    if fallback is not None:
        await ctrl.run_fallback(inst, fallback)
