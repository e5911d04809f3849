"""What an operator sees of a running local cluster: the live terminal view of ``heteroflow up``, its plain
line-by-line form when stdout is not a terminal, and ``heteroflow status``.

Everything comes from the controller's status and rounds routes (:class:`Snapshot`); the rendering functions
are pure (snapshot in, rich renderable or text lines out) so they are tested without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.state import ClusterState, InstanceState

EVENTS_SHOWN = 10
_PHASE_STYLE = {
    "NORMAL": "green",
    "SCALED_DOWN_RUNNING": "yellow",
    "DISABLED": "dim",
    "RECONFIGURING": "red",
}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One poll of the controller: its status entries, and per instance the newest round's timeline."""

    entries: dict[str, dict[str, Any]]
    latest_round: dict[str, dict[str, Any]] = field(default_factory=dict)
    engines: dict[str, dict[int, str]] = field(default_factory=dict)
    """instance id → rank → what its NodeManager sees (``engine_state``); missing when it did not answer."""
    error: str | None = None
    """Why the controller could not be read (it is starting, or gone)."""


def engine_state(endpoint: dict[str, Any]) -> str:
    """One rank as its NodeManager sees it: retired, stopped, starting, or the last FT status poll. Pure."""
    if endpoint.get("retired"):
        return "retired"
    if not endpoint.get("running"):
        return "stopped"
    if not endpoint.get("ready"):
        return "starting"
    return str(endpoint.get("ft_status", "unknown"))


def take_snapshot(client: ClusterClient) -> Snapshot:
    """Read the controller's status and newest round per instance, and each NodeManager's engines."""
    engines: dict[str, dict[int, str]] = {}
    for inst in client.state.instances:
        for pod in inst.pods:
            try:
                status = client.node_manager_status(pod.node_manager_url)
            except ClusterUnreachableError:
                continue
            for endpoint in status.get("endpoints", []):
                engines.setdefault(inst.instance_id, {})[int(endpoint["endpoint_id"])] = engine_state(endpoint)
    try:
        entries = {str(e["instance_id"]): e for e in client.controller_status()}
        latest = {}
        for instance_id in entries:
            rounds = client.rounds(instance_id)
            if rounds:
                latest[instance_id] = client.round(str(rounds[-1]["request_id"]))
    except ClusterUnreachableError as exc:
        return Snapshot(entries={}, engines=engines, error=str(exc))
    return Snapshot(entries=entries, latest_round=latest, engines=engines)


def _detail(event: dict[str, Any]) -> str:
    skip = {"at", "t_sec", "kind"}
    parts = []
    for key, value in event.items():
        if key in skip:
            continue
        if key == "body" and isinstance(value, dict):
            value = value.get("params", value)
        parts.append(f"{key}={value}")
    text = " ".join(parts)
    return text if len(text) <= 110 else text[:107] + "..."


def engine_line(entry: dict[str, Any]) -> str:
    """What the instance's engines speak and can do (``engine_capability``), in one line. Pure."""
    capability = entry.get("engine_capability")
    if not isinstance(capability, dict):
        return "engines: not known yet"
    profile = capability.get("protocol_profile") or "not discovered yet"

    def flag(key: str) -> str:
        value = capability.get(key)
        return "unknown" if value is None else "supported" if value else "unsupported"

    return (
        f"engines: {profile}   scale-down {flag('scale_down_supported')}   retry {flag('retry_supported')}"
        f"   elastic EP {flag('elastic_ep_supported')}"
    )


def rank_rows(
    entry: dict[str, Any], inst: InstanceState | None, engines: dict[int, str] | None = None
) -> list[tuple[str, ...]]:
    """(rank, pod, engine status, serving, note) per original rank: the NodeManager's view of the engine when
    there is one, else the controller's last known status. Pure."""
    dead = set(entry.get("dead_committed", []))
    pending = set(entry.get("pending_removed_ranks", []))
    published = set(entry.get("published_endpoints", []))
    statuses = {int(k): str(v) for k, v in (entry.get("engine_statuses") or {}).items()} | (engines or {})
    rows: list[tuple[str, ...]] = []
    for rank in entry.get("original_dp_ranks", []):
        pod = ""
        if inst is not None:
            try:
                pod = inst.endpoint(rank).pod
            except KeyError:
                pod = "?"
        note = "removed (committed)" if rank in dead else "removal pending" if rank in pending else ""
        rows.append((str(rank), pod, statuses.get(rank, "-"), "yes" if rank in published else "no", note))
    return rows


