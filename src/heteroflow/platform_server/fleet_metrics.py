"""The fleet series of ``/metrics``, read from the database at scrape time (:mod:`heteroflow.storage.fleet_store`).

- ``heteroflow_alerts_open{type, severity}``: open alerts (GPU_FAULT_PREDICTED, GPU_MEMORY_HIGH, …); every
  known type is present, 0 included, since these are counted, not unknown;
- ``heteroflow_alerts_open_backlog{type}``: those open past the backlog limit (72 h): intervention required;
- ``heteroflow_node_last_heartbeat_timestamp_seconds{node, source}``: the node's last heartbeat as flushed
  (absent for a node that never beat: unknown is never 0);
- ``heteroflow_fleet_scrape_ok``: 1 when these were read, 0 when the database could not be (the other series of
  the scrape are then left out rather than reported as 0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from heteroflow.storage.fleet_store import FleetSnapshot

ALERT_TYPES = ("GPU_FAULT_PREDICTED", "GPU_MEMORY_HIGH", "NODE_CARDS_REFUSED")
"""Alert types that always have a series, so that a rule on them never reads "absent" as "none open"."""
SEVERITIES = {
    "GPU_FAULT_PREDICTED": ("WARN", "CRITICAL"),
    "GPU_MEMORY_HIGH": ("WARN",),
    "NODE_CARDS_REFUSED": ("WARN",),
}
"""The severities each type is raised with, each always with a series: GPU_MEMORY_HIGH and NODE_CARDS_REFUSED are
WARN; GPU_FAULT_PREDICTED is CRITICAL on a strong signal, WARN on a trend alone. Another one gets its series when it
occurs."""


class _FleetCollector(Collector):
    def __init__(self, snapshot: FleetSnapshot | None) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ok = GaugeMetricFamily("heteroflow_fleet_scrape_ok", "1 when the fleet series were read from the database.")
        ok.add_metric([], 1.0 if self._snapshot is not None else 0.0)
        yield ok
        if self._snapshot is None:
            return
        counts: dict[tuple[str, str], int] = {(t, s): 0 for t in ALERT_TYPES for s in SEVERITIES[t]}
        backlog: dict[str, int] = defaultdict(int, dict.fromkeys(ALERT_TYPES, 0))
        for row in self._snapshot.open_alerts:
            counts[(row.type, row.severity)] = counts.get((row.type, row.severity), 0) + row.count
            backlog[row.type] += row.backlogged
        open_alerts = GaugeMetricFamily(
            "heteroflow_alerts_open", "Open alerts, by type and severity.", labels=["type", "severity"]
        )
        for (type_, severity), count in sorted(counts.items()):
            open_alerts.add_metric([type_, severity], float(count))
        yield open_alerts
        backlogged = GaugeMetricFamily(
            "heteroflow_alerts_open_backlog",
            "Open alerts past the backlog limit (72 h), by type: a person has to look at them.",
            labels=["type"],
        )
        for type_, count in sorted(backlog.items()):
            backlogged.add_metric([type_], float(count))
        yield backlogged
        beats = GaugeMetricFamily(
            "heteroflow_node_last_heartbeat_timestamp_seconds",
            "The node's last heartbeat as flushed to the database, Unix seconds (absent when it never beat).",
            labels=["node", "source"],
        )
        for node in self._snapshot.heartbeats:
            if node.last_heartbeat_at is not None:
                beats.add_metric([node.node_name, node.source], node.last_heartbeat_at.timestamp())
        yield beats


def render_fleet(snapshot: FleetSnapshot | None) -> bytes:
    """The fleet series in the Prometheus text format; ``None``: the database could not be read."""
    registry = CollectorRegistry()
    registry.register(_FleetCollector(snapshot))
    return generate_latest(registry)
