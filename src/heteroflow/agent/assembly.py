"""Wiring: settings and seams in, a ready :class:`~heteroflow.agent.runner.Agent` or probe report out.

Both commands of ``heteroflow agent`` are built here so tests can build them with fakes in place of the
vendor tools, NVML and the server.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from heteroflow.agent.client import HttpPlatformClient, PlatformClient
from heteroflow.agent.collectors import CollectorChoice, Selection, select_collector
from heteroflow.agent.commands import CommandRunner
from heteroflow.agent.nvml import NvmlApi, NvmlCollector, XidWatcher, load_pynvml
from heteroflow.agent.readings import HealthCollection
from heteroflow.agent.runner import Agent
from heteroflow.agent.scheduler import CollectionService
from heteroflow.agent.settings import AgentSettings
from heteroflow.agent.simulated import SimulatedCollector
from heteroflow.agent.xid_queue import XidQueue
from heteroflow.agent.xid_status import XID_NEEDS_NVML, XidCollectionStatus, not_collected
from heteroflow.core.clock import Clock
from heteroflow.core.ids import Source
from heteroflow.health.counters import HEALTH_KEYS


def probe_report(
    selection: Selection, health: HealthCollection, xid: XidCollectionStatus | None = None
) -> dict[str, Any]:
    """The ``agent probe --json`` document of one collection (H-16), with the XID source's state. Pure."""
    warnings = list(dict.fromkeys([*selection.warnings, *health.warnings]))
    if health.collector not in ("nvml", "none", "simulated") and health.gpus:
        warnings.append(XID_NEEDS_NVML)
    if xid is None:
        xid = unwatched_xid_status(health.collector)
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


def probe_xids(selection: Selection, clock: Clock) -> XidCollectionStatus:
    """Register for XID events once and wait briefly, as the agent would, to report whether XIDs can be read."""
    collector = selection.collector
    if not isinstance(collector, NvmlCollector) or collector.api is None:
        return unwatched_xid_status(collector.name)
    watcher = XidWatcher(api=collector.api, clock=clock)
    try:
        if watcher.start():
            watcher.poll(0)
        return watcher.status()
    finally:
        watcher.close()


def run_probe(
    choice: CollectorChoice,
    *,
    runner: CommandRunner,
    clock: Clock,
    timeout_s: float,
    nvml_loader: Callable[[], NvmlApi] = load_pynvml,
) -> dict[str, Any]:
    selection = select_collector(choice, runner=runner, clock=clock, timeout_s=timeout_s, nvml_loader=nvml_loader)
    try:
        health = selection.first_health or selection.collector.read_health()
        return probe_report(selection, health, probe_xids(selection, clock))
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
) -> Agent:
    simulated = settings.simulate_gpus > 0
    source: Source = "simulated" if simulated else "real"
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
            timeout_s=settings.tick_timeout_seconds,
            nvml_loader=nvml_loader,
        )

    selection = select()
    collection = CollectionService(
        selection=selection,
        clock=clock,
        heartbeat_interval_s=settings.heartbeat_interval_seconds,
        health_interval_s=settings.health_interval_seconds,
        tick_timeout_s=settings.tick_timeout_seconds,
        reselect=select if settings.collector == "auto" and not simulated else None,
    )
    watcher = None
    if isinstance(selection.collector, NvmlCollector) and selection.collector.api is not None:
        watcher = XidWatcher(api=selection.collector.api, clock=clock)
    return Agent(
        client=client
        or HttpPlatformClient(
            base_url=settings.server_url, token=settings.token, timeout_s=settings.request_timeout_seconds
        ),
        collection=collection,
        xid_queue=XidQueue(settings.xid_queue_capacity),
        clock=clock,
        hostname=hostname,
        source=source,
        heartbeat_interval_s=settings.heartbeat_interval_seconds,
        reconnect_initial_s=settings.reconnect_initial_seconds,
        reconnect_max_s=settings.reconnect_max_seconds,
        xid_watcher=watcher,
        xid_unwatched=unwatched_xid_status(selection.collector.name),
    )
