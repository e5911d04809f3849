"""Prometheus metrics of one Coordinator (``GET /metrics``, cluster token required).

A registry of its own per app (no global state), so that several Coordinators can share a test process.
Views and in-flight counts are read from :meth:`ServingViews.status` at scrape time, so the published gauge
can never disagree with what the router uses.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from heteroflow.core.admission import AdmissionStatus
from heteroflow.serving.coordinator.views import ViewsStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class CoordinatorMetrics:
    def __init__(
        self,
        status: Callable[[], ViewsStatus],
        *,
        waiting: Callable[[], int],
        admission: Callable[[], AdmissionStatus] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "heteroflow_coordinator_requests",
            "OpenAI requests by route and outcome (ok, resumed, upstream_4xx, stream_error, bad_request, "
            "unauthorized, unknown_model, no_endpoint, upstream_unavailable, upstream_failed, auth_unavailable, "
            "key_busy: its key's share of the pool in flight, key_throttled: its address or key past "
            "max_failed_keys 401s in its window, overloaded, limited: max_in_flight_per_peer from one "
            "address, body_timeout: the body did not arrive within body_read_timeout_sec).",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.retries = Counter(
            "heteroflow_coordinator_retries",
            "Fault answers after which a request was sent elsewhere or held, by the fault (connect, timeout, "
            "disconnect, upstream_503, upstream_5xx, abort, error_event, faulted_stall).",
            ["reason"],
            registry=self.registry,
        )
        self.continuations = Counter(
            "heteroflow_coordinator_stream_continuations",
            "Streams cut after they sent output, by what followed (resumed: continued on another engine; "
            "completed: max_tokens was used up, the end added; not_continuable; failed: no engine within the "
            "client deadline).",
            ["outcome"],
            registry=self.registry,
        )
        self.upstream_latency = Histogram(
            "heteroflow_coordinator_upstream_latency_seconds",
            "Seconds from sending a request to an engine until its response headers arrived.",
            ["instance", "endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.view_operations = Counter(
            "heteroflow_coordinator_view_operations",
            "Management operations by operation (DEL, ADD, SET) and outcome (applied, stale_generation, "
            "unknown_instance, model_mismatch).",
            ["op", "outcome"],
            registry=self.registry,
        )
        self.registry.register(_ViewsCollector(status, waiting))
        if admission is not None:
            self.registry.register(_AdmissionCollector(admission))

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data


class _ViewsCollector(Collector):
    def __init__(self, status: Callable[[], ViewsStatus], waiting: Callable[[], int]) -> None:
        self._status = status
        self._waiting = waiting

    def collect(self) -> Iterator[Any]:
        snap = self._status()
        published = GaugeMetricFamily(
            "heteroflow_coordinator_published_endpoints",
            "Endpoints an instance publishes now (0 while its view is withdrawn).",
            labels=["instance", "model"],
        )
        generation = GaugeMetricFamily(
            "heteroflow_coordinator_view_generation",
            "The last applied ADD/SET generation of an instance.",
            labels=["instance"],
        )
        for view in snap.instances:
            published.add_metric([view.instance_id, view.model], float(len(view.endpoints)))
            generation.add_metric([view.instance_id], float(view.generation))
        yield published
        yield generation
        per_instance: Tally[str] = Tally()
        for key, count in snap.in_flight.items():
            per_instance[key.instance_id] += count
        in_flight = GaugeMetricFamily(
            "heteroflow_coordinator_in_flight_requests",
            "Upstream requests in flight per instance (withdrawn endpoints included until they finish).",
            labels=["instance"],
        )
        for view in snap.instances:
            in_flight.add_metric([view.instance_id], float(per_instance.get(view.instance_id, 0)))
        yield in_flight
        yield GaugeMetricFamily(
            "heteroflow_coordinator_waiting_requests",
            "Requests waiting for a publication of their model (at most client_deadline_sec each).",
            value=float(self._waiting()),
        )


class _AdmissionCollector(Collector):
    def __init__(self, admission: Callable[[], AdmissionStatus]) -> None:
        self._admission = admission

    def collect(self) -> Iterator[Any]:
        snap = self._admission()
        yield GaugeMetricFamily(
            "heteroflow_coordinator_requests_in_progress",
            "OpenAI requests being handled now, a stream until its last byte (bounded by max_concurrent_requests).",
            value=float(snap.in_flight),
        )
        yield GaugeMetricFamily(
            "heteroflow_coordinator_requests_in_progress_peak",
            "The most OpenAI requests handled at once since the Coordinator started.",
            value=float(snap.peak_in_flight),
        )
