"""What the platform's ``/metrics`` reads from the database at scrape time: open alerts and node heartbeats.

Two small statements per scrape, whatever the fleet's size in samples: a grouped count of the open alerts (the
``alerts`` table's ``(status, created_at)`` index) and one row per node. Prometheus alerting rules are written on
these series (``deploy/prometheus/heteroflow-alerts.yaml``), so they must not depend on which server replica
delivered an alert or received a beat.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.storage.db import unavailable_as_store_error
from heteroflow.storage.schema import alerts, nodes


@dataclass(frozen=True, slots=True)
class OpenAlertCount:
    type: str
    severity: str
    count: int
    backlogged: int
    """Open alerts flagged as backlog (open longer than the backlog limit, 72 h): a person must look at them."""


@dataclass(frozen=True, slots=True)
class NodeHeartbeat:
    node_name: str
    source: str
    last_heartbeat_at: datetime | None
    """As flushed to the database (the liveness flush interval behind the newest beat); ``None``: never."""


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    open_alerts: tuple[OpenAlertCount, ...]
    heartbeats: tuple[NodeHeartbeat, ...]


class SqlFleetStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def snapshot(self) -> FleetSnapshot:
        counted = (
            sa.select(
                alerts.c.type,
                alerts.c.severity,
                sa.func.count(),
                sa.func.count(alerts.c.backlog_since),
            )
            .where(alerts.c.status == "open")
            .group_by(alerts.c.type, alerts.c.severity)
            .order_by(alerts.c.type, alerts.c.severity)
        )
        beats = sa.select(nodes.c.name, nodes.c.source, nodes.c.last_heartbeat_at).order_by(nodes.c.name)
        with unavailable_as_store_error(), self._engine.connect() as conn:
            open_alerts = tuple(
                OpenAlertCount(type=str(t), severity=str(s), count=int(n), backlogged=int(b))
                for t, s, n, b in conn.execute(counted)
            )
            heartbeats = tuple(
                NodeHeartbeat(node_name=str(name), source=str(source), last_heartbeat_at=at)
                for name, source, at in conn.execute(beats)
            )
        return FleetSnapshot(open_alerts=open_alerts, heartbeats=heartbeats)
