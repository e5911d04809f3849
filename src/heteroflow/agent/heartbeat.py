"""The heartbeat payload, built from what the caches hold now. Purely computational, no side effects.

Each stat carries its own declared physical ``index`` and the hardware ``uuid`` (H-14); health keys are
present only when known and fresh — absent means unknown (H-1), and the server never reads absence as 0.
``sampled_at`` is the collection time of the health reading, not the send time, so a beat repeating a
60 s reading does not pretend it was measured just now.

The body is built through the wire contract the server validates (``heteroflow.contracts.heartbeat``): each
stat as a :class:`GpuStat`, each event as an :class:`XidEventIn`, the whole as a :class:`Heartbeat`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heteroflow.agent.readings import GpuHealth, GpuTelemetry, HealthCollection, TelemetryCollection
from heteroflow.agent.tool_stalls import ToolStall
from heteroflow.agent.xid_queue import Pending
from heteroflow.agent.xid_status import XidCollectionStatus
from heteroflow.contracts.counters import HEALTH_KEYS
from heteroflow.contracts.heartbeat import MAX_XID_EVENTS, GpuStat, Heartbeat, XidEventIn

MAX_XID_EVENTS_PER_BEAT = MAX_XID_EVENTS
"""The server accepts at most this many events in one beat; the rest wait for the next."""


def _iso(value: Any) -> str:
    return str(value.isoformat())


def gpu_stats(health: HealthCollection | None, telemetry: TelemetryCollection | None) -> list[GpuStat]:
    """One stat per card seen by either collection, in index order."""
    by_health: dict[int, GpuHealth] = {gpu.index: gpu for gpu in (health.gpus if health else ())}
    by_telemetry: dict[int, GpuTelemetry] = {gpu.index: gpu for gpu in (telemetry.gpus if telemetry else ())}
    stats: list[GpuStat] = []
    for index in sorted(by_health.keys() | by_telemetry.keys()):
        h = by_health.get(index)
        t = by_telemetry.get(index)
        stat: dict[str, Any] = {"index": index, "uuid": (h.uuid if h else None) or (t.uuid if t else None)}
        if t is not None and telemetry is not None:
            stat.update(
                telemetry_at=_iso(telemetry.collected_at),
                temperature_c=t.temperature_c,
                utilization_pct=t.utilization_pct,
                memory_used_mib=t.memory_used_mib,
                memory_total_mib=t.memory_total_mib,
                power_w=t.power_w,
            )
        if h is not None and health is not None:
            known = {key: value for key, value in h.counters.as_dict().items() if value is not None}
            if known:
                stat["sampled_at"] = _iso(health.collected_at)
                stat.update({key: known[key] for key in HEALTH_KEYS if key in known})
                if h.semantics_unconfirmed:
                    stat["semantics_unconfirmed"] = list(h.semantics_unconfirmed)
        stats.append(GpuStat(**stat))  # only the values set here travel: an absent key stays absent
    return stats


def xid_payload(events: Sequence[Pending]) -> list[XidEventIn]:
    return [
        XidEventIn(
            index=item.event.index,
            uuid=item.event.uuid,
            xid=item.event.xid,
            occurred_at=_iso(item.event.occurred_at),
        )
        for item in events
    ]


def heartbeat(
    *,
    health: HealthCollection | None,
    telemetry: TelemetryCollection | None,
    xid_events: Sequence[Pending],
    xid_collection: XidCollectionStatus | None = None,
    tool_stalls: Sequence[ToolStall] = (),
) -> Heartbeat:
    """The beat as the server's model: each stat and event carries exactly the values the agent set."""
    fields: dict[str, Any] = {
        "gpu_stats": [stat.model_dump(exclude_unset=True) for stat in gpu_stats(health, telemetry)],
        "xid_events": [event.model_dump(exclude_unset=True) for event in xid_payload(xid_events)],
    }
    if xid_collection is not None:
        fields["xid_collection"] = xid_collection.to_wire()
    if tool_stalls:  # absent while every tool answers: the common beat stays as it was
        fields["tool_stalls"] = [stall.to_wire() for stall in tool_stalls]
    return Heartbeat.model_validate(fields)


def heartbeat_body(
    *,
    health: HealthCollection | None,
    telemetry: TelemetryCollection | None,
    xid_events: Sequence[Pending],
    xid_collection: XidCollectionStatus | None = None,
    tool_stalls: Sequence[ToolStall] = (),
) -> dict[str, Any]:
    """The JSON body of one beat: :func:`heartbeat` without the fields the agent did not set."""
    beat = heartbeat(
        health=health,
        telemetry=telemetry,
        xid_events=xid_events,
        xid_collection=xid_collection,
        tool_stalls=tool_stalls,
    )
    return beat.model_dump(mode="json", exclude_unset=True)
