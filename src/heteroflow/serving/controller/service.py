"""The controller shell: instance registry, FaultManager, strategy center, persistence and the serving view.

It holds the state the pure core (``core/``, ``docs/controller-core.md``) computes on: one :class:`Instance`
per serving instance with its :class:`FtRuntime` (the only thing persisted, F-32), the in-memory snapshot of
software evidence (never persisted, F-13), the hardware events, the running strategy and the view last
published to the Coordinator. Every phase change goes through a core function; this module only decides
*when* to call them and performs what they ask for (HTTP, store writes, publication).

Concurrency: one asyncio loop. Reports and registrations mutate state synchronously and notify the strategy
center (F-13); each strategy (a round, a fast recovery, a fallback) is one task per instance, and a new one
is never started while another runs for the same instance (the core's ``decide`` refuses it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace

import structlog

from heteroflow.contracts.serving import (
    FaultEvidence,
    HardwareFaultReport,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    SoftwareFaultReport,
    heartbeat_complete,
)
from heteroflow.core.clock import Clock
from heteroflow.core.errors import StoreUnavailableError
from heteroflow.serving.controller import (
    evidence,
    fallbacks,
    finalization,
    restore,
    round_clients,
    serving_view,
    trigger,
)
from heteroflow.serving.controller.clients import CoordinatorClient, NodeManagerClient
from heteroflow.serving.controller.config import ControllerConfig
from heteroflow.serving.controller.core import normalizer, overlay
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.decision import (
    Decision,
    DecisionInput,
    DecisionReason,
    MarkHardwareHandled,
    Reconfigure,
    RunningStrategy,
    StartFastRecovery,
    StartScaleDown,
    Wait,
    decide,
)
from heteroflow.serving.controller.core.errors import FtCoreError, TopologyError
from heteroflow.serving.controller.core.normalizer import (
    HardwareMapping,
)
from heteroflow.serving.controller.core.phase import ROUND_PHASES, FtPhase
from heteroflow.serving.controller.core.ranks import DpRank, InstanceId, RequestId
from heteroflow.serving.controller.core.topology import resolve_instance
from heteroflow.serving.controller.crash_hook import CRASH_EXIT_CODE
from heteroflow.serving.controller.fast_recovery import FastRecovery
from heteroflow.serving.controller.hardware_faults import record_hardware_fault
from heteroflow.serving.controller.history import RoundHistory
from heteroflow.serving.controller.instance import Instance, PodState
from heteroflow.serving.controller.metrics import ControllerMetrics
from heteroflow.serving.controller.pod_replacement import PodReplacement
from heteroflow.serving.controller.registration import check_reregistration, refresh_topology
from heteroflow.serving.controller.store import FtRuntimeStore, FtStoreError, NotLeaderError
from heteroflow.serving.controller.strategy import ScaleDownRound

_log = structlog.get_logger(__name__)


class UnknownInstanceError(Exception):
    """A report for an instance no NodeManager registered (HTTP 404)."""


class Controller:
    def __init__(
        self,
        *,
        config: ControllerConfig,
        store: FtRuntimeStore,
        node_managers: NodeManagerClient,
        coordinator: CoordinatorClient | None,
        clock: Clock,
        metrics: ControllerMetrics | None = None,
        exit_process: Callable[[int], None] = os._exit,
        pod_replacement: PodReplacement | None = None,
    ) -> None:
        self.config = config
        self.ft = config.ft
        self.store = store
        self.nm = node_managers
        self.coordinator = coordinator
        self.clock = clock
        self.metrics = metrics or ControllerMetrics()
        self.history = RoundHistory(clock)
        self.pod_replacement = pod_replacement
        """Deletes a pod for replacement (Kubernetes); ``None``: a fallback leaves ranks on faulty cards out."""
        self._exit_process = exit_process
        self.pods: dict[str, PodState] = {}
        self.instances: dict[InstanceId, Instance] = {}
        self.restored: dict[InstanceId, rt.Restored] = {}
        """Runtimes loaded from the store for instances whose NodeManagers have not all registered again yet."""
        self._revisions: dict[InstanceId, int] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.store_error: str | None = None
        self.started = False
        """:meth:`start` finished: the persisted runtimes are loaded, and the API may act."""
        self.on_not_leader: Callable[[str], None] | None = None
        """Called when a fenced write finds that this controller no longer leads (active/standby mode)."""

    # == lifecycle ===========================================================================================
    async def start(self, *, loops: bool = True) -> None:
        """Load the persisted runtimes (F-32) and start the strategy center and the view refresh."""
        await self.load_persisted()
        if loops:
            self._tasks.append(asyncio.create_task(self._strategy_center(), name="strategy-center"))
            self._tasks.append(asyncio.create_task(self._refresh_loop(), name="view-refresh"))
        self.started = True
        self.metrics.acting.set(1)

    async def load_persisted(self) -> None:
        try:
            loaded = await self.store.load_all()
        except (StoreUnavailableError, FtStoreError) as exc:
            # without the store we cannot know which ranks are committed: stay empty and say so; instances
            # registering now start fresh only after the store answers (see _ensure_instance)
            self.store_error = f"store unavailable at start: {exc}"
            _log.error("controller.store_load_failed", error=str(exc))
            return
        self.store_error = None
        for instance_id, reason in loaded.corrupt.items():
            _log.error("controller.store_record_corrupt", instance_id=instance_id, reason=reason)
        for instance_id, stored in loaded.records.items():
            self.restored[instance_id] = rt.restore(stored.record)
            self._revisions[instance_id] = stored.revision
            _log.info(
                "controller.runtime_restored",
                instance_id=instance_id,
                persisted_phase=stored.record.phase.value,
                phase=self.restored[instance_id].runtime.phase.value,
            )

    async def stop(self) -> None:
        """Stop acting: cancel the loops and every running strategy. Idempotent."""
        self.started = False
        self.metrics.acting.set(0)
        for task in self._tasks:
            task.cancel()
        for inst in self.instances.values():
            if inst.strategy.task is not None:
                inst.strategy.task.cancel()
        pending = [*self._tasks, *(i.strategy.task for i in self.instances.values() if i.strategy.task is not None)]
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def close(self) -> None:
        await self.stop()
        await self.nm.aclose()
        if self.coordinator is not None:
            await self.coordinator.aclose()
        await self.store.close()

    def crash_point(self, step: str) -> None:
        """The test-only hook of the crash-injection tests: die here, like a killed process."""
        if self.config.settings.crash_at_step == step:
            _log.warning("controller.crash_hook", step=step)
            self._exit_process(CRASH_EXIT_CODE)

    # == NodeManager routes ==================================================================================
    async def register(self, request: RegisterRequest) -> RegisterResponse:
        now = self.clock.monotonic()
        assembled = self.instances.get(InstanceId(request.instance_id))
        if assembled is not None:
            check_reregistration(assembled, request, replacing=frozenset(assembled.relaunches.replacing))
        self.pods[request.pod_id] = PodState(registration=request, last_seen=now)
        _log.info("controller.pod_registered", pod_id=request.pod_id, instance_id=request.instance_id)
        inst = await self._ensure_instance(InstanceId(request.instance_id))
        retired = sorted(inst.runtime.dead_committed) if inst is not None else None
        self._wake.set()
        return RegisterResponse(
            flags=self.ft.flags(),
            heartbeat_interval_sec=self.config.settings.heartbeat_interval_sec,
            retired_endpoint_ids=retired,
        )

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        pod = self.pods.get(request.pod_id)
        if pod is None or pod.registration.instance_id != request.instance_id:
            return HeartbeatResponse(register_again=True)
        pod.last_seen = self.clock.monotonic()
        pod.heartbeats += 1
        pod.heartbeat_complete = heartbeat_complete(
            reported=request.endpoint_ids,
            expected=request.expected_endpoint_ids,
            retired=request.retired_endpoint_ids,
            scale_down_enabled=self.ft.scale_down_enabled,
        )
        if request.engine_ranks:
            pod.engine_ranks = {e.endpoint_id: e for e in request.engine_ranks}
        return HeartbeatResponse(flags=self.ft.flags())

    def report(self, report: SoftwareFaultReport) -> bool:
        """Fold one report into the snapshot and notify the strategy center; ``False``: not used (a pod of an
        instance that is not assembled yet)."""
        inst = self.instances.get(InstanceId(report.instance_id))
        if inst is None:
            if any(p.registration.instance_id == report.instance_id for p in self.pods.values()):
                return False
            raise UnknownInstanceError(f"instance {report.instance_id!r} is not registered")
        self.metrics.reports.labels(evidence=report.evidence.value).inc()
        now = self.clock.monotonic()
        before = inst.evidence.snapshot
        inst.evidence.snapshot = normalizer.observe(
            inst.evidence.snapshot, report, now=now, dead_committed=inst.runtime.dead_committed
        )
        if report.endpoint_id not in inst.runtime.dead_committed:
            inst.evidence.engine_statuses[report.endpoint_id] = report.status
        # a diagnosing engine answers new requests 503 too (vLLM 0.34): out of the view like the others
        if inst.evidence.snapshot is not before and report.status in ("diagnosing", "unhealthy", "dead"):
            self.withdraw_faulted(inst, DpRank(report.endpoint_id))
            if report.evidence == FaultEvidence.FT_UNREACHABLE:
                inst.evidence.unreachable[DpRank(report.endpoint_id)] = report.identity
        self.history.add(
            inst.runtime.request_id if inst.strategy.running else None,
            "evidence",
            endpoint_id=report.endpoint_id,
            status=report.status,
            evidence=report.evidence.value,
            pod_id=report.pod_id,
        )
        _log.info(
            "controller.fault_reported",
            instance_id=inst.instance_id,
            endpoint_id=report.endpoint_id,
            status=report.status,
            evidence=report.evidence.value,
            changed=inst.evidence.snapshot is not before,
        )
        self._wake.set()
        return True

    def withdraw_faulted(self, inst: Instance, rank: DpRank) -> None:
        serving_view.withdraw_faulted(self, inst, rank)

    def withdraw_evidence(self, inst: Instance, rank: DpRank, *, why: str) -> None:
        """Forget ``rank``'s DEAD-by-unreachability before any round started, and publish it again."""
        if inst.strategy.running is not None or inst.runtime.phase in ROUND_PHASES:
            return
        inst.evidence.snapshot = normalizer.forget(inst.evidence.snapshot, rank)
        inst.evidence.unreachable.pop(rank, None)
        inst.evidence.engine_statuses.pop(rank, None)
        self.history.add(None, "evidence_withdrawn", endpoint_id=rank, reason=why)
        _log.info("controller.evidence_withdrawn", instance_id=inst.instance_id, endpoint_id=rank, reason=why)
        if rank in inst.publication.fault_withdrawn:
            inst.publication.fault_withdrawn = inst.publication.fault_withdrawn - {rank}
            self.spawn(self.refresh_view(inst), name=f"republish-{inst.instance_id}-{rank}")
        self._wake.set()

    def hardware_fault(self, report: HardwareFaultReport) -> dict[str, HardwareMapping]:
        """F-3 / F-12: map one hardware fault onto every assembled instance and keep it where it matters."""
        results = record_hardware_fault(
            self.instances.values(), report, now=self.clock.monotonic(), metrics=self.metrics, history=self.history
        )
        if report.cleared:
            for inst in self.instances.values():
                self._resume_refused(inst)
        self._wake.set()
        return results

    def _resume_refused(self, inst: Instance) -> None:
        """A fallback that refused to relaunch (ranks on faulty cards) runs again once a standing fault clears."""
        plan = inst.relaunches.refused
        fallback = inst.runtime.fallback
        if plan is None or inst.strategy.running is not None or inst.runtime.phase != FtPhase.RECONFIGURING:
            return
        if fallback is None or all(key in inst.standing.faults for key in plan.faults):
            return  # none of the faults that refused it has cleared: the plan would be the same
        inst.relaunches.plan = None
        self.history.add(None, "relaunch_resumed", faults=[k for k in plan.faults if k not in inst.standing.faults])
        _log.info("controller.relaunch_resumed", instance_id=inst.instance_id)
        self._start(inst, "fallback", self.run_fallback(inst, fallback))

    # == instances ===========================================================================================
    async def _ensure_instance(self, instance_id: InstanceId) -> Instance | None:
        regs = [p.registration for p in self.pods.values() if p.registration.instance_id == instance_id]
        existing = self.instances.get(instance_id)
        if existing is not None:
            refresh_topology(existing, regs)
            return existing
        try:
            topology = resolve_instance(regs)
        except TopologyError as exc:
            _log.info("controller.instance_incomplete", instance_id=instance_id, detail=str(exc))
            return None
        restored = self.restored.pop(instance_id, None)
        if restored is not None and restored.runtime.original_dp_ranks == topology.original_dp_ranks:
            runtime = restored.runtime
            inst = Instance(instance_id=instance_id, topology=topology, runtime=runtime)
            inst.persistence.revision = self._revisions.get(instance_id)
            inst.strategy.pending_abort = restored.abort_request_id
            inst.strategy.pending_fallback = restored.run_fallback
            runtime = self._align_feature(runtime)
            inst.runtime = runtime
            if runtime is not restored.runtime:
                inst.persistence.pending = True
        else:
            if restored is not None:
                _log.warning(
                    "controller.stored_topology_differs",
                    instance_id=instance_id,
                    stored=sorted(restored.runtime.original_dp_ranks),
                    registered=sorted(topology.original_dp_ranks),
                )
            runtime = rt.new_runtime(instance_id, topology.original_dp_ranks, enabled=self.ft.scale_down_enabled)
            inst = Instance(instance_id=instance_id, topology=topology, runtime=runtime)
            inst.persistence.revision = self._revisions.get(instance_id)
            inst.persistence.pending = True
        self.instances[instance_id] = inst
        await self.persist(inst, required=False)
        self.metrics.set_phase(instance_id, inst.runtime.phase)
        _log.info(
            "controller.instance_assembled",
            instance_id=instance_id,
            phase=inst.runtime.phase.value,
            dead_committed=sorted(inst.runtime.dead_committed),
            pods=[p.pod_id for p in topology.pods],
        )
        if inst.strategy.pending_abort is not None or inst.strategy.pending_fallback is not None:
            self._start(inst, "fallback", finalization.resume_after_restart(self, inst))
        return inst

    def _align_feature(self, runtime: rt.FtRuntime) -> rt.FtRuntime:
        """The configured switch wins over a stored DISABLED/NORMAL (only those two can switch, F-30)."""
        if runtime.phase in (FtPhase.DISABLED, FtPhase.NORMAL):
            return rt.set_feature(runtime, enabled=self.ft.scale_down_enabled)
        return runtime

    def set_runtime(self, inst: Instance, runtime: rt.FtRuntime) -> None:
        if runtime.phase != inst.runtime.phase:
            self.history.add(
                runtime.request_id or inst.runtime.request_id,
                "phase",
                **{"from": inst.runtime.phase.value, "to": runtime.phase.value},
            )
            _log.info(
                "controller.phase",
                instance_id=inst.instance_id,
                request_id=runtime.request_id,
                phase=runtime.phase.value,
                previous=inst.runtime.phase.value,
            )
        inst.runtime = runtime
        self.metrics.set_phase(inst.instance_id, runtime.phase)

    async def persist(self, inst: Instance, *, required: bool) -> None:
        """Write F-32's subset with compare-and-swap. ``required``: raise on failure (F-50's write-ahead);
        otherwise remember to retry and carry on."""
        async with inst.persistence.lock:
            await self._persist_locked(inst, required=required)

    async def _persist_locked(self, inst: Instance, *, required: bool) -> None:
        record = rt.persisted(inst.runtime)  # the runtime as it is now, after any write we waited for
        try:
            inst.persistence.revision = await self.store.put(record, expected_revision=inst.persistence.revision)
        except (StoreUnavailableError, FtStoreError) as exc:
            if isinstance(exc, NotLeaderError) and self.on_not_leader is not None:
                self.on_not_leader(str(exc))
            inst.persistence.pending = True
            self.store_error = f"{type(exc).__name__}: {exc}"
            self.metrics.store_errors.inc()
            _log.error("controller.persist_failed", instance_id=inst.instance_id, error=str(exc), required=required)
            if required:
                raise
            return
        inst.persistence.pending = False
        self.store_error = None
        if inst.persistence.error_shown:
            inst.persistence.error_shown = False
            self.set_runtime(inst, replace(inst.runtime, last_error=None))

    def reset_evidence(self, inst: Instance) -> None:
        """Forget the snapshot and the hardware events: a round committed or the instance was rebuilt."""
        inst.evidence.reset()
        inst.collection.evidence_reset()
        inst.publication.fault_withdrawn = frozenset()

    # == strategy center (F-10…F-13) =========================================================================
    async def _strategy_center(self) -> None:
        while True:
            now = self.clock.monotonic()
            timeout = self.ft.strategy_center_check_interval
            wakes = [i.strategy.wake_at for i in self.instances.values() if i.strategy.wake_at is not None]
            if wakes:
                timeout = max(0.0, min(timeout, min(wakes) - now))
            await self.clock.wait_for(self._wake, timeout)
            self._wake.clear()
            self.decide_all()

    def decide_all(self) -> None:
        for inst in list(self.instances.values()):
            try:
                self.decide_instance(inst)
            except FtCoreError as exc:  # a bug in the shell's use of the core: say so, keep the others going
                _log.exception("controller.decide_failed", instance_id=inst.instance_id, error=str(exc))

    def decide_instance(self, inst: Instance) -> Decision:
        now = self.clock.monotonic()
        decision = decide(
            DecisionInput(
                runtime=inst.runtime,
                snapshot=inst.evidence.snapshot,
                hardware=tuple(inst.evidence.hardware),
                running=inst.strategy.running,
                fast_recovery_applicable=(
                    self.ft.scale_down_enabled
                    and self.ft.enable_fast_recovery
                    and inst.topology.capability.retry_supported  # the engines know retry
                ),
                original_fallback=self.config.instance(inst.instance_id).fallback,
                timings=self.ft.decision_timings(),
            ),
            now=now,
        )
        said = f"{decision.kind}:{decision.reason.value}"
        if said != inst.strategy.last_decision:
            _log.info("controller.decision", instance_id=inst.instance_id, decision=said)
        inst.strategy.last_decision = said
        inst.strategy.wake_at = decision.until if isinstance(decision, Wait) else None
        if isinstance(decision, StartScaleDown | Reconfigure | StartFastRecovery):
            # before the strategy resets the evidence: its round keeps what the decision saw
            inst.strategy.trigger = trigger.capture(self.clock, inst, decision=said, reason=decision.reason.value)
        if isinstance(decision, StartScaleDown):
            context = rt.ScaleDownContext(
                request_id=RequestId(f"sd-{uuid.uuid4().hex[:16]}"),
                instance_id=inst.instance_id,
                generation=inst.runtime.generation,
                candidates=decision.candidates,
                survivors=decision.survivors,
                dead_committed_at_start=inst.runtime.dead_committed,
                fallback=decision.fallback,
                decided_at=now,
                hardware_matched=decision.hardware_matched,
                hardware_keys=decision.hardware_keys,
            )
            self._start(inst, "scale_down", ScaleDownRound(self, inst, context).run())
        elif isinstance(decision, Reconfigure):
            self.set_runtime(
                inst, rt.start_reconfiguration(inst.runtime, decision.fallback, f"{decision.reason.value}")
            )
            self._start(inst, "fallback", self.run_fallback(inst, decision.fallback))
        elif isinstance(decision, StartFastRecovery):
            self._start(inst, "fast_recovery", FastRecovery(self, inst).run())
        elif isinstance(decision, MarkHardwareHandled):
            inst.evidence.hardware = [e for e in inst.evidence.hardware if e.fault.key not in decision.keys]
            self._wake.set()
        elif isinstance(decision, Wait) and decision.reason in (
            DecisionReason.COLLECTING,
            DecisionReason.CORRELATION_WINDOW,  # a hardware-first window waits for the same evidence (F-12)
        ):
            evidence.collect_missing(self, inst)
            evidence.recheck_unreachable(self, inst)
            evidence.nudge_idle(self, inst)
        return decision

    def wake(self) -> None:
        """Have the strategy center decide again now (every report, collection and finished strategy does)."""
        self._wake.set()

    def spawn(self, work: Coroutine[object, object, None], *, name: str) -> None:
        """A side task the controller cancels on close; finished ones are dropped as new ones start."""
        self._tasks = [task for task in self._tasks if not task.done()]
        self._tasks.append(asyncio.create_task(work, name=name))

    def _start(self, inst: Instance, kind: RunningStrategy, work: Awaitable[None]) -> None:
        inst.strategy.running = kind
        before = {r.request_id for r in self.history.for_instance(inst.instance_id)}

        async def run() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the strategy is a side path of the center: log it, never kill the loop
                _log.exception("controller.strategy_crashed", instance_id=inst.instance_id, kind=kind, error=str(exc))
            else:  # what clients saw during the rounds this strategy ran (the Coordinator counts it)
                rounds = self.history.for_instance(inst.instance_id)
                round_clients.ask_after(self, inst, [r.request_id for r in rounds if r.request_id not in before])
            finally:
                inst.strategy.running = None
                inst.strategy.task = None
                self._wake.set()

        inst.strategy.task = asyncio.create_task(run(), name=f"{kind}-{inst.instance_id}")

    # == fallbacks (F-14) ====================================================================================
    async def finalize_everywhere(
        self, inst: Instance, request_id: str, *, commit: bool, retired: frozenset[DpRank]
    ) -> dict[str, bool]:
        return await finalization.finalize_everywhere(
            nm=self.nm, history=self.history, inst=inst, request_id=request_id, commit=commit, retired=retired
        )

    async def run_fallback(self, inst: Instance, fallback: rt.FallbackStrategy) -> None:
        await fallbacks.run_fallback(self, inst, fallback)

    # == capacity back (restore.py) ==========================================================================
    def restore(self, instance_id: str, *, requested_by: str = "operator") -> str:
        """Start a restore of a scaled-down instance to its configured size; its request id. Raises
        :class:`UnknownInstanceError` or :class:`~.restore.RestoreRefusedError`."""
        inst = self.instances.get(InstanceId(instance_id))
        if inst is None:
            raise UnknownInstanceError(f"instance {instance_id!r} is not registered")
        lost_after = self.config.settings.pod_lost_after_sec
        request_id = restore.begin(self, inst, requested_by=requested_by, pod_lost_after_sec=lost_after)
        self._start(inst, "restore", restore.run(self, inst, request_id))
        return request_id

    def _auto_restore(self) -> None:
        for inst in list(self.instances.values()):
            if restore.auto_due(self, inst, pod_lost_after_sec=self.config.settings.pod_lost_after_sec):
                with contextlib.suppress(restore.RestoreRefusedError):
                    self.restore(inst.instance_id, requested_by="auto_restore")

    # == serving view (F-40) =================================================================================
    def model_of(self, inst: Instance) -> str:
        return self.config.instance(inst.instance_id).model or self.config.settings.default_model

    async def view(self, inst: Instance, op: overlay.CoordinatorOp, *, request_id: str | None = None) -> None:
        await serving_view.send(self, inst, op, request_id=request_id)

    async def refresh_view(self, inst: Instance, *, by_strategy: bool = False) -> None:
        await serving_view.refresh(self, inst, by_strategy=by_strategy)

    async def _refresh_loop(self) -> None:
        while True:
            for inst in list(self.instances.values()):
                if inst.persistence.pending:  # F-50: a failed write is retried until the store answers again
                    await self.persist(inst, required=False)
                await self.refresh_view(inst)
            self._auto_restore()
            await self.clock.sleep(self.ft.serving_view_refresh_sec)  # the SET's own period

    def in_round(self, instance_id: str) -> bool:
        inst = self.instances.get(InstanceId(instance_id))
        return inst is not None and inst.runtime.phase in ROUND_PHASES
