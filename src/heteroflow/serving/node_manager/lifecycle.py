"""The engines' lifecycle on one pod: the world each engine was launched into, and the stop, start and restart the
controller's fallbacks ask for (F-14).

:class:`EngineLifecycle` holds the launch target (master, members: ``spec.LaunchTarget``) the next launch uses and
the world each running engine was started in, which the NodeManager translates every apply and status through
(a relaunch without some ranks renumbers the survivors), and whether vLLM's elastic EP resized that world since
(:meth:`EngineLifecycle.watch_resize`), and probes a running engine with one short completion
(:meth:`EngineLifecycle.probe`). It starts engines through the
:class:`~.supervisor.ProcessSupervisor` and tells its owner each start (``on_launch``: a new engine has no poll
history and no command). Its :attr:`EngineLifecycle.lock` is held by the stop/start/restart routes for
their whole body: while it is held the controller is taking the engines over, and the suicide handling waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

import structlog

from heteroflow.contracts.engine_protocol import ApplyRequest
from heteroflow.contracts.serving import EngineRank, ProbeRequest, ProbeResult
from heteroflow.core.clock import Clock
from heteroflow.serving.node_manager.engines import ElasticEpReading, EngineCallError, EngineClient
from heteroflow.serving.node_manager.ft_manager import elastic_resize
from heteroflow.serving.node_manager.service import FtServiceError
from heteroflow.serving.node_manager.spec import (
    InstanceSpec,
    LaunchTarget,
    SpecError,
    check_launch,
    default_target,
    engine_command,
    launch_target,
)
from heteroflow.serving.node_manager.supervisor import ProcessSupervisor

_log = structlog.get_logger(__name__)


class LaunchRefusedError(FtServiceError):
    """HTTP 409: the engines could not start in the world asked for (too few ranks to hold every logical
    expert); nothing was stopped or changed."""

    code = "launch_refused"


class EngineLifecycle:
    def __init__(
        self,
        *,
        spec: InstanceSpec,
        pod_ip: str,
        cluster_token: str | None,
        supervisor: ProcessSupervisor,
        engines: EngineClient,
        stop_grace_sec: float,
        is_retired: Callable[[int], bool],
        on_launch: Callable[[int], None],
        clock: Clock,
    ) -> None:
        self._spec = spec
        self._pod_ip = pod_ip
        self._cluster_token = cluster_token
        self._supervisor = supervisor
        self._engines = engines
        self._stop_grace_sec = stop_grace_sec
        self._is_retired = is_retired
        self._on_launch = on_launch
        self._clock = clock
        self.target: LaunchTarget = default_target(spec)
        """The world the next launch starts engines in (the spec's, until a start or restart replaces it)."""
        self.launched: dict[int, LaunchTarget] = {}
        """The world each running engine was launched into: its FT id and the ranks an apply may name."""
        self.resized: dict[int, ElasticEpReading] = {}
        """Endpoints whose engine's world elastic EP resized since its launch (the last reading that said so);
        cleared when the engine is started again, in a fresh world."""
        self.lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        """The controller is stopping or starting this pod's engines: it took them over."""
        return self.lock.locked()

    def world(self, endpoint_id: int) -> LaunchTarget | None:
        return self.launched.get(endpoint_id)

    def in_engine_world(self, endpoint_id: int, body: ApplyRequest) -> ApplyRequest:
        """``body`` as the endpoint's engine counts: its launch's ranks (a smaller relaunch renumbered them), and
        without the ranks retired before that launch, which its world never had."""
        world = self.launched.get(endpoint_id)
        removed = body.params.removed_dp_ranks
        if world is None or removed is None or world.members == tuple(range(self._spec.dp_size)):
            return body
        params = body.params.model_copy(update={"removed_dp_ranks": world.engine_ranks(removed)})
        return body.model_copy(update={"params": params})

    def engine_ranks(self, *, excluding: frozenset[int]) -> list[EngineRank]:
        """Each running engine's launch rank and size, and whether elastic EP resized that world since (the
        heartbeat's ``engine_ranks``), but for the endpoints ``excluding`` names (retired ones)."""
        ranks = []
        for endpoint_id, world in sorted(self.launched.items()):
            if endpoint_id in excluding or not self._supervisor.running(endpoint_id):
                continue
            resized = self.resized.get(endpoint_id)
            ranks.append(
                EngineRank(
                    endpoint_id=endpoint_id,
                    engine_rank=world.engine_rank(endpoint_id),
                    dp_size=world.dp_size,
                    elastic_ep_resized=resized is not None,
                    elastic_ep_requested_dp_size=None if resized is None else resized.requested_data_parallel_size,
                )
            )
        return ranks

    def launch(self, endpoint_ids: Iterable[int]) -> list[int]:
        """Start those of ``endpoint_ids`` that are not retired and not running, in :attr:`target`'s world."""
        started = []
        for endpoint_id in sorted(endpoint_ids):
            if self._is_retired(endpoint_id) or self._supervisor.running(endpoint_id):
                continue
            command = engine_command(
                self._spec,
                endpoint_id,
                pod_ip=self._pod_ip,
                cluster_token=self._cluster_token,
                target=self.target,
            )
            self._supervisor.launch(command)
            self.launched[endpoint_id] = self.target
            self.resized.pop(endpoint_id, None)  # a fresh world: no resize of it yet
            self._engines.renumber(endpoint_id, self.target.engine_rank(endpoint_id))
            self._on_launch(endpoint_id)
            started.append(endpoint_id)
        return started

    async def stop(self, endpoint_ids: Sequence[int]) -> list[int]:
        """Stop each engine in turn (SIGTERM, SIGKILL after the stop grace); those that were running."""
        return [
            eid
            for eid in endpoint_ids
            if await asyncio.to_thread(self._supervisor.stop, eid, grace_sec=self._stop_grace_sec)
        ]

    async def stop_at_once(self, endpoint_ids: Sequence[int]) -> list[int]:
        """Stop every engine at the same time: a hung engine uses its whole stop grace, and must not add it to
        the others'; those that were running."""
        ids = sorted(endpoint_ids)
        results = await asyncio.gather(
            *(asyncio.to_thread(self._supervisor.stop, eid, grace_sec=self._stop_grace_sec) for eid in ids)
        )
        return [eid for eid, was_stopped in zip(ids, results, strict=True) if was_stopped]

    def admit(self, *, retired: Iterable[int], master_ip: str | None, master_port: int | None) -> LaunchTarget:
        """The world a start without ``retired`` forms (the master moved where given, else kept); raises
        :class:`LaunchRefusedError` when its ranks cannot hold every logical expert. Changes nothing."""
        target = launch_target(
            self._spec,
            master_ip=master_ip or self.target.master_ip,
            master_port=master_port or self.target.master_port,
            retired=retired,
        )
        try:
            check_launch(self._spec, target)
        except SpecError as exc:  # before anything is stopped: the running engines keep serving
            raise LaunchRefusedError(str(exc)) from exc
        return target

    async def watch_resize(self, endpoint_id: int, *, timeout_sec: float) -> ElasticEpReading | None:
        """Where the last elastic EP resize of a ready engine stands, for an engine that runs with elastic EP
        (configured, or found at discovery); the reading when it shows a resize of the engine's launched world
        (:func:`~.ft_manager.elastic_resize`), which then marks the endpoint (:attr:`resized`) until its engine is
        started again. An unreadable status marks nothing: the FT poll judges the engine itself."""
        world = self.launched.get(endpoint_id)
        if world is None or not (self._spec.enable_elastic_ep or self._engines.elastic_ep_of(endpoint_id)):
            return None
        incarnation = self._supervisor.incarnation(endpoint_id)
        try:
            reading = await self._engines.elastic_ep_status(endpoint_id, timeout_sec=timeout_sec)
        except EngineCallError:
            return None
        if self._supervisor.incarnation(endpoint_id) != incarnation:
            return None  # started again meanwhile: the reading was of the world before
        known = endpoint_id in self.resized
        if not known and not elastic_resize(
            phase=reading.phase,
            requested_dp_size=reading.requested_data_parallel_size,
            launched_dp_size=world.dp_size,
        ):
            return None
        if not known:
            _log.warning(
                "engine.elastic_ep_resized",
                endpoint_id=endpoint_id,
                phase=reading.phase,
                requested_dp_size=reading.requested_data_parallel_size,
                launched_dp_size=world.dp_size,
                detail="elastic EP resized the engine's world outside HeteroFlow; the instance is not scaled down "
                "until its engines are relaunched",
            )
        self.resized[endpoint_id] = reading
        return reading

    async def probe(self, endpoint_id: int, request: ProbeRequest) -> ProbeResult:
        """One short completion of a running, not retired engine (F-52, F-54): its latency and process identity."""
        identity = self._supervisor.identity(endpoint_id)
        if self._is_retired(endpoint_id) or not self._supervisor.running(endpoint_id):
            return ProbeResult(endpoint_id=endpoint_id, ok=False, detail="engine not running", identity=identity)
        started = self._clock.monotonic()
        try:
            await self._engines.complete(endpoint_id, max_tokens=request.max_tokens, timeout_sec=request.timeout_sec)
        except EngineCallError as exc:
            return ProbeResult(endpoint_id=endpoint_id, ok=False, detail=str(exc), identity=identity)
        latency = round(self._clock.monotonic() - started, 4)
        return ProbeResult(endpoint_id=endpoint_id, ok=True, latency_sec=latency, identity=identity)
