"""A pod of an assembled instance registering again: what it may change (addresses) and what not (F-31)."""

from __future__ import annotations

import structlog

from heteroflow.contracts.serving import DISCOVERED_CAPABILITY_FIELDS, DeviceInfo, EndpointInfo, RegisterRequest
from heteroflow.serving.controller.core.errors import TopologyError
from heteroflow.serving.controller.core.topology import resolve_instance
from heteroflow.serving.controller.instance import Instance

_log = structlog.get_logger(__name__)


class RegistrationConflictError(Exception):
    """A registration that would change an assembled instance's endpoints (HTTP 409)."""


def check_reregistration(inst: Instance, request: RegisterRequest, *, replacing: frozenset[str] = frozenset()) -> None:
    """A pod of an assembled instance registers again (its NodeManager restarted, maybe at another
    address or pod ip). The endpoints are immutable (F-31): the pod must bring back exactly its ranks,
    devices and the instance's capability, else :class:`RegistrationConflictError` (HTTP 409) and nothing
    changes; addresses follow the latest registration. A pod in ``replacing`` (deleted for replacement because
    of a standing hardware fault on its cards) comes back on other cards: its devices may change, its ranks
    not."""
    known = next((p for p in inst.topology.pods if p.pod_id == request.pod_id), None)
    if known is None:
        raise RegistrationConflictError(
            f"instance {inst.instance_id!r} is assembled without pod {request.pod_id!r}; its endpoints are fixed"
        )
    replaced = request.pod_id in replacing

    def shape(endpoints: list[EndpointInfo] | tuple[EndpointInfo, ...]) -> list[tuple[int, list[DeviceInfo]]]:
        return [(e.id, [] if replaced else e.device_infos) for e in endpoints]

    # what the engines were found to speak may change (discovery, a new build); the configuration may not
    configured = set(DISCOVERED_CAPABILITY_FIELDS)
    if shape(request.endpoints) != shape(known.endpoints) or (
        request.ft_capability.model_dump(exclude=configured) != inst.topology.capability.model_dump(exclude=configured)
    ):
        raise RegistrationConflictError(
            f"pod {request.pod_id!r} registered other endpoints or capability than when instance "
            f"{inst.instance_id!r} was assembled; the endpoints of an instance never change"
        )


def refresh_topology(inst: Instance, regs: list[RegisterRequest]) -> None:
    """Addresses (NodeManager URL, pod ip) follow a pod's latest registration; ranks never change."""
    try:
        topology = resolve_instance(regs)
    except TopologyError as exc:  # cannot happen after check_reregistration; keep the assembled one
        _log.warning("controller.reregistration_refused", instance_id=inst.instance_id, detail=str(exc))
        return
    if topology.original_dp_ranks == inst.topology.original_dp_ranks:
        inst.topology = topology
