"""A live HeteroFlow server with the web router, seeded through the real stores, for the browser tests.

Everything is relative to the real clock (the page computes hours up to "now" and the API judges stalls against
it). The data covers every row of the seed's page table: sufficient and insufficient statistics, more than one page
of predictions with recognised and unrecognised evidence, ECC series with stale, reset and swapped hours, a
truncated series, a stalled card, nodes with unsampled GPUs, two tenants, simulated data and alerts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import httpx2 as httpx
import uvicorn
from fastapi import FastAPI

from heteroflow.core.clock import SystemClock
from heteroflow.core.ids import NodeId, Source, TenantId
from heteroflow.core.testing import free_port
from heteroflow.health.counters import Counters
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.samples import Card, CardKey, HealthReading
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.health.simulation import Profile, series
from heteroflow.http.tls import client_tls
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.assembly import build_context, create_app
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.routes import web
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.prediction_store import PredictionRecord
from heteroflow.storage.token_store import SqlTokenStore

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
STEP = timedelta(minutes=5)


@dataclass(frozen=True)
class Seeded:
    base_url: str
    ctx: ServerContext
    now: datetime
    reader: str
    """tenant acme: nodes:read + alerts:write"""
    readonly: str
    """tenant acme: nodes:read only (resolving is 403)"""
    other_reader: str
    """tenant other: nodes:read"""
    empty_reader: str
    """tenant empty (no nodes): nodes:read"""
    nodes: dict[str, str]
    """node name → id"""
    resolvable_alert: str
    """an open alert on gpu-b the resolve test closes"""
    agent: str
    """tenant acme: agent (heartbeats)"""

    def beat(self, node: str) -> None:
        """One heartbeat: the node reads online for the next 30 seconds."""
        response = httpx.post(
            f"{self.base_url}/api/v1/nodes/{self.nodes[node]}/heartbeat",
            json={"gpu_stats": []},
            headers={"Authorization": f"Bearer {self.agent}"},
            verify=client_tls(),
        )
        response.raise_for_status()


def build_app(ctx: ServerContext) -> FastAPI:
    app = create_app(ctx, run_worker=False)
    app.include_router(web.router)
    return app


@contextlib.contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="web-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def _write(ctx: ServerContext, key: CardKey, rows: list[tuple[datetime, str | None, Counters]]) -> None:
    readings = [HealthReading(key=key, uuid=uuid, sampled_at=at, counters=c) for at, uuid, c in rows]
    for first in range(0, len(readings), 5000):
        ctx.samples.insert(readings[first : first + 5000])


def _profile(ctx: ServerContext, key: CardKey, profile: Profile, *, card: int, start: datetime, end: datetime) -> None:
    _write(ctx, key, [(s.sampled_at, s.uuid, s.counters) for s in series(profile, card=card, start=start, end=end)])


def _awkward_ecc_series(now: datetime) -> list[tuple[datetime, str | None, Counters]]:
    """30 hours of corrected ECC with a 3-hour gap, a driver reset and a card swap (each an unknown hour)."""
    rows: list[tuple[datetime, str | None, Counters]] = []
    at = (now - 30 * HOUR).replace(minute=0, second=0, microsecond=0)
    corrected = 100
    uuid = "GPU-awkward-A"
    while at <= now:
        age = now - at
        corrected += 1
        if 17 * HOUR < age <= 20 * HOUR:  # collection gap: the hours around it are stale
            at += STEP
            continue
        if 12 * HOUR - STEP < age <= 12 * HOUR:  # driver reload: the counter starts again
            corrected = 0
        if 6 * HOUR - STEP < age <= 6 * HOUR:  # the slot now holds another physical card
            uuid, corrected = "GPU-awkward-B", 500
        rows.append((at, uuid, Counters(ecc_uncorrected_total=0, ecc_corrected_total=corrected)))
        at += STEP
    return rows


def _predictions(now: datetime, node: str) -> list[PredictionRecord]:
    """60 real predictions on gpu-a: 7-day band sufficient (22 matured), 30-day band not (2 matured)."""
    evidences = [
        "strong signal [uncorrectable_ecc]: uncorrectable ECC total 3 > 0",
        "trend signal [corrected_ecc_growth]: Δ24h 96 ≥ 32 and ≥ 1.2x the 7-day daily mean 41.0",
        "weak signal [temperature_high]: 91 °C, strong signal [remap_failure]: looks alarming\n"
        "trend signal [retired_pages_growth]: retired pages 0 → 2 in 7 days",
        "operator note: investigate the card",
    ]
    plan: list[tuple[str, int]] = (
        [("hit", 7)] * 16
        + [("miss", 7)] * 6
        + [("voided", 7)] * 3
        + [("pending", 7)] * 33
        + [("hit", 30), ("miss", 30)]
    )
    records = []
    for i, (status, window) in enumerate(plan):
        t0 = now - timedelta(days=9) + i * timedelta(minutes=7)
        records.append(
            PredictionRecord(
                id=f"seeded-{i:03d}",
                card=Card(
                    node_id=NodeId(node), gpu_index=1 + i % 2, uuid=f"SIM-healthy-{1 + i % 2:04d}", source="real"
                ),
                rule_version="v1-ecc-growth" if i % 10 else "v0-initial",
                window_days=window,
                t0=t0,
                window_end=t0 + window * DAY,
                status=status,  # type: ignore[arg-type]
                signals=(),
                evidence=evidences[i % len(evidences)],
                created_at=t0,
                judged_at=None,
                conclusion=None,
                alert_id=None,
            )
        )
    return records


@contextlib.contextmanager
def seeded_server(tmp: Path) -> Iterator[Seeded]:
    engine = create_db_engine(f"sqlite:///{tmp / 'web.db'}")
    upgrade_database(engine)
    settings = ServerSettings.load(database_url=str(engine.url))
    ctx = build_context(
        settings=settings,
        health_settings=HealthStorageSettings.load(),
        prediction_settings=PredictionSettings.load(),
        delivery_settings=AlertDeliverySettings.load(),
        clock=SystemClock(),
        engine=engine,
    )
    now = SystemClock().now()
    tokens = SqlTokenStore(engine)
    acme = tokens.ensure_tenant("acme", now=now)[0]
    other = tokens.ensure_tenant("other", now=now)[0]
    empty = tokens.ensure_tenant("empty", now=now)[0]

    def token(scopes: str, tenant: TenantId | None) -> str:
        return tokens.create_token(name="web-test", scopes=parse_scopes(scopes), tenant_id=tenant, now=now)[1]

    def node(name: str, vendor: str, model: str, gpus: int, source: Source, tenant: TenantId) -> str:
        record = ctx.nodes.register(
            name=name, vendor=vendor, model=model, gpu_count=gpus, source=source, tenant_id=tenant, now=now
        ).node
        return record.id

    nodes = {
        "gpu-a": node("gpu-a", "nvidia", "H100 80GB HBM3", 8, "real", acme),
        "gpu-b": node("gpu-b", "kunlunxin", "P800", 2, "real", acme),
        "gpu-big": node("gpu-big", "nvidia", "H200", 1, "real", acme),
        "gpu-other": node("gpu-other", "nvidia", "L40S", 4, "real", other),
        "sim-demo": node("sim-demo", "nvidia", "simulated", 8, "simulated", acme),
    }

    def key(name: str, index: int, source: Source = "real") -> CardKey:
        return CardKey(node_id=NodeId(nodes[name]), gpu_index=index, source=source)

    start = now - 10 * DAY
    _profile(ctx, key("gpu-a", 0), "degrading", card=0, start=start, end=now)
    _profile(ctx, key("gpu-a", 1), "healthy", card=1, start=start, end=now)
    _write(ctx, key("gpu-a", 2), _awkward_ecc_series(now))
    stalled_rows: list[tuple[datetime, str | None, Counters]] = []
    at = start
    while at <= now - 3 * HOUR:  # stops 3 hours ago: collection stalled; uncorrected only (no trend prediction)
        stalled_rows.append((at, "GPU-stalled", Counters(ecc_uncorrected_total=0)))
        at += 30 * STEP
    _write(ctx, key("gpu-a", 3), stalled_rows)
    big_rows: list[tuple[datetime, str | None, Counters]] = []
    for i in range(20_200):  # 30-second samples over ~7 days: more than the 20000 the page loads
        at = now - (20_200 - i) * timedelta(seconds=30)
        big_rows.append((at, "GPU-big-0", Counters(ecc_uncorrected_total=0, ecc_corrected_total=i // 120)))
    _write(ctx, key("gpu-big", 0), big_rows)
    _profile(ctx, key("gpu-other", 0), "degrading", card=0, start=start, end=now)
    sim_profiles: tuple[Profile, ...] = ("degrading", "degrading", "healthy", "card-swap")
    for index, profile in enumerate(sim_profiles):
        _profile(ctx, key("sim-demo", index, "simulated"), profile, card=index, start=now - 9 * DAY, end=now)

    ctx.worker.tick()  # predictions (real and simulated) and the GPU_FAULT_PREDICTED alerts
    for record in _predictions(now, nodes["gpu-a"]):
        ctx.predictions.insert(record)
    resolved, _ = ctx.alerts.raise_alert(
        type="GPU_MEMORY_HIGH",
        severity="WARN",
        node_id=NodeId(nodes["gpu-b"]),
        node_name="gpu-b",
        tenant_id=acme,
        message="GPU 0 memory used 97% (the card itself is fine)",
        now=now - 2 * HOUR,
    )
    ctx.alerts.resolve(resolved.id, by="token:ops:seed", reason="job finished", now=now - HOUR)
    resolvable, _ = ctx.alerts.raise_alert(
        type="GPU_FAULT_PREDICTED",
        severity="WARN",
        node_id=NodeId(nodes["gpu-b"]),
        node_name="gpu-b",
        tenant_id=acme,
        message="GPU 1: uncorrectable ECC predicted within 7 days (rule v1-ecc-growth)",
        now=now - HOUR,
    )
    seeded = Seeded(
        base_url="",
        ctx=ctx,
        now=now,
        reader=token("nodes:read,alerts:write", acme),
        readonly=token("nodes:read", acme),
        other_reader=token("nodes:read", other),
        empty_reader=token("nodes:read", empty),
        nodes=nodes,
        resolvable_alert=resolvable.id,
        agent=token("agent", acme),
    )
    with serve(build_app(ctx)) as base_url:
        live = dataclasses.replace(seeded, base_url=base_url)
        live.beat("gpu-a")  # gpu-a is online for a while; the other nodes never beat and read offline
        yield live
    engine.dispose()
