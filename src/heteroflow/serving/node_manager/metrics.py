"""Prometheus metrics of one NodeManager, read from its frozen status at scrape time (``GET /metrics``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from heteroflow.serving.node_manager.status import NodeManagerStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FT_STATUSES = ("unknown", "healthy", "diagnosing", "unhealthy", "dead", "protocol_error", "paused")


class NodeManagerMetrics:
    """A registry of its own (no global state), so several NodeManagers can share a test process."""

    def __init__(self, status: Callable[[], NodeManagerStatus]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(status))

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data


class _Collector(Collector):
    def __init__(self, status: Callable[[], NodeManagerStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        snap = self._status()
        pod = snap.pod_id
        ready = GaugeMetricFamily(
            "heteroflow_node_manager_engine_ready", "1 when the endpoint's engine runs and has been ready.",
            labels=["pod", "endpoint"],
        )  # fmt: skip
        ft = GaugeMetricFamily(
            "heteroflow_node_manager_engine_ft_status", "1 for the endpoint's last polled FT status.",
            labels=["pod", "endpoint", "status"],
        )  # fmt: skip
        polls = CounterMetricFamily(
            "heteroflow_node_manager_ft_polls", "FT status polls since the engine started.", labels=["pod", "endpoint"]
        )
        resized = GaugeMetricFamily(
            "heteroflow_node_manager_engine_elastic_ep_resized",
            "1 when elastic EP resized the engine's world since its launch (no scale-down until a relaunch).",
            labels=["pod", "endpoint"],
        )
        for endpoint in snap.endpoints:
            eid = str(endpoint.endpoint_id)
            ready.add_metric([pod, eid], 1.0 if endpoint.ready else 0.0)
            resized.add_metric([pod, eid], 1.0 if endpoint.elastic_ep_resized else 0.0)
            polls.add_metric([pod, eid], float(endpoint.polls))
            for status in FT_STATUSES:
                ft.add_metric([pod, eid, status], 1.0 if endpoint.ft_status == status else 0.0)
        yield ready
        yield ft
        yield polls
        yield resized
        yield GaugeMetricFamily(
            "heteroflow_node_manager_guard_frozen", "1 while a round's guard freezes this NodeManager.",
            value=1.0 if snap.frozen else 0.0,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "heteroflow_node_manager_retired_endpoints",
            "Committed (retired) ranks known here.",
            value=len(snap.retired),
        )
        yield CounterMetricFamily(
            "heteroflow_node_manager_fault_reports", "Fault reports delivered to the controller.",
            value=float(snap.reports_sent),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "heteroflow_node_manager_fault_reports_pending", "Reports waiting for the controller.",
            value=float(snap.reports_pending),
        )  # fmt: skip
        yield CounterMetricFamily(
            "heteroflow_node_manager_heartbeats", "Heartbeats delivered to the controller.",
            value=float(snap.heartbeats_sent),
        )  # fmt: skip
        yield CounterMetricFamily(
            "heteroflow_node_manager_fencing_violations", "Retired ranks that answered again (F-53).",
            value=float(len(snap.fencing_violations)),
        )  # fmt: skip
