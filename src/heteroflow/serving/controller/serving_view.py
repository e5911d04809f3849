"""What the controller publishes to the Coordinator for an instance (``serving-ft.md`` F-4, F-40)."""

from __future__ import annotations

from collections.abc import Mapping

from heteroflow.contracts.serving import ServingEndpoint
from heteroflow.serving.controller.core.ranks import DpRank
from heteroflow.serving.controller.instance import Instance, PodState


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
