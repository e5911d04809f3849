"""A live server with a fleet of simulated cards (1,000 by default) for the fleet-scale browser test and
bench/web_fleet.py, written in bulk: seconds, not minutes.

Each card has two samples (its first and its latest: the capability matrix and the node list have every card),
and a judged prediction of an earlier week; one card in 8 has a prediction made this week, still pending — one in
5 of those with a strong signal (uncorrectable ECC: the card already fails), the others a trend (corrected ECC
growth). Nodes hold 8 cards each (``fleet-00000`` …). The predictions are written as the worker writes them (the
rules' own evidence text) in one bulk INSERT; the samples through the sample store (its buckets included).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from heteroflow.core.clock import SystemClock
from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.assembly import build_context
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.schema import predictions as predictions_t
from heteroflow.storage.token_store import SqlTokenStore
from tests.web.seed import build_app, serve

DAY = timedelta(days=1)
CARDS_PER_NODE = 8
STRONG = "strong signal [uncorrectable_ecc]: uncorrectable ECC total {n} > 0 (no earlier value known)"
TREND = (
    "trend signal [corrected_ecc_growth]: corrected ECC +{n} in the last 24h (≥ 32), 2.10x the 7-day mean (≥ 1.2x); "
    "increases of the last 3 windows [40, 60, {n}] strictly increase"
)


@dataclass(frozen=True)
class Fleet:
    base_url: str
    reader: str
    cards: int
    this_week: list[str]
    """ids of the pending predictions made this week, as the answer lists them: strong first, then newest"""
    strong: int
    """how many of them have a strong signal"""


def _card_name(card: int) -> tuple[str, int]:
    return f"fleet-{card // CARDS_PER_NODE:05d}", card % CARDS_PER_NODE


@contextlib.contextmanager
def fleet_server(tmp: Path, cards: int = 1000) -> Iterator[Fleet]:
    engine = create_db_engine(f"sqlite:///{tmp / 'fleet.db'}")
    upgrade_database(engine)
    ctx = build_context(
        settings=ServerSettings.load(database_url=str(engine.url)),
        health_settings=HealthStorageSettings.load(),
        prediction_settings=PredictionSettings.load(alert_enabled="false"),
        delivery_settings=AlertDeliverySettings.load(),
        clock=SystemClock(),
        engine=engine,
    )
    now = SystemClock().now()
    tokens = SqlTokenStore(engine)
    tenant = tokens.ensure_tenant("fleet", now=now)[0]
    reader = tokens.create_token(name="fleet", scopes=parse_scopes("nodes:read"), tenant_id=tenant, now=now)[1]
    node_ids: dict[str, str] = {}
    for first in range(0, cards, CARDS_PER_NODE):
        name, _ = _card_name(first)
        node_ids[name] = ctx.nodes.register(
            name=name,
            vendor="nvidia",
            model="H100 80GB HBM3",
            gpu_count=min(CARDS_PER_NODE, cards - first),
            source="real",
            tenant_id=tenant,
            now=now - 30 * DAY,
        ).node.id
    readings: list[HealthReading] = []
    rows: list[dict[str, object]] = []
    this_week: list[tuple[bool, datetime, str]] = []
    for card in range(cards):
        name, index = _card_name(card)
        key = CardKey(node_id=NodeId(node_ids[name]), gpu_index=index, source="real")
        uuid = f"GPU-fleet-{card:05d}"
        for at in (now - 6 * DAY, now - timedelta(minutes=2)):
            counters = Counters(ecc_uncorrected_total=0, ecc_corrected_total=card, remapped_rows_failure=0)
            readings.append(HealthReading(key=key, uuid=uuid, sampled_at=at, counters=counters))

        def prediction(pid: str, t0: datetime, status: str, strong: bool, *, card: int = card) -> dict[str, object]:
            name, index = _card_name(card)
            return {
                "id": pid,
                "node_id": node_ids[name],
                "gpu_index": index,
                "uuid": f"GPU-fleet-{card:05d}",
                "source": "real",
                "rule_version": "v1-ecc-growth",
                "window_days": 7,
                "t0": t0,
                "window_end": t0 + 7 * DAY,
                "status": status,
                "signals": "uncorrectable_ecc" if strong else "corrected_ecc_growth",
                "evidence": (STRONG if strong else TREND).format(n=100 + card % 50),
                "created_at": t0,
                "judged_at": None if status == "pending" else t0 + 7 * DAY,
                "conclusion": None,
                "failure_at": None,
                "alert_id": None,
            }

        # an earlier week's prediction, judged: not an answer to "this week"
        old = now - timedelta(days=15, minutes=card)
        rows.append(prediction(f"fleet-old-{card:05d}", old, "miss" if card % 3 else "hit", card % 7 == 0))
        if card % 8 == 3:
            strong = card % 40 == 3
            t0 = now - timedelta(hours=1, minutes=card)
            rows.append(prediction(f"fleet-week-{card:05d}", t0, "pending", strong))
            this_week.append((strong, t0, f"fleet-week-{card:05d}"))
    for first in range(0, len(readings), 5000):
        ctx.samples.insert(readings[first : first + 5000])
    with engine.begin() as conn:
        conn.execute(sa.insert(predictions_t), rows)
    ordered = sorted(this_week, key=lambda item: (not item[0], -item[1].timestamp(), item[2]))
    with serve(build_app(ctx)) as base_url:
        yield Fleet(
            base_url=base_url,
            reader=reader,
            cards=cards,
            this_week=[pid for _, _, pid in ordered],
            strong=sum(1 for strong, _, _ in this_week if strong),
        )
    engine.dispose()
