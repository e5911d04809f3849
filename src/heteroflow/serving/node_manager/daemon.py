"""The NodeManager daemon: the thin shell around the pure cores of this package.

It owns one pod's engines (through the :class:`~.supervisor.ProcessSupervisor`; the worlds they were launched
into, and the stop/start/restart routes' work, in :class:`~.lifecycle.EngineLifecycle`), polls their FT status
(EngineFtManager, decisions in ``ft_manager.py``), reports evidence and heartbeats to the controller, and
executes the controller's FT commands (EngineFtService, decisions in ``service.py``). Every FT state change
goes through one pure transition on the frozen :class:`~.service.FtServiceState`; transitions never await,
so the event loop serialises them without a lock.

Loops (each a task, each step also callable directly so tests never wait on the real clock):
``supervise_once`` (F-2 deaths, suicide handling), ``poll_once`` per ready engine (F-1),
``watch_retired_once`` (F-53), ``controller_once`` (registration, heartbeat, the report outbox). Between
steps the loops wait through the injected :class:`~heteroflow.core.clock.Clock`, never on the loop's own timers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

import structlog

from heteroflow.contracts.engine_protocol import ApplyParams, ApplyRequest, EngineProfile
from heteroflow.contracts.serving import (
    EndpointFtStatus,
    EngineApplyResult,
    EnginesResponse,
    EnginesStartRequest,
    FaultEvidence,
    FinalizeRequest,
    FinalizeResponse,
    FtStatusRequest,
    FtStatusResponse,
    GuardRequest,
    GuardResponse,
    HeartbeatRequest,
    NmApplyRequest,
    NmApplyResponse,
    ProbeRequest,
    ProbeResponse,
    RegisterRequest,
    SoftwareFaultReport,
)
from heteroflow.core.clock import Clock, sleep_until
from heteroflow.serving.node_manager import commands, service
from heteroflow.serving.node_manager.client import ControllerClient
from heteroflow.serving.node_manager.controller_link import ControllerLink, registration_request
from heteroflow.serving.node_manager.controller_link import PodIdentity as PodIdentity
from heteroflow.serving.node_manager.engines import (
    ElasticEpReading,
    EngineCallError,
    EngineClient,
    EnginePausedError,
    EngineProtocolError,
    EngineUnreachableError,
)
from heteroflow.serving.node_manager.ft_manager import (
    Answered,
    Finding,
    Observation,
    Paused,
    PollState,
    ProtocolFailure,
    Unreachable,
    observe,
    revived,
)
from heteroflow.serving.node_manager.lifecycle import EngineLifecycle
from heteroflow.serving.node_manager.service import FtServiceError, FtServiceState
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.spec import (
    InstanceSpec,
)
from heteroflow.serving.node_manager.status import FencingViolation, NodeManagerStatus, endpoint_status, pod_status
from heteroflow.serving.node_manager.supervisor import EngineExit, ProcessLauncher, ProcessSupervisor

_log = structlog.get_logger(__name__)


class ProxyDisabledError(Exception):
    """HTTP 404: ``enable_dp_scale_down_proxy`` is false (or the controller has not registered us yet)."""


class UnknownEndpointError(FtServiceError):
    """HTTP 400: an endpoint id this pod does not run, or a rank outside the instance."""

    code = "unknown_endpoint"


class NodeManager:
    def __init__(
        self,
        *,
        spec: InstanceSpec,
        settings: NodeManagerSettings,
        pod: PodIdentity,
        controller: ControllerClient,
        engines: EngineClient,
        launcher: ProcessLauncher,
        clock: Clock,
        on_suicide: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.pod = pod
        self._link = ControllerLink(
            controller=controller,
            heartbeat_interval_sec=settings.heartbeat_interval_sec,
            is_retired=lambda endpoint_id: endpoint_id in self._state.retired,
        )
        self._engines = engines
        self._clock = clock
        self._on_suicide = on_suicide
        self.supervisor = ProcessSupervisor(launcher, stopped_dead_sec=settings.engine_stopped_dead_sec)
        self._state = FtServiceState(retired=frozenset(spec.dead_ranks))
        self._lifecycle = EngineLifecycle(
            spec=spec,
            pod_ip=pod.pod_ip,
            cluster_token=settings.cluster_token,
            supervisor=self.supervisor,
            engines=engines,
            stop_grace_sec=settings.engine_stop_grace_sec,
            is_retired=lambda endpoint_id: endpoint_id in self._state.retired,
            on_launch=self._launched_fresh,
            clock=clock,
        )
        self._polls: dict[int, PollState] = {eid: PollState() for eid in spec.endpoint_ids}
        self._dead_since: dict[int, float] = {}
        self._commands: dict[int, commands.CommandTrack] = {}
        """The current round's command per endpoint, by the id the engine tracks it by."""
        self._discovery_errors: dict[int, str] = {}
        self._violations: list[FencingViolation] = []
        self._suicide_reason: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.exit_requested = asyncio.Event()

    # == lifecycle =========================================================================================
    async def start(self, *, launch: bool = True, loops: bool = True) -> None:
        if launch:
            self.launch_engines()
        if loops:
            self._tasks.append(
                asyncio.create_task(self._every(self.settings.supervisor_interval_sec, self.supervise_once))
            )
            self._tasks.append(asyncio.create_task(self._controller_loop()))
            for endpoint_id in sorted(self.spec.endpoint_ids):
                self._tasks.append(asyncio.create_task(self._endpoint_loop(endpoint_id)))

    async def close(self) -> None:
        """Stop the loops and every engine this NodeManager started (SIGKILL; nothing outlives us)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await asyncio.to_thread(self.supervisor.stop_all, grace_sec=0)
        await self._engines.aclose()
        await self._link.aclose()

    def launch_engines(self, endpoint_ids: Iterable[int] | None = None) -> list[int]:
        """Start the given (default: every) local endpoint that is not retired and not running."""
        return self._lifecycle.launch(self.spec.endpoint_ids if endpoint_ids is None else endpoint_ids)

    def _launched_fresh(self, endpoint_id: int) -> None:
        """A new engine of ``endpoint_id`` started: nothing of the one before applies to it."""
        self._polls[endpoint_id] = PollState()
        self._commands.pop(endpoint_id, None)  # a new engine knows no earlier command
        self._dead_since.pop(endpoint_id, None)

    # == F-2: process deaths and the suicide handling ======================================================
    async def supervise_once(self) -> list[EngineExit]:
        now = self._clock.monotonic()
        exits = self.supervisor.check(now=now)
        for death in exits:
            self._dead_since.setdefault(death.endpoint_id, now)
            _log.warning("engine.dead", endpoint_id=death.endpoint_id, detail=death.detail)
            self._link.enqueue(
                SoftwareFaultReport(
                    instance_id=self.spec.instance_id,
                    pod_id=self.pod.pod_id,
                    endpoint_id=death.endpoint_id,
                    status="dead",
                    evidence=FaultEvidence.ENGINE_DEAD,
                    detail=death.detail,
                    identity=death.identity,
                    exit_code=death.exit_code,
                    observed_at=self._clock.now(),
                )
            )
        if exits:
            await self.flush_reports()
        await self._maybe_suicide()
        return exits

    async def _maybe_suicide(self) -> None:
        if not self.settings.engine_death_suicide or self._suicide_reason is not None:
            return
        if self._lifecycle.busy:  # the controller is stopping or starting our engines: it took them over
            return
        due = service.suicide_due(
            dead_since=self._dead_since,
            state=self._state,
            now=self._clock.monotonic(),
            grace_sec=self.settings.engine_death_suicide_grace_sec,
        )
        if not due:
            return
        self._suicide_reason = f"local engine(s) {list(due)} dead and no round took them over"
        _log.error("node_manager.suicide", reason=self._suicide_reason)
        await asyncio.to_thread(self.supervisor.stop_all, grace_sec=0)
        if self._on_suicide is not None:
            self._on_suicide(self._suicide_reason)
        self.exit_requested.set()

    # == F-1: the EngineFtManager ==========================================================================
    async def _observe(self, endpoint_id: int) -> Observation:
        try:
            entry = await self._engines.status(endpoint_id, timeout_sec=self.settings.engine_ft_status_timeout_sec)
        except EngineUnreachableError as exc:
            return Unreachable(str(exc))
        except EnginePausedError as exc:
            return Paused(str(exc))
        except EngineProtocolError as exc:
            return ProtocolFailure(str(exc))
        # read for the current round: the engine's own command id becomes the round's, outcomes are kept
        tracked, entry = commands.correlate(self._commands.get(endpoint_id), entry)
        if tracked is not None:
            self._commands[endpoint_id] = tracked
        return Answered(entry)

    async def poll_once(self, endpoint_id: int) -> Finding | None:
        """One status poll of a ready engine; the report it caused, if any."""
        observation = await self._observe(endpoint_id)
        state, finding = observe(self._polls[endpoint_id], observation)
        self._polls[endpoint_id] = state
        if finding is None or endpoint_id in self._state.retired:
            return None
        _log.warning("engine.ft_status", endpoint_id=endpoint_id, status=finding.status, detail=finding.detail)
        self._link.enqueue(
            SoftwareFaultReport(
                instance_id=self.spec.instance_id,
                pod_id=self.pod.pod_id,
                endpoint_id=endpoint_id,
                status=finding.status,
                evidence=finding.evidence,
                fault_info=finding.fault_info,
                detail=finding.detail,
                engine_status=finding.entry,
                identity=self.supervisor.identity(endpoint_id),
                observed_at=self._clock.now(),
            )
        )
        await self.flush_reports()
        return finding

    async def watch_elastic_ep_once(self, endpoint_id: int) -> ElasticEpReading | None:
        """Whether elastic EP resized the ready engine's world (:meth:`~.lifecycle.EngineLifecycle.watch_resize`)."""
        return await self._lifecycle.watch_resize(endpoint_id, timeout_sec=self.settings.engine_ft_status_timeout_sec)

    async def check_ready(self, endpoint_id: int) -> bool:
        if self.supervisor.ready(endpoint_id):
            return True
        if self.supervisor.running(endpoint_id) and await self._engines.ready(endpoint_id):
            await self._discover(endpoint_id)
            self.supervisor.mark_ready(endpoint_id)
            return True
        return False

    async def _discover(self, endpoint_id: int) -> None:
        """At the engine's first readiness: which FT profile it speaks (once; pinned profiles need nothing)."""
        if self._engines.profile_of(endpoint_id) is not None:
            return
        try:
            found = await self._engines.discover(endpoint_id, timeout_sec=self.settings.engine_ft_status_timeout_sec)
        except EngineCallError as exc:
            self._discovery_errors[endpoint_id] = str(exc)
            _log.warning("engine.profile_unknown", endpoint_id=endpoint_id, error=str(exc))
            return
        self._discovery_errors.pop(endpoint_id, None)
        _log.info("engine.profile_discovered", endpoint_id=endpoint_id, profile=found.name)

    def discovered_profile(self) -> EngineProfile | None:
        """The profile every local engine speaks, when known; ``None`` while unknown (or when they differ,
        which registration reports as the weakest: see :meth:`registration`)."""
        profiles = {p.name: p for eid in self.spec.endpoint_ids if (p := self._engines.profile_of(eid)) is not None}
        return next(iter(profiles.values())) if len(profiles) == 1 else None

    async def watch_retired_once(self, endpoint_id: int) -> FencingViolation | None:
        """F-53: a retired rank must stay dead or silent; one that answers is fenced and recorded."""
        observation = await self._observe(endpoint_id)
        if not revived(observation):
            return None
        fenced = await asyncio.to_thread(self.supervisor.fence, endpoint_id)
        detail = observation.entry.status if isinstance(observation, Answered) else "answered off-protocol"
        violation = FencingViolation(
            endpoint_id=endpoint_id,
            detail=f"retired rank answered again ({detail})",
            fenced=fenced,
            at_monotonic=self._clock.monotonic(),
        )
        self._violations.append(violation)
        _log.error("engine.fencing_violation", endpoint_id=endpoint_id, detail=violation.detail, fenced=fenced)
        return violation

    async def _endpoint_loop(self, endpoint_id: int) -> None:
        while True:
            try:
                await self._endpoint_step(endpoint_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # a loop must outlive any one bad step; the next step retries
                _log.exception("node_manager.poll_step_failed", endpoint_id=endpoint_id)
                await self._clock.sleep(self.settings.engine_ft_poll_interval_sec)

    async def _endpoint_step(self, endpoint_id: int) -> None:
        interval = self.settings.engine_ft_poll_interval_sec
        if endpoint_id in self._state.retired:
            await self.watch_retired_once(endpoint_id)
            await self._clock.sleep(self.settings.retired_watch_interval_sec)
        elif not self.supervisor.running(endpoint_id) or not await self.check_ready(endpoint_id):
            await self._clock.sleep(min(interval, 0.2))
        else:
            started = self._clock.monotonic()
            await self.poll_once(endpoint_id)
            await self.watch_elastic_ep_once(endpoint_id)  # the same cadence: one more read per poll, where enabled
            await sleep_until(self._clock, started + interval)

    # == the controller ====================================================================================
    def registration(self) -> RegisterRequest:
        ids = sorted(self.spec.endpoint_ids)
        profiles = [self._engines.profile_of(eid) for eid in ids]
        elastic_ep = all(self._engines.elastic_ep_of(eid) for eid in ids)
        return registration_request(self.spec, self.pod, [p for p in profiles if p is not None], elastic_ep=elastic_ep)

    def heartbeat(self) -> HeartbeatRequest:
        """F-4: running, ready, not retired endpoints; the controller judges completeness."""
        retired = self._state.retired & self.spec.endpoint_ids
        alive = [eid for eid in self.spec.endpoint_ids if self.supervisor.ready(eid) and eid not in retired]
        return HeartbeatRequest(
            pod_id=self.pod.pod_id,
            instance_id=self.spec.instance_id,
            endpoint_ids=sorted(alive),
            expected_endpoint_ids=sorted(self.spec.endpoint_ids),
            retired_endpoint_ids=sorted(retired),
            guard_request_id=self._state.owner if self._state.is_frozen(self._clock.monotonic()) else None,
            sent_at=self._clock.now(),
            engine_ranks=self._lifecycle.engine_ranks(excluding=retired),
        )

    async def controller_once(self) -> None:
        """Register when needed, heartbeat, deliver the report outbox (:class:`~.controller_link.ControllerLink`)."""
        await self._link.exchange(self.registration(), heartbeat=self.heartbeat, on_retired=self._replace_retired)

    def _replace_retired(self, retired: Iterable[int]) -> None:
        self._state = service.replace_retired(self._state, retired)

    async def flush_reports(self) -> None:
        await self._link.flush()

    async def _controller_loop(self) -> None:
        while True:
            try:
                await self.controller_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any one bad step
                _log.exception("node_manager.controller_step_failed")
            await self._clock.sleep(self._link.step_interval_sec())

    async def _every(self, seconds: float, step: Callable[[], Awaitable[object]]) -> None:
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any one bad step
                _log.exception("node_manager.step_failed", step=getattr(step, "__name__", "?"))
            await self._clock.sleep(seconds)

    # == EngineFtService: the four routes (RFC §6) =========================================================
    def require_proxy(self) -> None:
        if not self._link.flags.enable_dp_scale_down_proxy:
            raise ProxyDisabledError("DP scale-down proxy is disabled on this NodeManager")

    def _local(self, endpoint_ids: Iterable[int]) -> list[int]:
        ids = sorted(set(endpoint_ids))
        unknown = [eid for eid in ids if eid not in self.spec.endpoint_ids]
        if unknown:
            raise UnknownEndpointError(f"endpoints {unknown} are not on pod {self.pod.pod_id!r}")
        return ids

    def _in_instance(self, ranks: Iterable[int]) -> frozenset[int]:
        outside = sorted(r for r in ranks if not 0 <= r < self.spec.dp_size)
        if outside:
            raise UnknownEndpointError(f"ranks {outside} are outside range(dp_size={self.spec.dp_size})")
        return frozenset(ranks)

    async def ft_status(self, request: FtStatusRequest) -> FtStatusResponse:
        self.require_proxy()
        ids = self._local(request.endpoint_ids)
        entries = await asyncio.gather(*(self._status_entry(eid) for eid in ids))
        return FtStatusResponse(entries=list(entries))

    async def _status_entry(self, endpoint_id: int) -> EndpointFtStatus:
        identity = self.supervisor.identity(endpoint_id)
        if endpoint_id in self._state.retired or not self.supervisor.running(endpoint_id):
            why = "retired" if endpoint_id in self._state.retired else "its engine process is not running"
            return EndpointFtStatus(endpoint_id=endpoint_id, error="not_running", detail=why, identity=identity)
        observation = await self._observe(endpoint_id)
        if isinstance(observation, Answered):
            return EndpointFtStatus(endpoint_id=endpoint_id, status=observation.entry, identity=identity)
        error: Literal["unreachable", "protocol_error"] = (
            "unreachable" if isinstance(observation, Unreachable) else "protocol_error"
        )
        return EndpointFtStatus(endpoint_id=endpoint_id, error=error, detail=observation.detail, identity=identity)

    def ft_guard(self, request: GuardRequest) -> GuardResponse:
        self.require_proxy()
        self._state, outcome = service.guard(
            self._state, request_id=request.request_id, lease_sec=request.lease_sec, now=self._clock.monotonic()
        )
        _log.info("ft.guard", request_id=request.request_id, lease_sec=request.lease_sec, renewed=outcome.renewed)
        return GuardResponse(request_id=request.request_id, lease_sec=request.lease_sec, renewed=outcome.renewed)

    async def ft_apply(self, request: NmApplyRequest) -> NmApplyResponse:
        self.require_proxy()
        removed = self._in_instance(request.params.removed_dp_ranks or [])
        if request.endpoint_ids is not None:
            targets = self._local(request.endpoint_ids)
            clash = sorted(set(targets) & (removed | self._state.retired))
            if clash:
                raise UnknownEndpointError(f"endpoints {clash} are retired or being removed; they get no apply")
        else:
            targets = sorted(self.spec.endpoint_ids - removed - self._state.retired)
        # the pure admission first: a refused apply changes nothing, an admitted one is never repeated
        self._state, instruction = service.apply(
            self._state,
            request_id=request.request_id,
            instruction=request.instruction,
            fast_recovery_enabled=self._link.flags.enable_fast_recovery,
            now=self._clock.monotonic(),
        )
        fenced = await self._fence_unreachable(removed & self.spec.endpoint_ids)
        params = ApplyParams()
        if instruction == "scale_down":
            params = ApplyParams(
                removed_dp_ranks=sorted(removed),
                dp_master_ip=request.params.dp_master_ip,
                dp_store_port=self.spec.dp_store_port,  # F-25: every NodeManager fills the spec's port
            )
        body = ApplyRequest(instruction=instruction, request_id=request.request_id, params=params)
        _log.info("ft.apply", request_id=request.request_id, targets=targets, body=body.model_dump(exclude_none=True))
        results = list(
            await asyncio.gather(*(self._apply_one(eid, self._lifecycle.in_engine_world(eid, body)) for eid in targets))
        )
        accepted = bool(results) and all(r.http_status == 202 for r in results)
        return NmApplyResponse(
            request_id=request.request_id,
            instruction=instruction,
            accepted=accepted,
            results=results,
            fenced_endpoint_ids=fenced,
        )

    async def _apply_one(self, endpoint_id: int, body: ApplyRequest) -> EngineApplyResult:
        if not self.supervisor.running(endpoint_id):
            return EngineApplyResult(endpoint_id=endpoint_id, http_status=None, detail="engine not running")
        try:
            answer = await self._engines.apply(
                endpoint_id, body, timeout_sec=self.settings.engine_ft_status_timeout_sec
            )
        except (EngineUnreachableError, EngineProtocolError) as exc:
            return EngineApplyResult(endpoint_id=endpoint_id, http_status=None, detail=str(exc))
        if answer.http_status == 202:
            self._commands[endpoint_id] = commands.track(
                round_id=body.request_id,
                engine_id=answer.engine_request_id,
                instruction=body.instruction,
                profile=self._engines.profile_of(endpoint_id),
            )
        return EngineApplyResult(endpoint_id=endpoint_id, http_status=answer.http_status, detail=answer.detail)

    async def _fence_unreachable(self, endpoint_ids: Iterable[int]) -> list[int]:
        """F-51: DEAD evidence that came from unreachability is made true by stopping that engine."""
        fenced = []
        for endpoint_id in sorted(endpoint_ids):
            unreachable = self._polls[endpoint_id].dead_by_unreachability
            if (
                unreachable
                and self.supervisor.running(endpoint_id)
                and await asyncio.to_thread(self.supervisor.fence, endpoint_id)
            ):
                fenced.append(endpoint_id)
        return fenced

    async def ft_finalize(self, request: FinalizeRequest) -> FinalizeResponse:
        self.require_proxy()
        retired = self._in_instance(request.retired_endpoint_ids)
        self._state, outcome = service.finalize(
            self._state,
            request_id=request.request_id,
            commit=request.commit,
            retired=retired,
            now=self._clock.monotonic(),
        )
        fenced: list[int] = []
        self._commands = {eid: c for eid, c in self._commands.items() if c.round_id != request.request_id}
        if request.commit:
            fenced = await self._fence_unreachable(self._state.retired & self.spec.endpoint_ids)
            self._link.drop_retired()
        _log.info(
            "ft.finalize",
            request_id=request.request_id,
            commit=request.commit,
            repeated=outcome.repeated,
            retired=sorted(self._state.retired),
        )
        return FinalizeResponse(
            request_id=request.request_id,
            commit=request.commit,
            repeated=outcome.repeated,
            retired_endpoint_ids=sorted(self._state.retired),
            fenced_endpoint_ids=fenced,
        )

    async def probe(self, request: ProbeRequest, *, nudge: bool = False) -> ProbeResponse:
        """F-52 (guarded, identity reported) or F-54 (``nudge``: only with ``nudge_idle_survivors``)."""
        self.require_proxy()
        if nudge:
            if not self._link.flags.nudge_idle_survivors:
                raise service.InvalidCommandError("nudge_idle_survivors is off")
        else:
            service.require_guard(self._state, request_id=request.request_id, now=self._clock.monotonic())
        if request.endpoint_ids is not None:
            ids = self._local(request.endpoint_ids)
        else:
            ids = sorted(self.spec.endpoint_ids - self._state.retired)
        results = list(await asyncio.gather(*(self._lifecycle.probe(eid, request) for eid in ids)))
        return ProbeResponse(request_id=request.request_id, ok=all(r.ok for r in results), results=results)

    # == engine lifecycle routes (the controller's fallbacks, F-14) ========================================
    async def stop_engines(self, endpoint_ids: Iterable[int] | None = None) -> EnginesResponse:
        async with self._lifecycle.lock:
            ids = self._local(self.spec.endpoint_ids if endpoint_ids is None else endpoint_ids)
            stopped = await self._lifecycle.stop(ids)
            for eid in ids:
                self._dead_since.pop(eid, None)
            return EnginesResponse(stopped_endpoint_ids=stopped, retired_endpoint_ids=sorted(self._state.retired))

    async def start_engines(self, request: EnginesStartRequest, *, restart: bool = False) -> EnginesResponse:
        async with self._lifecycle.lock:
            # the controller takes every local engine over: an earlier death no longer counts towards the suicide
            # handling, also for an engine the new retired set no longer retires (a full rebuild)
            retired = (
                self._state.retired
                if request.retired_endpoint_ids is None
                else self._in_instance(request.retired_endpoint_ids)
            )
            target = self._lifecycle.admit(
                retired=retired, master_ip=request.dp_master_ip, master_port=request.dp_master_port
            )
            self._dead_since.clear()
            self._state = service.replace_retired(self._state, retired)
            self._lifecycle.target = target
            stopped = await self._lifecycle.stop_at_once(sorted(self.spec.endpoint_ids)) if restart else []
            started = self.launch_engines()
            return EnginesResponse(
                stopped_endpoint_ids=stopped,
                started_endpoint_ids=started,
                retired_endpoint_ids=sorted(self._state.retired),
            )

    # == status ============================================================================================
    def status(self) -> NodeManagerStatus:
        return pod_status(
            pod_id=self.pod.pod_id,
            instance_id=self.spec.instance_id,
            state=self._state,
            link=self._link,
            endpoints=tuple(
                endpoint_status(
                    eid,
                    self.supervisor,
                    self._polls[eid],
                    retired=eid in self._state.retired,
                    world=self._lifecycle.world(eid),
                    elastic_resize=self._lifecycle.resized.get(eid),
                )
                for eid in sorted(self.spec.endpoint_ids)
            ),
            violations=tuple(self._violations),
            suicide_reason=self._suicide_reason,
            config_warnings=self.settings.config_warnings,
            now=self._clock.monotonic(),
        )

    @property
    def service_state(self) -> FtServiceState:
        return self._state
