"""The controller's ResourceMonitor: hardware fault sources feeding ``Controller.hardware_fault`` (F-3, F-12).

- :mod:`.base` — the source interface, the edge detector (level states → appear / clear reports) and the
  monitor that runs the sources and survives them.
- :mod:`.mindcluster` — the MindCluster ConfigMap and Node parser, and the directory source.
- :mod:`.kube` — the same documents through a Kubernetes watch.
- :mod:`.gpu_health` — the platform server's XID / uncorrectable-error feed.
- :mod:`.settings` — ``HETEROFLOW_MONITOR_…``.

See ``docs/resource-monitor.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from heteroflow.core.clock import Clock
from heteroflow.serving.controller.core.topology import InstanceTopology

from .base import (
    EdgeDetector,
    HardwareSource,
    MonitorStatus,
    Problem,
    ReportSink,
    ResourceMonitor,
    Snapshot,
    SourceStatus,
)
from .gpu_health import GpuHealthSource
from .kube import KubernetesApi, KubernetesSource
from .mindcluster import DirectorySource, HostsInstance
from .settings import ResourceMonitorSettings


def hosting_nodes(topologies: Callable[[], Iterable[InstanceTopology]]) -> HostsInstance:
    """``hosts_instance`` answered from the assembled instances: a node hosts a running instance when one of
    the instance's pods registered that node name (PreSeparateNPU's downgrade to L2)."""

    def hosts(node_name: str) -> bool:
        return any(pod.node_name == node_name for topology in topologies() for pod in topology.pods)

    return hosts


def build_monitor(
    settings: ResourceMonitorSettings, *, sink: ReportSink, hosts_instance: HostsInstance, clock: Clock
) -> ResourceMonitor:
    """The monitor with every source the settings switch on (possibly none: then it does nothing)."""
    sources: list[HardwareSource] = []
    if settings.kube_enabled:
        namespace, kubeconfig = settings.kube_namespace, settings.kubeconfig
        sources.append(
            KubernetesSource(
                api_factory=lambda: KubernetesApi(namespace=namespace, kubeconfig=kubeconfig),
                hosts_instance=hosts_instance,
                namespace=namespace,
                name_prefix=settings.kube_name_prefix,
                watch_nodes=settings.kube_watch_nodes,
                watch_timeout_sec=settings.kube_watch_timeout_sec,
            )
        )
    if settings.directory:
        sources.append(
            DirectorySource(
                Path(settings.directory).expanduser(),
                poll_sec=settings.directory_poll_sec,
                hosts_instance=hosts_instance,
                name_prefix=settings.kube_name_prefix,
                clock=clock,
            )
        )
    if settings.platform_url:
        sources.append(
            GpuHealthSource(
                base_url=settings.platform_url,
                token=settings.platform_token,
                poll_sec=settings.platform_poll_sec,
                hold_sec=settings.platform_fault_hold_sec,
                lookback_sec=settings.platform_lookback_sec,
                platform_source=settings.platform_source,
                trusted_tenant=settings.platform_tenant_id,
                new_fault_interval_sec=settings.platform_new_fault_interval_sec,
                clock=clock,
            )
        )
    return ResourceMonitor(sources=sources, sink=sink, clock=clock)


__all__ = [
    "DirectorySource",
    "EdgeDetector",
    "GpuHealthSource",
    "HardwareSource",
    "KubernetesSource",
    "MonitorStatus",
    "Problem",
    "ResourceMonitor",
    "ResourceMonitorSettings",
    "Snapshot",
    "SourceStatus",
    "build_monitor",
    "hosting_nodes",
]
