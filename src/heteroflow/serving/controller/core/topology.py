"""The instance's topology from NodeManager registrations, and a round's NodeManager plan (F-21…F-25).

Purely computational. The controller assembles an instance only from its pods' registrations; anything
missing or inconsistent fails closed (:class:`TopologyError`), so a round never starts on a guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from heteroflow.contracts.serving import (
    DISCOVERED_CAPABILITY_FIELDS,
    MAX_LEASE_SEC,
    ApplyInstructionParams,
    EndpointInfo,
    FtCapability,
    NmApplyRequest,
    RegisterRequest,
)

from .errors import CapabilityMismatchError, TopologyError
from .ranks import DpRank, InstanceId, PodId, RequestId, ranks

_NAMED_RANKS = 16
"""Ranks an incomplete-instance error names (the count says how many more)."""


@dataclass(frozen=True, slots=True)
class PodTopology:
    pod_id: PodId
    pod_ip: str
    node_name: str
    node_manager_url: str
    endpoints: tuple[EndpointInfo, ...]

    @property
    def dp_ranks(self) -> frozenset[DpRank]:
        return ranks(e.id for e in self.endpoints)


@dataclass(frozen=True, slots=True)
class InstanceTopology:
    """``Instance.endpoints`` (immutable after start, F-31) grouped by pod, with the agreed capability."""

    instance_id: InstanceId
    dp_size: int
    pods: tuple[PodTopology, ...]
    capability: FtCapability
    role: str = "both"

    @property
    def original_dp_ranks(self) -> frozenset[DpRank]:
        return frozenset().union(*(pod.dp_ranks for pod in self.pods))

    def endpoint(self, rank: int) -> EndpointInfo:
        for pod in self.pods:
            for endpoint in pod.endpoints:
                if endpoint.id == rank:
                    return endpoint
        raise TopologyError(f"rank {rank} has no endpoint in instance {self.instance_id!r}")

    def pod_of(self, rank: int) -> PodTopology:
        for pod in self.pods:
            if rank in pod.dp_ranks:
                return pod
        raise TopologyError(f"rank {rank} belongs to no pod of instance {self.instance_id!r}")


def resolve_instance(registrations: Iterable[RegisterRequest]) -> InstanceTopology:
    """Assemble one instance from its pods' registrations; fail closed on anything inconsistent.

    The pods must agree on instance, ``dp_size``, role and FT capability (F-21: else
    :class:`CapabilityMismatchError`); their endpoint ids must be disjoint and together exactly
    ``range(dp_size)`` (else :class:`TopologyError`: a rank nobody registered cannot be planned for).
    """
    regs = sorted(registrations, key=lambda r: r.pod_id)
    if not regs:
        raise TopologyError("no NodeManager registered for this instance")
    first = regs[0]
    for reg in regs[1:]:
        if reg.instance_id != first.instance_id:
            raise TopologyError(f"pods of instances {first.instance_id!r} and {reg.instance_id!r} mixed")
        if reg.dp_size != first.dp_size or reg.role != first.role:
            raise TopologyError(f"pod {reg.pod_id!r} disagrees on dp_size or role with pod {first.pod_id!r}")
        if _configured(reg.ft_capability) != _configured(first.ft_capability):
            raise CapabilityMismatchError(
                f"pod {reg.pod_id!r} registered FT capability {reg.ft_capability.model_dump()} but pod "
                f"{first.pod_id!r} registered {first.ft_capability.model_dump()}"
            )
    if len({reg.pod_id for reg in regs}) != len(regs):
        raise TopologyError("a pod registered twice")
    seen: set[int] = set()
    for reg in regs:
        ids = {e.id for e in reg.endpoints}
        if ids & seen:
            raise TopologyError(f"ranks {sorted(ids & seen)} registered by more than one pod")
        seen |= ids
    extra = sorted(rank for rank in seen if rank >= first.dp_size)
    if extra or len(seen) != first.dp_size:
        # dp_size is bounded by the contract (MAX_DP_SIZE), the message is not: name the first few ranks only
        missing = [rank for rank in range(first.dp_size) if rank not in seen]
        raise TopologyError(
            f"instance {first.instance_id!r} incomplete: {len(missing)} ranks missing "
            f"(first {missing[:_NAMED_RANKS]}), unknown {extra[:_NAMED_RANKS]}"
        )
    pods = tuple(
        PodTopology(
            pod_id=PodId(reg.pod_id),
            pod_ip=reg.pod_ip,
            node_name=reg.node_name,
            node_manager_url=reg.node_manager_url,
            endpoints=tuple(reg.endpoints),
        )
        for reg in regs
    )
    return InstanceTopology(
        instance_id=InstanceId(first.instance_id),
        dp_size=first.dp_size,
        pods=pods,
        capability=agreed_capability([reg.ft_capability for reg in regs]),
        role=first.role,
    )


def _configured(capability: FtCapability) -> dict[str, object]:
    return capability.model_dump(exclude=set(DISCOVERED_CAPABILITY_FIELDS))


def agreed_capability(capabilities: Iterable[FtCapability]) -> FtCapability:
    """The instance's capability from its pods' (configured fields equal). Purely computational.

    What the engines were found to speak may differ between pods (an image rolled out halfway, one pod not
    yet discovered): the instance supports only what every pod supports, and two known, different profiles
    make it ``mixed``, which the gate refuses (CAPABILITY_MISMATCH): mixed capabilities fail closed (RFC §6).
    A pod not yet discovered (``None``) adds its configured flags, not a profile."""
    caps = list(capabilities)
    first = caps[0]
    known = {c.protocol_profile for c in caps if c.protocol_profile is not None}
    profile = None if not known else known.pop() if len(known) == 1 else "mixed"
    return first.model_copy(
        update={
            "scale_down_supported": all(c.scale_down_supported for c in caps),
            "retry_supported": all(c.retry_supported for c in caps),
            "elastic_ep_supported": all(c.elastic_ep_supported for c in caps),
            "protocol_profile": profile,
        }
    )


# == a round's NodeManager plan (F-22, F-23, F-25) ================================================================
@dataclass(frozen=True, slots=True)
class NodeManagerRole:
    """One participating NodeManager: every pod is guarded and finalized; only those with routable survivors
    get status polls and the apply (F-22)."""

    pod: PodTopology
    survivors: frozenset[DpRank]
    removed: frozenset[DpRank]

    @property
    def routable(self) -> bool:
        return bool(self.survivors)


@dataclass(frozen=True, slots=True)
class RoundPlan:
    roles: tuple[NodeManagerRole, ...]
    master_rank: DpRank
    dp_master_ip: str

    @property
    def routable(self) -> tuple[NodeManagerRole, ...]:
        return tuple(role for role in self.roles if role.routable)


def plan_round(topology: InstanceTopology, *, survivors: Iterable[int], removed: Iterable[int]) -> RoundPlan:
    """Group the instance's NodeManagers for a round (F-22).

    ``removed`` is the cumulative set (committed plus pending). Every pod participates — headless-only and
    dead-only pods get guard and finalize only, so that the commit and its retired set reach every
    NodeManager (F-57). A survivor or removed rank that no pod registered fails closed.
    """
    survivor_set, removed_set = ranks(survivors), ranks(removed)
    if not survivor_set:
        raise TopologyError("no survivor to plan a round for")
    known = topology.original_dp_ranks
    unknown = (survivor_set | removed_set) - known
    if unknown:
        raise TopologyError(f"ranks {sorted(unknown)} are not in the instance's topology")
    roles = tuple(
        NodeManagerRole(pod=pod, survivors=pod.dp_ranks & survivor_set, removed=pod.dp_ranks & removed_set)
        for pod in topology.pods
    )
    master = min(survivor_set)
    return RoundPlan(roles=roles, master_rank=master, dp_master_ip=topology.endpoint(master).ip)


def apply_request(
    plan: RoundPlan, role: NodeManagerRole, *, request_id: RequestId, removed: Iterable[int]
) -> NmApplyRequest:
    """The single ``scale_down`` apply body for one routable NodeManager (F-25, F-56): cumulative
    ``removed_dp_ranks``, ``dp_master_ip`` = ip of min(survivor); the NodeManager fills ``dp_store_port``."""
    if not role.routable:
        raise TopologyError(f"pod {role.pod.pod_id!r} has no routable survivor; it gets guard/finalize only")
    return NmApplyRequest(
        instruction="scale_down",
        request_id=request_id,
        params=ApplyInstructionParams(removed_dp_ranks=sorted(ranks(removed)), dp_master_ip=plan.dp_master_ip),
        endpoint_ids=sorted(role.survivors),
    )


@dataclass(frozen=True, slots=True)
class RoundTimings:
    """``dp_scale_down_config`` (seconds)."""

    request_timeout_sec: float = 5.0
    poll_interval_sec: float = 1.0
    execution_deadline_sec: float = 30.0
    """Each of: before apply, after apply."""
    apply_dispatch_budget_sec: float = 5.0
    """The whole apply dispatch (one request to every routable NodeManager at once): vLLM 0.34 fails a round
    unless every survivor received its id within 10 s, so the round stops here, before that, when a survivor
    cannot be reached in time."""


def guard_lease_sec(timings: RoundTimings) -> float:
    """F-23: two recovery windows plus HTTP and poll margin, capped at 3600 s.

    Margin: one request timeout per step that talks to NodeManagers around the windows (guard, DEL/apply,
    finalize) and one poll interval per window, so a round that uses both deadlines fully still holds its
    guard when it finalizes; F-58 renews it while the round runs.
    """
    margin = 3 * timings.request_timeout_sec + 2 * timings.poll_interval_sec
    return min(2 * timings.execution_deadline_sec + margin, MAX_LEASE_SEC)


def recyclable_pods(
    topology: InstanceTopology,
    *,
    dead_committed: Iterable[int],
    already_stopped: Iterable[str],
    enable_dp_scale_up: bool,
) -> tuple[PodId, ...]:
    """Pods for ``PodLifecycle.stop_recyclable_pods`` after a committed round (F-26; A5-A7).

    Only with ``enable_dp_scale_up``; only pods all of whose ranks are committed (a pod with a survivor is
    never stopped); each pod once: ``already_stopped`` are the pods notified before, never again (the stop
    is best effort and never retried by us).
    """
    if not enable_dp_scale_up:
        return ()
    committed, stopped = ranks(dead_committed), set(already_stopped)
    return tuple(pod.pod_id for pod in topology.pods if pod.dp_ranks <= committed and pod.pod_id not in stopped)
