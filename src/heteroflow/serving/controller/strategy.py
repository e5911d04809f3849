"""DpScaleDownStrategy: one round (``serving-ft.md`` F-20…F-27, F-50…F-58); the fast recovery is ``fast_recovery.py``.

The round is a single transaction with side effects; every judgement in it is the pure core's
(``gate.evaluate``, ``topology.plan_round``, ``readiness.before_apply`` / ``after_apply``, the ``runtime``
operations). The order, and what makes it safe:

1. ``start_round`` → DECIDING, persisted with compare-and-swap (write-ahead, F-50): a failed write aborts
   before anything is sent.
2. Topology and gate (F-21, F-22); F-20 dedup.
3. Guard every pod with the round's ``request_id`` and lease (F-23), renewed while the round runs (F-58).
4. Apply-ready loop (F-24): absorb survivors that turned DEAD, poll the HEALTHY/recovering ones, fail on
   anything else; optional nudge of idle survivors (F-54).
5. Write-ahead again, DEL of the published view, ``begin_apply``, one apply per routable pod (F-25).
6. Post-apply polls until every survivor is healthy (F-26), then each survivor's NodeManager probes its
   engine with one completion and reports its identity, which must not have changed (F-52).
7. finalize(commit) on every pod, repeated until acknowledged or declared lost (F-57); ``record_commit``,
   persist (a failure no longer aborts: ``last_error`` and a retried persist), optional pod stops,
   ``finish_round``, ADD of the survivors.
Any failure before commit: finalize(abort) on every pod in ``finally``, ``fail_round`` and the frozen fallback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import structlog

from heteroflow.contracts.serving import (
    EndpointFtStatus,
    EngineIdentity,
    EnginesStopRequest,
    FinalizeRequest,
    ProbeRequest,
    ProbeResponse,
)
from heteroflow.core.errors import StoreUnavailableError
from heteroflow.serving.controller.clients import PeerError
from heteroflow.serving.controller.core import gate, overlay, readiness
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.errors import CapabilityMismatchError, RoundStateError, TopologyError
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import RequestId
from heteroflow.serving.controller.core.readiness import PollLimits, PollVerdict
from heteroflow.serving.controller.core.topology import (
    NodeManagerRole,
    RoundPlan,
    apply_request,
    plan_round,
    recyclable_pods,
)
from heteroflow.serving.controller.dispatch import Target, dispatch
from heteroflow.serving.controller.guard import RoundFailedError, RoundGuard
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import StrategyPorts
from heteroflow.serving.controller.store import FtStoreError

_log = structlog.get_logger(__name__)


FIRST_POLL_SEC = 0.05
"""The first status polls after a command; engines rebuild in tens of milliseconds when nothing is wrong."""
QUICK_POLLS_SEC = 1.0
"""For how long (the sum of the pauses) the polls stay at :data:`FIRST_POLL_SEC` before they slow down."""


def poll_pauses(period: float) -> Iterator[float]:
    """Pauses between status polls: 50 ms for the first second, then doubling up to ``poll_interval_sec``, then
    every period.

    A rebuild takes 0.2-0.5 s (a new store when the master died); polls doubling from 50 ms saw it finished up
    to 0.2 s late, a third of the control plane's time in a round. Polling every 50 ms while rebuilds usually
    end costs about 20 extra status queries per round and sees the end within 50 ms; the period bounds the rate
    afterwards, as the RFC's interval does.
    """
    pause = min(FIRST_POLL_SEC, period)
    for _ in range(max(1, round(QUICK_POLLS_SEC / pause))):
        yield pause
    while True:
        pause = min(pause * 2, period)
        yield pause


class ScaleDownRound:
    def __init__(self, ctrl: StrategyPorts, inst: Instance, context: rt.ScaleDownContext) -> None:
        self.ctrl = ctrl
        self.inst = inst
        self.context = context
        self.request_id: RequestId = context.request_id
        self.timings = ctrl.ft.round_timings()
        self.committed = False
        self.identities: dict[int, EngineIdentity] = {}
        self._stage_started = ctrl.clock.monotonic()

    # -- helpers --------------------------------------------------------------------------------------------
    def _set(self, runtime: rt.FtRuntime) -> None:
        self.ctrl.set_runtime(self.inst, runtime)

    def _event(self, kind: str, **detail: object) -> None:
        self.ctrl.history.add(self.request_id, kind, **detail)

    def _stage(self, name: str) -> None:
        now = self.ctrl.clock.monotonic()
        seconds = now - self._stage_started
        self._stage_started = now
        self.ctrl.history.stage(self.request_id, name, seconds)
        self.ctrl.metrics.stage_seconds.labels(stage=name).observe(seconds)

    async def _write_ahead(self, what: str) -> None:
        try:
            await self.ctrl.persist(self.inst, required=True)
        except (StoreUnavailableError, FtStoreError) as exc:
            raise RoundFailedError(f"write-ahead ({what}) failed: {exc}") from exc
        self._event("write_ahead", phase=self.inst.runtime.phase.value, what=what)

    # -- the round ------------------------------------------------------------------------------------------
    async def run(self) -> None:
        ctrl, inst = self.ctrl, self.inst
        ctrl.history.begin(
            self.request_id, instance_id=inst.instance_id, kind="scale_down", trigger=inst.strategy.trigger
        )
        self._event(
            "decided",
            candidates=sorted(self.context.candidates),
            survivors=sorted(self.context.survivors),
            dead_committed=sorted(self.context.dead_committed_at_start),
            fallback=self.context.fallback.value,
            hardware_matched=self.context.hardware_matched,
            hardware_keys=list(self.context.hardware_keys),
        )
        dedup = rt.dedup_is_success(inst.runtime, self.context.candidates)
        if dedup is not None:  # F-20: nothing new to remove (the core's decide never asks for this; be safe)
            ctrl.history.finish(self.request_id, "deduplicated" if dedup else "failed")
            return
        self._set(rt.start_round(inst.runtime, self.context))
        _log.info("round.started", request_id=self.request_id, instance_id=inst.instance_id)
        guard = RoundGuard(ctrl, inst, self.request_id)
        failure: str | None = None
        terminal = False
        try:
            await self._write_ahead("before guard")
            ctrl.crash_point("after_write_ahead")
            plan = self._gate_and_plan()
            await guard.acquire()
            ctrl.crash_point("after_guard")
            self._stage("guard")
            plan = await self._until_apply_ready(plan)
            self._check_guard(guard)
            await self._apply(plan)
            await self._until_recovered(plan)
            await self._probe(plan)
            self._check_guard(guard)
            await self._commit()
        except RoundFailedError as exc:
            failure, terminal = str(exc), exc.terminal
        except (RoundStateError, TopologyError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
        finally:
            await guard.release()
            if not self.committed:
                await ctrl.finalize_everywhere(inst, self.request_id, commit=False, retired=inst.runtime.dead_committed)
        if failure is not None:
            await self._fail(failure, terminal=terminal)

    def _check_guard(self, guard: RoundGuard) -> None:
        if guard.renewal_error is not None:
            raise RoundFailedError(guard.renewal_error)

    def _gate_and_plan(self) -> RoundPlan:
        inst, ctx = self.inst, self.inst.runtime.context
        assert ctx is not None
        topology_error: str | None = None
        mismatch = False
        plan: RoundPlan | None = None
        try:
            plan = plan_round(inst.topology, survivors=ctx.survivors, removed=ctx.removed_dp_ranks)
        except CapabilityMismatchError as exc:
            mismatch, topology_error = True, str(exc)
        except TopologyError as exc:
            topology_error = str(exc)
        result = gate.evaluate(
            flags=self.ctrl.ft.gate_flags(),
            capability=inst.topology.capability,
            survivors=len(ctx.survivors),
            topology_error=topology_error,
            capability_mismatch=mismatch,
            elastic_ep_resized=inst.elastic_ep_resized(self.ctrl.pods),
        )
        self._set(rt.record_gate(inst.runtime, result))
        self._event(
            "gate",
            allowed=result.allowed,
            reason_codes=[r.value for r in result.reason_codes],
            warnings=list(result.warnings),
        )
        if not result.allowed or plan is None:
            raise RoundFailedError(f"gate refused: {', '.join(r.value for r in result.reason_codes)}")
        return plan

    async def _statuses(self, plan: RoundPlan) -> list[EndpointFtStatus]:
        """One status query per routable pod, all pods at once (a round waits for the slowest, not the sum)."""

        async def one(role: NodeManagerRole) -> list[EndpointFtStatus]:
            ids = sorted(role.survivors)
            try:
                answer = await self.ctrl.nm.status(role.pod.node_manager_url, ids)
            except PeerError as exc:
                return [EndpointFtStatus(endpoint_id=i, error="unreachable", detail=str(exc)) for i in ids]
            return list(answer.entries)

        entries = [entry for found in await asyncio.gather(*(one(r) for r in plan.routable)) for entry in found]
        for entry in entries:
            if entry.identity is not None:
                self.identities.setdefault(entry.endpoint_id, entry.identity)
            if entry.status is not None:
                self.inst.evidence.engine_statuses[entry.endpoint_id] = entry.status.status
        self._event(
            "status_poll",
            entries={
                e.endpoint_id: (e.status.status + (f"/{e.status.ft_state}" if e.status.ft_state else ""))
                if e.status is not None
                else f"error:{e.error}"
                for e in entries
            },
        )
        return entries

    async def _until_apply_ready(self, plan: RoundPlan) -> RoundPlan:
        clock = self.ctrl.clock
        limits = PollLimits(
            deadline=clock.monotonic() + self.timings.execution_deadline_sec,
            max_transient_query_errors=self.ctrl.ft.max_transient_query_errors,
        )
        nudged = False
        pause = poll_pauses(self.timings.poll_interval_sec)
        while True:
            ctx = self.inst.runtime.context
            assert ctx is not None
            entries = await self._statuses(plan)
            verdict = readiness.before_apply(entries, survivors=ctx.survivors, limits=limits, now=clock.monotonic())
            limits = PollLimits(
                deadline=limits.deadline,
                max_transient_query_errors=limits.max_transient_query_errors,
                transient_errors=verdict.transient_errors,
            )
            if verdict.verdict == "ready":
                self._stage("apply_ready")
                return plan
            if verdict.verdict == "fail":
                raise RoundFailedError(f"before apply: {verdict.reason}")
            if verdict.verdict == "absorb":
                self._set(rt.absorb_dead(self.inst.runtime, verdict.absorbed))
                self._event("absorbed", ranks=sorted(verdict.absorbed))
                ctx = self.inst.runtime.context
                assert ctx is not None
                plan = plan_round(self.inst.topology, survivors=ctx.survivors, removed=ctx.removed_dp_ranks)
                continue
            if self.inst.runtime.phase == FtPhase.DECIDING:
                self._set(rt.wait_for_engines(self.inst.runtime))
            if self.ctrl.ft.nudge_idle_survivors and not nudged:
                nudged = True
                await self._nudge(plan, verdict)
            await self.ctrl.clock.sleep(next(pause))  # the poll period; the first polls come sooner (see poll_pauses)

    async def _nudge(self, plan: RoundPlan, verdict: PollVerdict) -> None:
        """F-54: idle survivors meet the fault only with traffic; one bounded probe each."""
        for role in plan.routable:
            body = ProbeRequest(request_id=self.request_id, endpoint_ids=sorted(role.survivors), timeout_sec=2.0)
            try:
                answer = await self.ctrl.nm.nudge(role.pod.node_manager_url, body)
                self._event("nudge", pod_id=role.pod.pod_id, ok=answer.ok, why=verdict.reason)
            except PeerError as exc:
                self._event("nudge_failed", pod_id=role.pod.pod_id, error=str(exc))

    async def _apply(self, plan: RoundPlan) -> None:
        ctrl, inst = self.ctrl, self.inst
        await self._write_ahead("before apply")
        ctrl.crash_point("before_apply")
        try:
            await ctrl.view(inst, overlay.withdraw(inst.publication.published), request_id=self.request_id)
        except PeerError as exc:
            raise RoundFailedError(f"DEL of the published view failed: {exc}") from exc
        self._set(rt.begin_apply(inst.runtime))
        try:
            await ctrl.persist(inst, required=True)
        except (StoreUnavailableError, FtStoreError) as exc:
            raise RoundFailedError(f"write-ahead (apply) failed: {exc}") from exc
        ctx = inst.runtime.context
        assert ctx is not None
        await self._dispatch(plan, removed=ctx.removed_dp_ranks)
        ctrl.crash_point("after_apply")
        self._stage("apply")

    async def _dispatch(self, plan: RoundPlan, *, removed: frozenset[int]) -> None:
        """One apply per routable NodeManager, all at once, bounded by ``apply_dispatch_budget_sec``
        (``dispatch.py``: vLLM 0.34's rendezvous needs every survivor to get the round's id within 10 s)."""
        targets = [
            Target(
                pod_id=role.pod.pod_id,
                url=role.pod.node_manager_url,
                body=apply_request(plan, role, request_id=self.request_id, removed=removed),
            )
            for role in plan.routable
        ]
        await dispatch(self.ctrl, self.request_id, targets, budget_sec=self.timings.apply_dispatch_budget_sec)

    async def _until_recovered(self, plan: RoundPlan) -> None:
        clock = self.ctrl.clock
        limits = PollLimits(
            deadline=clock.monotonic() + self.timings.execution_deadline_sec,
            max_transient_query_errors=self.ctrl.ft.max_transient_query_errors,
        )
        ctx = self.inst.runtime.context
        assert ctx is not None
        pause = poll_pauses(self.timings.poll_interval_sec)
        while True:
            await self.ctrl.clock.sleep(next(pause))  # the poll period; the first polls come sooner (see poll_pauses)
            entries = await self._statuses(plan)
            verdict = readiness.after_apply(
                entries, survivors=ctx.survivors, request_id=self.request_id, limits=limits, now=clock.monotonic()
            )
            limits = PollLimits(
                deadline=limits.deadline,
                max_transient_query_errors=limits.max_transient_query_errors,
                transient_errors=verdict.transient_errors,
            )
            if verdict.verdict == "commit":
                self._set(rt.engines_recovered(self.inst.runtime))
                self._stage("recovered")
                return
            if verdict.verdict == "fail":
                raise RoundFailedError(f"after apply: {verdict.reason}", terminal=verdict.terminal)

    async def _probe(self, plan: RoundPlan) -> None:
        """F-52: one real completion per survivor, sent by its own NodeManager; identity unchanged. Every pod is
        probed at once (a probe is a completion: the round waits for the slowest pod, not the sum); the answers
        are judged in the pods' order."""

        async def one(role: NodeManagerRole) -> ProbeResponse | PeerError:
            body = ProbeRequest(
                request_id=self.request_id,
                endpoint_ids=sorted(role.survivors),
                timeout_sec=self.ctrl.ft.probe_timeout_sec,
            )
            try:
                return await self.ctrl.nm.probe(role.pod.node_manager_url, body)
            except PeerError as exc:
                return exc

        answers = await asyncio.gather(*(one(role) for role in plan.routable))
        for role, answer in zip(plan.routable, answers, strict=True):
            if isinstance(answer, PeerError):
                self._event("probe_failed", pod_id=role.pod.pod_id, error=str(answer))
                raise RoundFailedError(f"completion probe failed on pod {role.pod.pod_id}: {answer}") from answer
            for result in answer.results:
                before = self.identities.get(result.endpoint_id)
                changed = before is not None and result.identity is not None and result.identity != before
                self._event(
                    "probe",
                    endpoint_id=result.endpoint_id,
                    ok=result.ok,
                    latency_sec=result.latency_sec,
                    identity_changed=changed,
                )
                if not result.ok:
                    raise RoundFailedError(f"completion probe of rank {result.endpoint_id} failed: {result.detail}")
                if changed:
                    raise RoundFailedError(f"rank {result.endpoint_id} was restarted during the round")
        self._stage("probe")

    async def _commit(self) -> None:
        ctrl, inst = self.ctrl, self.inst
        ctx = inst.runtime.context
        assert ctx is not None
        retired = sorted(ctx.removed_dp_ranks)
        body = FinalizeRequest(request_id=self.request_id, commit=True, retired_endpoint_ids=retired)
        waiting = {pod.pod_id: pod for pod in inst.topology.pods}
        for attempt in range(ctrl.ft.commit_attempts):
            for pod_id, pod in list(waiting.items()):
                try:
                    answer = await ctrl.nm.finalize(pod.node_manager_url, body)
                except PeerError as exc:
                    self._event("finalize_failed", pod_id=pod_id, commit=True, attempt=attempt + 1, error=str(exc))
                    continue
                self.committed = True  # at least one NodeManager committed: nothing rolls back from here
                waiting.pop(pod_id)
                self._event("finalize", pod_id=pod_id, commit=True, repeated=answer.repeated, retired=retired)
            if not waiting:
                break
            await self.ctrl.clock.sleep(self.timings.poll_interval_sec)  # between commit attempts (F-57)
        ctrl.crash_point("after_node_manager_commit")
        if waiting:
            if not self.committed:
                raise RoundFailedError(f"no NodeManager acknowledged finalize(commit): {sorted(waiting)}")
            self.committed = True
            error = f"NodeManagers {sorted(waiting)} never acknowledged finalize(commit)"
            self._set(rt.node_manager_lost(inst.runtime, error))
            await ctrl.persist(inst, required=False)
            self._outcome("failed")
            await ctrl.run_fallback(inst, rt.FallbackStrategy.INSTANCE_RECONFIGURATION)
            return
        self._set(rt.record_commit(inst.runtime))
        ctrl.reset_evidence(inst)
        await ctrl.persist(inst, required=False)
        self._report_persist_failure()
        ctrl.crash_point("after_commit_persisted")
        await self._stop_recyclable_pods()
        self._set(rt.finish_round(inst.runtime))
        self._stage("commit")
        ctrl.history.mark(self.request_id, "committed_at")
        await ctrl.persist(inst, required=False)
        ctrl.crash_point("after_round_persisted")
        try:
            await ctrl.view(inst, overlay.publish(inst.runtime), request_id=self.request_id)
            self._set(rt.publish_result(inst.runtime, ok=True))
            ctrl.history.mark(self.request_id, "serving_resumed_at")
            self._report_persist_failure()
        except PeerError as exc:
            self._set(rt.post_commit_error(inst.runtime, f"ADD failed: {exc}", publish_failed=True))
        self._stage("publish")
        self._outcome("committed")
        total = ctrl.clock.monotonic() - ctx.decided_at
        ctrl.metrics.stage_seconds.labels(stage="round_total").observe(total)
        ctrl.history.stage(self.request_id, "round_total", total)
        _log.info(
            "round.committed",
            request_id=self.request_id,
            instance_id=inst.instance_id,
            dead_committed=sorted(inst.runtime.dead_committed),
            seconds=round(total, 3),
        )

    def _report_persist_failure(self) -> None:
        """F-50: after commit a store failure never aborts; it shows in ``last_error`` until a retried
        persist (the view-refresh loop) succeeds."""
        if self.inst.persistence.pending:
            error = f"persist after commit failed (retrying): {self.ctrl.store_error}"
            self._set(rt.post_commit_error(self.inst.runtime, error))
            self.inst.persistence.mark_error_shown()

    async def _stop_recyclable_pods(self) -> None:
        """F-26 / A5-A7: only with enable_dp_scale_up, only fully committed pods, once, best effort."""
        inst = self.inst
        for pod_id in recyclable_pods(
            inst.topology,
            dead_committed=inst.runtime.dead_committed,
            already_stopped=inst.relaunches.stopped_pods,
            enable_dp_scale_up=self.ctrl.ft.enable_dp_scale_up,
        ):
            inst.relaunches.pod_stopped(pod_id)
            pod = next(p for p in inst.topology.pods if p.pod_id == pod_id)
            try:
                await self.ctrl.nm.stop_engines(pod.node_manager_url, EnginesStopRequest())
                self._event("pod_stop", pod_id=pod_id, ok=True)
            except PeerError as exc:  # never retried by us; the cluster reclaims the pod
                self._event("pod_stop", pod_id=pod_id, ok=False, error=str(exc))

    def _outcome(self, outcome: str) -> None:
        self.ctrl.history.finish(self.request_id, outcome)
        self.ctrl.metrics.rounds.labels(kind="scale_down", outcome=outcome).inc()

    async def _fail(self, error: str, *, terminal: bool = False) -> None:
        ctrl, inst = self.ctrl, self.inst
        _log.warning(
            "round.failed", request_id=self.request_id, instance_id=inst.instance_id, error=error, terminal=terminal
        )
        self._event("failed", error=error, terminal=terminal)
        if inst.runtime.context is None:  # already handed to a fallback (lost NodeManager)
            return
        # terminal (vLLM 0.34: only a full restart helps): the pure core sends it to the whole-instance path
        self._set(rt.fail_round(inst.runtime, error, terminal=terminal))
        await ctrl.persist(inst, required=False)
        self._outcome("failed")
        fallback = inst.runtime.fallback or rt.FallbackStrategy.INSTANCE_RECONFIGURATION
        await ctrl.run_fallback(inst, fallback)
