"""The whole platform on one machine as real processes: ``heteroflow up`` and the end-to-end tests.

- :mod:`~heteroflow.local.plan` — what runs where (instances, pods, ranks, ports, cards, command lines), pure;
- :mod:`~heteroflow.local.cluster` — :class:`LocalCluster`: start, wait until serving, stop with no orphan;
- :mod:`~heteroflow.local.processes` — sessions, the cluster marker, the orphan sweep;
- :mod:`~heteroflow.local.netns` — each pod in a network namespace of its own (``--netns``), and its cleanup;
- :mod:`~heteroflow.local.state` — the state file (URLs, token, instances, pids, logs);
- :mod:`~heteroflow.local.client` — HTTP calls to the running cluster;
- :mod:`~heteroflow.local.faults` — fault injection by rank (``heteroflow fault``);
- :mod:`~heteroflow.local.view` — the live terminal view and ``heteroflow status``;
- :mod:`~heteroflow.local.ports` — choosing free ports below the ephemeral range.
"""

from heteroflow.local.cluster import ClusterError, ClusterOptions, LocalCluster, StopReport
from heteroflow.local.state import ClusterState, StateFileError, read_state

__all__ = [
    "ClusterError",
    "ClusterOptions",
    "ClusterState",
    "LocalCluster",
    "StateFileError",
    "StopReport",
    "read_state",
]
