"""Wiring: settings and seams in, a ready :class:`~heteroflow.agent.runner.Agent` or probe report out.

Both commands of ``heteroflow agent`` are built here so tests can build them with fakes in place of the
vendor tools, NVML and the server.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from heteroflow.agent.client import HttpPlatformClient, PlatformClient
from heteroflow.agent.collectors import CollectorChoice, Selection, select_collector
from heteroflow.agent.commands import CommandRunner
from heteroflow.agent.kernel_xid import DevKmsg, KernelLog, KernelXidReader
from heteroflow.agent.nvidia_smi import NvidiaSmiCollector
from heteroflow.agent.nvml import NvmlApi, NvmlCollector, XidWatcher, load_pynvml
from heteroflow.agent.readings import HealthCollection
from heteroflow.agent.runner import Agent
from heteroflow.agent.scheduler import CollectionService
from heteroflow.agent.settings import AgentSettings
from heteroflow.agent.simulated import SimulatedCollector
from heteroflow.agent.tool_stalls import ToolStallTracker, WatchedRunner
from heteroflow.agent.xid_queue import XidQueue
from heteroflow.agent.xid_status import XID_NEEDS_NVML, XidCollectionStatus, not_collected, with_kernel_log
from heteroflow.contracts.counters import HEALTH_KEYS
from heteroflow.core.clock import Clock
from heteroflow.core.ids import Source


def probe_report(
    selection: Selection, health: HealthCollection, xid: XidCollectionStatus | None = None
) -> dict[str, Any]:
    """The ``agent probe --json`` document of one collection (H-16), with the XID source's state. Pure."""
    warnings = list(dict.fromkeys([*selection.warnings, *health.warnings]))
    if xid is None:
        xid = unwatched_xid_status(health.collector)
    if health.collector not in ("nvml", "none", "simulated") and health.gpus and "kernel_log" not in xid.sources:
        warnings.append(XID_NEEDS_NVML)
    if xid.state != "collected":
        warnings.append(f"XID events: {xid.state.replace('_', ' ')}: {xid.reason}")
    gpus = []
    for gpu in sorted(health.gpus, key=lambda g: g.index):
        counters = gpu.counters.as_dict()
        entry: dict[str, Any] = {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "vendor": gpu.vendor,
            "name": gpu.name,
            **{key: counters[key] for key in HEALTH_KEYS},
        }
        if gpu.semantics_unconfirmed:
            entry["semantics_unconfirmed"] = list(gpu.semantics_unconfirmed)
        if gpu.extras:
            entry["extras"] = dict(gpu.extras)
        gpus.append(entry)
    return {
        "collector": health.collector,
        "collected_at": health.collected_at.isoformat(),
        "gpus": gpus,
        "xid_events": xid.to_wire(),
        "warnings": list(dict.fromkeys(warnings)),
    }


def unwatched_xid_status(collector: str) -> XidCollectionStatus:
    """The XID state of a collector without an NVML event watcher."""
    if collector == "simulated":
        return XidCollectionStatus(state="collected", reason="simulated cards: XIDs are injected, not read")
    if collector == "none":
        return not_collected("no GPU collector is available on this node")
    return not_collected(XID_NEEDS_NVML)


def kernel_log_from(path: str) -> KernelLog | None:
    """The kernel log at ``path`` (``/dev/kmsg`` by default), or ``None`` when the setting is empty."""
    return DevKmsg(path) if path else None


def kernel_xid_reader(selection: Selection, clock: Clock, log: KernelLog | None) -> KernelXidReader | None:
    """The kernel-log XID reader for an NVIDIA collector (the lines name PCI addresses the collector maps)."""
    collector = selection.collector
    if log is None or not isinstance(collector, NvmlCollector | NvidiaSmiCollector):
        return None
    return KernelXidReader(log=log, card_map=collector.card_map, now=clock.now, monotonic=clock.monotonic)


