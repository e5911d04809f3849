"""Prometheus metrics of one simulated engine, read from the engine core's frozen status at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from heteroflow.engine_sim.engine import EngineCoreStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineMetrics:
    """A registry of its own per engine (no global state), so several engines can share a process."""

    def __init__(self, status: Callable[[], EngineCoreStatus]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(status))

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data


class _EngineCollector(Collector):
    def __init__(self, status: Callable[[], EngineCoreStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        snap = self._status()
        st = snap.state
        rank = str(st.rank)
        health = GaugeMetricFamily(
            "heteroflow_engine_sim_status", "1 for the engine's current FT status.", labels=["dp_rank", "status"]
        )
        for status in ("healthy", "diagnosing", "unhealthy", "dead"):
            health.add_metric([rank, status], 1.0 if st.health == status else 0.0)
        yield health
        recovering = GaugeMetricFamily(
            "heteroflow_engine_sim_recovering", "1 while an accepted FT command runs.", labels=["dp_rank"]
        )
        recovering.add_metric([rank], 1.0 if st.running is not None else 0.0)
        yield recovering
        gauges: dict[str, tuple[str, int]] = {
            "heteroflow_engine_sim_requests_in_flight": ("Generations in flight.", snap.in_flight),
            "heteroflow_engine_sim_group_generation": ("Successful group rebuilds since start.", st.generation),
            "heteroflow_engine_sim_dead_ranks": ("Ranks in the cumulative dead set.", len(st.dead_ranks)),
        }
        for name, (doc, value) in gauges.items():
            gauge = GaugeMetricFamily(name, doc, labels=["dp_rank"])
            gauge.add_metric([rank], float(value))
            yield gauge
        counters: dict[str, tuple[str, int]] = {
            "heteroflow_engine_sim_requests_completed": ("Generations completed.", snap.completed),
            "heteroflow_engine_sim_requests_aborted": ("Generations aborted by a fault.", snap.aborted),
            "heteroflow_engine_sim_collective_faults": (
                "Collective failures reported by the worker.",
                snap.faults_seen,
            ),
        }
        for name, (doc, value) in counters.items():
            counter = CounterMetricFamily(name, doc, labels=["dp_rank"])
            counter.add_metric([rank], float(value))
            yield counter
        commands = CounterMetricFamily(
            "heteroflow_engine_sim_ft_commands", "FT commands by outcome.", labels=["dp_rank", "outcome"]
        )
        commands.add_metric([rank, "accepted"], float(snap.commands_accepted))
        commands.add_metric([rank, "rejected"], float(snap.commands_rejected))
        yield commands
