"""EngineFastRecovery (``serving-ft.md`` F-11, F-59): the engine's ``retry`` on every active rank, guarded like a
round; the stability window that allows it is judged in the core's ``decide``."""

from __future__ import annotations

import uuid

from heteroflow.contracts.serving import ApplyInstructionParams, EndpointFtStatus, NmApplyRequest
from heteroflow.serving.controller.clients import PeerError
from heteroflow.serving.controller.core import readiness
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.decision import after_fast_recovery
from heteroflow.serving.controller.core.ranks import DpRank, RequestId, ranks
from heteroflow.serving.controller.core.readiness import PollLimits
from heteroflow.serving.controller.dispatch import Target, dispatch
from heteroflow.serving.controller.guard import RoundFailedError, RoundGuard
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import StrategyPorts


class FastRecovery:
    """F-11 / A8: the engine's ``retry`` on every active rank after the stability window (F-59, in ``decide``).

    Guarded like a round; success forgets the evidence; failure → whole-instance reconfiguration, never
    scale-down (``after_fast_recovery``). An instance whose world elastic EP resized outside HeteroFlow is not
    retried at all (vLLM 0.34 plans a ``retry`` over the launch's ranks, as a ``scale_down``): it fails at once
    and takes that fallback.
    """

    def __init__(self, ctrl: StrategyPorts, inst: Instance) -> None:
        self.ctrl, self.inst = ctrl, inst
        self.request_id = RequestId(f"fr-{uuid.uuid4().hex[:16]}")

    async def run(self) -> None:
        ctrl, inst = self.ctrl, self.inst
        ctrl.history.begin(
            self.request_id, instance_id=inst.instance_id, kind="fast_recovery", trigger=inst.strategy.trigger
        )
        ok = False
        resized = inst.elastic_ep_resized(ctrl.pods)
        if resized:  # vLLM plans a retry over its launch's ranks too: the fallback relaunches a fresh world instead
            ctrl.history.add(
                self.request_id,
                "failed",
                error=f"elastic EP resized the world of ranks {sorted(resized)} outside HeteroFlow: no retry "
                "until the instance is relaunched",
            )
        else:
            guard = RoundGuard(ctrl, inst, self.request_id)
            try:
                await guard.acquire()
                await self._retry(inst.runtime.active_dp_ranks)
                ok = True
            except (RoundFailedError, PeerError) as exc:
                ctrl.history.add(self.request_id, "failed", error=str(exc))
            finally:
                await guard.release()
                await ctrl.finalize_everywhere(inst, self.request_id, commit=ok, retired=inst.runtime.dead_committed)
        ctrl.history.finish(self.request_id, "succeeded" if ok else "failed")
        ctrl.metrics.rounds.labels(kind="fast_recovery", outcome="succeeded" if ok else "failed").inc()
        if ok:
            ctrl.history.mark(self.request_id, "committed_at")
            ctrl.reset_evidence(inst)
            await ctrl.refresh_view(inst, by_strategy=True)  # what the first fault report withdrew comes back now
            if inst.runtime.serving_published:
                ctrl.history.mark(self.request_id, "serving_resumed_at")
            return
        decision = after_fast_recovery(succeeded=False)
        fallback = getattr(decision, "fallback", rt.FallbackStrategy.INSTANCE_RECONFIGURATION)
        ctrl.set_runtime(inst, rt.start_reconfiguration(inst.runtime, fallback, "fast recovery failed"))
        await ctrl.persist(inst, required=False)
        await ctrl.run_fallback(inst, fallback)

    async def _retry(self, active: frozenset[DpRank]) -> None:
        ctrl, inst = self.ctrl, self.inst
        timings = ctrl.ft.round_timings()
        # every pod at once, bounded: vLLM 0.34 fails a retry round not every engine joined within 10 s
        targets = [
            Target(
                pod_id=pod.pod_id,
                url=pod.node_manager_url,
                body=NmApplyRequest(
                    instruction="retry",
                    request_id=self.request_id,
                    params=ApplyInstructionParams(),
                    endpoint_ids=sorted(pod.dp_ranks & active),
                ),
            )
            for pod in inst.topology.pods
            if pod.dp_ranks & active
        ]
        await dispatch(ctrl, self.request_id, targets, budget_sec=timings.apply_dispatch_budget_sec)
        limits = PollLimits(deadline=ctrl.clock.monotonic() + timings.execution_deadline_sec)
        while True:
            await ctrl.clock.sleep(timings.poll_interval_sec)  # the spec's poll period
            entries: list[EndpointFtStatus] = []
            for pod in inst.topology.pods:
                ids = sorted(pod.dp_ranks & active)
                if ids:
                    entries.extend((await ctrl.nm.status(pod.node_manager_url, ids)).entries)
            verdict = readiness.after_apply(
                entries, survivors=ranks(active), request_id=self.request_id, limits=limits, now=ctrl.clock.monotonic()
            )
            if verdict.verdict == "commit":
                return
            if verdict.verdict == "fail":
                raise RoundFailedError(f"retry: {verdict.reason}")