def probe_xids(selection: Selection, clock: Clock, kernel_log: KernelLog | None = None) -> XidCollectionStatus:
    """Register for XID events once and wait briefly, as the agent would, and open the kernel log, to report
    whether XIDs can be read."""
    collector = selection.collector
    status = unwatched_xid_status(collector.name)
    nvml = isinstance(collector, NvmlCollector) and collector.api is not None
    if isinstance(collector, NvmlCollector) and collector.api is not None:
        watcher = XidWatcher(api=collector.api, clock=clock)
        try:
            if watcher.start():
                watcher.poll(0)
            status = watcher.status()
        finally:
            watcher.close()
    reader = kernel_xid_reader(selection, clock, kernel_log)
    if reader is None:
        return status
    try:
        reader.start()
        reader.poll()
        kernel = reader.status()
    finally:
        reader.close()
    return with_kernel_log(
        status, readable=kernel.readable, reason=kernel.reason, cards=kernel.cards, nvml=nvml, lost=kernel.lost
    )


def run_probe(
    choice: CollectorChoice,
    *,
    runner: CommandRunner,
    clock: Clock,
    timeout_sec: float,
    nvml_loader: Callable[[], NvmlApi] = load_pynvml,
    kernel_log: KernelLog | None = None,
) -> dict[str, Any]:
    selection = select_collector(choice, runner=runner, clock=clock, timeout_sec=timeout_sec, nvml_loader=nvml_loader)
    try:
        health = selection.first_health or selection.collector.read_health()
        return probe_report(selection, health, probe_xids(selection, clock, kernel_log))
    finally:
        selection.collector.close()


def default_node_name(*, simulated: bool) -> str:
    host = socket.gethostname().split(".")[0] or "node"
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in host).lstrip("._-") or "node"
    return f"{cleaned}-sim" if simulated else cleaned


def build_agent(
    settings: AgentSettings,
    *,
    runner: CommandRunner,
    clock: Clock,
    client: PlatformClient | None = None,
    nvml_loader: Callable[[], NvmlApi] = load_pynvml,
    kernel_log: KernelLog | None = None,
) -> Agent:
    """``kernel_log``: where the driver's ``NVRM: Xid`` lines are read (the CLI passes ``settings.kernel_log``)."""
    simulated = settings.simulate_gpus > 0
    source: Source = "simulated" if simulated else "real"
    stalls = ToolStallTracker(now=clock.now)
    runner = WatchedRunner(runner, stalls)  # every vendor-tool call says whether it answered or timed out
    hostname = settings.node_name or default_node_name(simulated=simulated)

    def select() -> Selection:
        if simulated:
            collector = SimulatedCollector(
                clock=clock, count=settings.simulate_gpus, seed=hostname, speed=settings.simulate_speed
            )
            return Selection(collector=collector, first_health=collector.read_health(), warnings=())
        return select_collector(
            settings.collector,
            runner=runner,
            clock=clock,
            timeout_sec=settings.tick_timeout_seconds,
            nvml_loader=nvml_loader,
        )

    selection = select()
    collection = CollectionService(
        selection=selection,
        clock=clock,
        heartbeat_interval_sec=settings.heartbeat_interval_seconds,
        health_interval_sec=settings.health_interval_seconds,
        tick_timeout_sec=settings.tick_timeout_seconds,
        reselect=select if settings.collector == "auto" and not simulated else None,
        stalls=stalls,
    )
    watcher = None
    if isinstance(selection.collector, NvmlCollector) and selection.collector.api is not None:
        watcher = XidWatcher(api=selection.collector.api, clock=clock)
    return Agent(
        kernel_xids=None if simulated else kernel_xid_reader(selection, clock, kernel_log),
        client=client
        or HttpPlatformClient(
            base_url=settings.server_url,
            token=settings.token,
            timeout_sec=settings.request_timeout_seconds,
            credential_path=credential_path(settings.state_dir, server_url=settings.server_url, hostname=hostname),
        ),
        collection=collection,
        xid_queue=XidQueue(settings.xid_queue_capacity),
        clock=clock,
        hostname=hostname,
        source=source,
        heartbeat_interval_sec=settings.heartbeat_interval_seconds,
        reconnect_initial_sec=settings.reconnect_initial_seconds,
        reconnect_max_sec=settings.reconnect_max_seconds,
        xid_watcher=watcher,
        xid_unwatched=unwatched_xid_status(selection.collector.name),
    )


def credential_path(state_dir: str, *, server_url: str, hostname: str) -> Path:
    """Where the credential of ``hostname`` on the server at ``server_url`` is kept: one file per pair, so that
    agents of several nodes (or servers) on one machine never read each other's. Purely computational."""
    digest = hashlib.sha256(f"{server_url.rstrip('/')}|{hostname}".encode()).hexdigest()[:16]
    return Path(state_dir).expanduser() / f"node-{digest}.credential"
