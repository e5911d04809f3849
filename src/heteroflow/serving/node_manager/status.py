"""The NodeManager's frozen status objects (``GET /node-manager/status``, ``/metrics``, and the tests)."""

from __future__ import annotations

from dataclasses import dataclass

from heteroflow.contracts.serving import FtFlags
from heteroflow.serving.node_manager.controller_link import ControllerLink
from heteroflow.serving.node_manager.engines import ElasticEpReading
from heteroflow.serving.node_manager.ft_manager import PollState
from heteroflow.serving.node_manager.service import FtServiceState
from heteroflow.serving.node_manager.spec import LaunchTarget
from heteroflow.serving.node_manager.supervisor import ProcessSupervisor


@dataclass(frozen=True, slots=True)
class FencingViolation:
    """A retired rank that answered again (F-53)."""

    endpoint_id: int
    detail: str
    fenced: bool
    at_monotonic: float


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    endpoint_id: int
    retired: bool
    running: bool
    ready: bool
    incarnation: int | None
    pid: int | None
    start_time: float | None
    ft_status: str
    """Last poll: unknown / healthy / unhealthy / dead / protocol_error."""
    dead_by_unreachability: bool
    polls: int
    engine_rank: int | None = None
    """The FT id (``--data-parallel-rank``) the engine was launched with; differs from ``endpoint_id`` after a
    relaunch without some ranks renumbered the world. ``None`` before the first launch."""
    engine_dp_size: int | None = None
    """The ``--data-parallel-size`` of that launch."""
    elastic_ep_resized: bool = False
    """Elastic EP resized (or is resizing) the engine's world since that launch, outside HeteroFlow: the
    controller no longer scales the instance down until the engine is started again."""
    elastic_ep_phase: str | None = None
    """The resize's phase as the engine last said it (``preparing``, ``committing``, ``completed``…)."""
    elastic_ep_requested_dp_size: int | None = None
    """The DP size the resize asked for, when the engine said."""


@dataclass(frozen=True, slots=True)
class NodeManagerStatus:
    """What the NodeManager holds now; ``GET /node-manager/status`` and the tests read this."""

    pod_id: str
    instance_id: str
    registered: bool
    flags: FtFlags
    guard_request_id: str | None
    guard_lease_left_sec: float
    frozen: bool
    retired: tuple[int, ...]
    endpoints: tuple[EndpointStatus, ...]
    reports_sent: int
    reports_pending: int
    heartbeats_sent: int
    fencing_violations: tuple[FencingViolation, ...]
    finalized_rounds: tuple[tuple[str, bool], ...]
    suicide_reason: str | None
    config_warnings: tuple[str, ...]


def endpoint_status(
    endpoint_id: int,
    supervisor: ProcessSupervisor,
    poll: PollState,
    *,
    retired: bool,
    world: LaunchTarget | None = None,
    elastic_resize: ElasticEpReading | None = None,
) -> EndpointStatus:
    identity = supervisor.identity(endpoint_id)
    return EndpointStatus(
        endpoint_id=endpoint_id,
        retired=retired,
        running=supervisor.running(endpoint_id),
        ready=supervisor.ready(endpoint_id),
        incarnation=supervisor.incarnation(endpoint_id),
        pid=None if identity is None else identity.pid,
        start_time=None if identity is None else identity.start_time,
        ft_status=poll.last,
        dead_by_unreachability=poll.dead_by_unreachability,
        polls=poll.polls,
        engine_rank=None if world is None else world.engine_rank(endpoint_id),
        engine_dp_size=None if world is None else world.dp_size,
        elastic_ep_resized=elastic_resize is not None,
        elastic_ep_phase=None if elastic_resize is None else elastic_resize.phase,
        elastic_ep_requested_dp_size=None if elastic_resize is None else elastic_resize.requested_data_parallel_size,
    )


def pod_status(
    *,
    pod_id: str,
    instance_id: str,
    state: FtServiceState,
    link: ControllerLink,
    endpoints: tuple[EndpointStatus, ...],
    violations: tuple[FencingViolation, ...],
    suicide_reason: str | None,
    config_warnings: tuple[str, ...],
    now: float,
) -> NodeManagerStatus:
    """The NodeManager's status at monotonic time ``now`` (the guard's lease left is counted from it)."""
    return NodeManagerStatus(
        pod_id=pod_id,
        instance_id=instance_id,
        registered=link.registered,
        flags=link.flags,
        guard_request_id=state.owner,
        guard_lease_left_sec=round(state.lease_left(now), 3),
        frozen=state.is_frozen(now),
        retired=tuple(sorted(state.retired)),
        endpoints=endpoints,
        reports_sent=link.reports_sent,
        reports_pending=link.reports_pending,
        heartbeats_sent=link.heartbeats_sent,
        fencing_violations=violations,
        finalized_rounds=tuple((r.request_id, r.commit) for r in state.history),
        suicide_reason=suicide_reason,
        config_warnings=config_warnings,
    )
