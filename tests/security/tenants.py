"""A platform server with tenants and their data, seeded the way production fills it.

Registration and heartbeats (GPU stats, XID events) go through the real routes; ten days of health history go
through the real sample store; predictions and alerts come from one real prediction-worker tick. Every step runs
at the same fake-clock time in every world, tenant by tenant in the same order, so that a world holding tenants
``alpha`` and ``bravo`` and a world holding ``alpha`` alone give ``alpha`` the same data, and a tenant's view of
each can be compared.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.simulation import Profile, series
from heteroflow.storage.health_store import SqlHealthSampleStore
from tests.security.services import platform_server
from tests.support.harness import Harness

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOSTS_PER_TENANT = 2
TENANT_SCOPES = "nodes:read,nodes:write,agent,alerts:write,metrics:read"
"""Every scope but admin: the strongest token a tenant normally holds."""


@dataclass
class Tenant:
    name: str
    agent: str
    """Token with the ``agent`` scope, bound to this tenant."""
    member: str
    """Token with every scope but ``admin``, bound to this tenant."""
    admin: str
    """Token with the ``admin`` scope, bound to this tenant."""
    nodes: dict[str, str] = field(default_factory=dict)
    """Hostname → node id."""
    alerts: dict[str, str] = field(default_factory=dict)
    """Alert id → a label that is the same in every world."""
    predictions: dict[str, str] = field(default_factory=dict)
    """Prediction id (derived from the node id, so different in every world) → a label that is not."""
    tenant_id: str = ""

    @property
    def uuids(self) -> list[str]:
        return [card_uuid(host, index) for host in self.nodes for index in (0, 1)]

    def identifiers(self) -> list[str]:
        """Every string that names this tenant or one of its things."""
        return [
            self.name,
            self.tenant_id,
            *self.nodes,
            *self.nodes.values(),
            *self.alerts,
            *self.predictions,
            *self.uuids,
        ]


@dataclass
class World:
    harness: Harness
    tenants: dict[str, Tenant]
    operator: str
    """Token with the ``admin`` scope and no tenant."""

    @property
    def app(self) -> FastAPI:
        app = self.harness.client.app
        assert isinstance(app, FastAPI)
        return app

    def aliases(self) -> dict[str, str]:
        """Ids that differ between worlds (random uuids) → names that do not."""
        found: dict[str, str] = {}
        for tenant in self.tenants.values():
            found[tenant.tenant_id] = f"<tenant {tenant.name}>"
            found |= {node_id: f"<node {host}>" for host, node_id in tenant.nodes.items()}
            found |= {alert_id: f"<alert {label}>" for alert_id, label in tenant.alerts.items()}
            found |= {prediction_id: f"<prediction {label}>" for prediction_id, label in tenant.predictions.items()}
        return found

    def normalized(self, text: str) -> Any:
        """A response body with every world-specific id replaced by its name, lists sorted, and the cursor (a row
        position in the whole table) masked, for comparison with another world."""
        for raw, alias in self.aliases().items():
            text = text.replace(raw, alias)
        try:
            value = json.loads(text)
        except ValueError:  # CSV: rows come in id order too, so compare them as a sorted list under the header
            header, _, rows = text.partition("\n")
            return [header, *sorted(rows.splitlines())]
        return _masked(value)


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: "<cursor>" if key == "next_cursor" else "<row id>" if key == "id" and isinstance(item, int) else
            _masked(item)
            for key, item in value.items()
        }  # fmt: skip
    if isinstance(value, list):  # in id order, and ids differ between worlds
        return sorted((_masked(item) for item in value), key=lambda item: json.dumps(item, sort_keys=True))
    return value


def card_uuid(host: str, index: int) -> str:
    return f"GPU-{host}-{index}"


def _stats(host: str, *, uncorrected: int) -> list[dict[str, Any]]:
    return [
        {
            "index": index,
            "uuid": card_uuid(host, index),
            "temperature_c": 61 + index,
            "utilization_pct": 90,
            "memory_used_mib": 40_000,
            "memory_total_mib": 81_559,
            "power_w": 350.5,
            "ecc_corrected_total": 7,
            "ecc_uncorrected_total": uncorrected if index == 1 else 0,
            "retired_pages": 0,
            "remapped_rows_pending": 0,
            "remapped_rows_failure": 0,
        }
        for index in (0, 1)
    ]


def _write_history(harness: Harness, node_id: str, host: str) -> None:
    """Eight days of samples every 30 minutes, ending an hour ago: card 0 degrading, card 1 healthy."""
    end = harness.clock.now() - timedelta(hours=1)
    profiles: tuple[tuple[int, Profile], ...] = ((0, "degrading"), (1, "healthy"))
    for index, profile in profiles:
        key = CardKey(node_id=NodeId(node_id), gpu_index=index, source="real")
        SqlHealthSampleStore(harness.ctx.engine).insert(
            [
                HealthReading(
                    key=key,
                    uuid=card_uuid(host, index),
                    sampled_at=sample.sampled_at,
                    counters=Counters(**sample.counters.as_dict()),
                )
                for sample in list(series(profile, card=index, start=end - timedelta(days=8), end=end))[::6]
            ]
        )


def _beat(harness: Harness, tenant: Tenant, *, uncorrected: int, xid: bool) -> None:
    for host, node_id in tenant.nodes.items():
        extra: dict[str, Any] = {}
        if xid:
            at = (harness.clock.now() - timedelta(seconds=30)).isoformat()
            extra["xid_events"] = [{"index": 0, "uuid": card_uuid(host, 0), "xid": 79, "occurred_at": at}]
        response = harness.beat(tenant.agent, node_id, _stats(host, uncorrected=uncorrected), **extra)
        assert response.status_code == 200, response.text


def seed(harness: Harness, names: list[str]) -> World:
    operator = harness.token("admin")
    tenants = {
        name: Tenant(
            name=name,
            agent=harness.token("agent", tenant=name),
            member=harness.token(TENANT_SCOPES, tenant=name),
            admin=harness.token("admin", tenant=name),
        )
        for name in names
    }
    for tenant in tenants.values():
        for number in range(1, HOSTS_PER_TENANT + 1):
            host = f"{tenant.name}-gpu-{number}"
            tenant.nodes[host] = harness.register(tenant.agent, host, gpu_count=2)
            _write_history(harness, tenant.nodes[host], host)
    for tenant in tenants.values():
        _beat(harness, tenant, uncorrected=0, xid=True)
    harness.drain()
    harness.clock.advance(61)
    for tenant in tenants.values():
        _beat(harness, tenant, uncorrected=1, xid=False)  # an uncorrectable-ECC increase on card 1
    harness.drain()
    harness.flush_metrics()
    harness.ctx.worker.tick()
    harness.maintain()
    world = World(harness=harness, tenants=tenants, operator=operator)
    _learn_ids(world)
    return world


def _learn_ids(world: World) -> None:
    h = world.harness
    nodes = h.get(world.operator, "/api/v1/nodes", limit=1000).json()["items"]
    alerts = h.get(world.operator, "/api/v1/alerts", limit=500).json()["items"]
    predictions = h.get(world.operator, "/api/v1/gpu-health/predictions", limit=500).json()["items"]
    for tenant in world.tenants.values():
        mine = [node for node in nodes if node["name"] in tenant.nodes]
        assert len(mine) == HOSTS_PER_TENANT
        tenant.tenant_id = mine[0]["tenant_id"]
        names = {node_id: host for host, node_id in tenant.nodes.items()}
        for alert in alerts:
            if alert["node_id"] in names:
                tenant.alerts[alert["id"]] = f"{names[alert['node_id']]} {alert['type']}"
        for prediction in predictions:
            if prediction["node_id"] in names:
                label = f"{names[prediction['node_id']]} {prediction['gpu_index']} {prediction['t0']}"
                tenant.predictions[str(prediction["id"])] = label
        assert tenant.alerts, f"the seed raised no alert for {tenant.name}"
        assert tenant.predictions, f"the seed made no prediction for {tenant.name}"


@contextlib.contextmanager
def world(folder: Path, names: list[str]) -> Iterator[World]:
    with platform_server(folder, start=T0) as harness:
        yield seed(harness, names)
