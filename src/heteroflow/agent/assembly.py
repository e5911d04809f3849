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
from heteroflow.agent.nvml import NvmlApi, NvmlCollector, XidWatcher, load_pynvml
from heteroflow.agent.readings import HealthCollection
from heteroflow.agent.runner import Agent
from heteroflow.agent.scheduler import CollectionService
from heteroflow.agent.settings import AgentSettings
from heteroflow.agent.simulated import SimulatedCollector
from heteroflow.agent.xid_queue import XidQueue
from heteroflow.core.clock import Clock
from heteroflow.core.ids import Source
from heteroflow.health.counters import HEALTH_KEYS

XID_NEEDS_NVML = "XID events are collected through NVML only; not collected with this collector"


def probe_report(selection: Selection, health: HealthCollection) -> dict[str, Any]:
    """The ``agent probe --json`` document of one collection (H-16). Pure."""
    warnings = list(dict.fromkeys([*selection.warnings, *health.warnings]))
    if health.collector not in ("nvml", "none", "simulated") and health.gpus:
        warnings.append(XID_NEEDS_NVML)
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
        "warnings": warnings,
    }


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
        return probe_report(selection, health)
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
            base_url=settings.server_url,
            token=settings.token,
            timeout_s=settings.request_timeout_seconds,
            credential_path=credential_path(settings.state_dir, server_url=settings.server_url, hostname=hostname),
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
    )


def credential_path(state_dir: str, *, server_url: str, hostname: str) -> Path:
    """Where the credential of ``hostname`` on the server at ``server_url`` is kept: one file per pair, so that
    agents of several nodes (or servers) on one machine never read each other's. Purely computational."""
    digest = hashlib.sha256(f"{server_url.rstrip('/')}|{hostname}".encode()).hexdigest()[:16]
    return Path(state_dir).expanduser() / f"node-{digest}.credential"