def instance_panel(
    entry: dict[str, Any],
    inst: InstanceState | None,
    latest: dict[str, Any] | None,
    engines: dict[int, str] | None = None,
) -> Panel:
    phase = str(entry.get("phase"))
    table = Table(expand=False, box=None, padding=(0, 2))
    for column in ("rank", "pod", "engine", "published", ""):
        table.add_column(column)
    for row in rank_rows(entry, inst, engines):
        style = "red" if row[4] else ("green" if row[3] == "yes" else "")
        table.add_row(*row, style=style)
    facts = Text()
    facts.append("phase ", style="bold")
    facts.append(phase, style=_PHASE_STYLE.get(phase, "cyan"))
    facts.append(f"   can_serve {'yes' if entry.get('can_serve') else 'no'}")
    facts.append(f"   dead_committed {entry.get('dead_committed', [])}")
    facts.append(f"   generation {entry.get('generation', 0)}")
    lines: list[RenderableType] = [
        facts,
        Text(engine_line(entry), style="dim"),
        table,
        Text(f"last decision: {entry.get('last_decision')}", style="dim"),
    ]
    if entry.get("last_error"):
        lines.append(Text(f"last error: {entry['last_error']}", style="red"))
    if latest is not None:
        outcome = latest.get("outcome") or "running"
        lines.append(Text(f"round {latest.get('request_id')} ({latest.get('kind')}): {outcome}", style="bold"))
        events = Table(box=None, padding=(0, 1), show_header=False)
        events.add_column(justify="right", style="dim")
        events.add_column(style="cyan")
        events.add_column(overflow="fold")
        for event in latest.get("events", [])[-EVENTS_SHOWN:]:
            events.add_row(f"+{event.get('t_sec', 0):.2f}s", str(event.get("kind")), _detail(event))
        lines.append(events)
    return Panel(Group(*lines), title=str(entry.get("instance_id")), title_align="left")


def render(snapshot: Snapshot, state: ClusterState) -> RenderableType:
    """The whole live view."""
    header = Text(
        f"platform {state.server_url}   controller {state.controller_url}   coordinator {state.coordinator_url}",
        style="dim",
    )
    if snapshot.error is not None:
        return Group(header, Text(f"controller unreachable: {snapshot.error}", style="red"))
    known = {inst.instance_id: inst for inst in state.instances}
    panels = [
        instance_panel(
            entry, known.get(instance_id), snapshot.latest_round.get(instance_id), snapshot.engines.get(instance_id)
        )
        for instance_id, entry in snapshot.entries.items()
    ]
    missing = [i for i in known if i not in snapshot.entries]
    if not panels and not missing:
        return Group(header, Text("the controller knows no instance yet", style="yellow"))
    extra = [Text(f"{i}: not assembled yet (NodeManagers registering)", style="yellow") for i in missing]
    return Group(header, *panels, *extra)


@dataclass
class LineLog:
    """The plain form of the live view: one line per change, for logs and pipes. Not pure (it remembers
    what it printed), but it never does I/O: :meth:`lines` returns what to print."""

    _last: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    _events_seen: dict[str, int] = field(default_factory=dict)
    _error: str | None = None

    def lines(self, snapshot: Snapshot) -> list[str]:
        out: list[str] = []
        if snapshot.error != self._error:
            self._error = snapshot.error
            if snapshot.error is not None:
                out.append(f"controller unreachable: {snapshot.error}")
        for instance_id, entry in snapshot.entries.items():
            key = (
                entry.get("phase"),
                entry.get("can_serve"),
                tuple(entry.get("published_endpoints", [])),
                tuple(entry.get("dead_committed", [])),
                entry.get("last_error"),
                engine_line(entry),
            )
            if self._last.get(instance_id) != key:
                self._last[instance_id] = key
                out.append(
                    f"[{instance_id}] phase={key[0]} can_serve={key[1]} published={list(key[2])} "
                    f"dead_committed={list(key[3])}" + (f" last_error={key[4]}" if key[4] else "") + f" {key[5]}"
                )
            latest = snapshot.latest_round.get(instance_id)
            if latest is not None:
                request_id = str(latest.get("request_id"))
                events = latest.get("events", [])
                seen = self._events_seen.get(request_id, 0)
                for event in events[seen:]:
                    out.append(
                        f"[{instance_id}] {request_id} +{event.get('t_sec', 0):.2f}s {event.get('kind')} "
                        f"{_detail(event)}"
                    )
                self._events_seen[request_id] = len(events)
        return out
