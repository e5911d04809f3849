"""The capability matrix from the hour and day buckets equals a count over the raw samples, for any period, after
retention cuts a bucket, and after the migration fills the buckets of an existing database."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import HEALTH_KEYS, Counters
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.platform.auth import NodeScope
from heteroflow.storage.db import alembic_config, upgrade_database
from heteroflow.storage.health_buckets import CapabilityQuery
from heteroflow.storage.health_store import CardCapability, SqlHealthSampleStore
from heteroflow.storage.node_store import SqlNodeStore
from heteroflow.storage.schema import gpu_health_card_buckets

T0 = datetime(2026, 3, 1, 22, 17, 5, 250000, tzinfo=UTC)
ALL = NodeScope(tenant_id=None)


@dataclass(frozen=True)
class Fleet:
    store: SqlHealthSampleStore
    nodes: list[NodeId]
    readings: list[HealthReading]


def build(engine: Engine, *, seed: int = 7) -> Fleet:
    """Two nodes, three slots, 3 days of samples every 7 minutes: counters sometimes unknown, a card swapped, an
    unknown uuid, a key whose semantics are unconfirmed, and batches that span hour and day boundaries."""
    rng = random.Random(seed)
    registry = SqlNodeStore(engine)
    nodes = [
        registry.register(
            name=name, vendor="nvidia", model="m", gpu_count=2, source="real", tenant_id=None, now=T0
        ).node.id
        for name in ("alpha-1", "beta-2")
    ]
    readings = []
    for step in range(0, 3 * 24 * 60, 7):
        at = T0 + timedelta(minutes=step, seconds=rng.randint(0, 50))
        for node, index in ((nodes[0], 0), (nodes[0], 1), (nodes[1], 0)):
            uuid: str | None = f"GPU-{node[:4]}-{index}"
            if index == 1 and step > 2000:
                uuid = "GPU-swapped"
            if node == nodes[1] and rng.random() < 0.1:
                uuid = None
            values = {name: (None if rng.random() < 0.3 else rng.randint(0, 5)) for name in HEALTH_KEYS}
            readings.append(
                HealthReading(
                    key=CardKey(node_id=node, gpu_index=index, source="real"),
                    uuid=uuid,
                    sampled_at=at,
                    counters=Counters(**values),
                    semantics_unconfirmed=("ecc_uncorrected_total",) if rng.random() < 0.05 else (),
                )
            )
    store = SqlHealthSampleStore(engine)
    for start in range(0, len(readings), 97):
        store.insert(readings[start : start + 97])
    return Fleet(store, nodes, readings)


def expected(readings: Sequence[HealthReading], since: datetime, until: datetime) -> list[tuple[object, ...]]:
    """The matrix as a brute-force count over the readings, in the store's order (node name, index, last sample;
    the nodes were registered in name order)."""
    order: dict[str, int] = {node: i for i, node in enumerate(dict.fromkeys(r.key.node_id for r in readings))}
    cards: dict[tuple[str, int, str | None], list[HealthReading]] = {}
    for r in readings:
        if since <= r.sampled_at <= until:
            cards.setdefault((r.key.node_id, r.key.gpu_index, r.uuid), []).append(r)
    rows = []
    for (node, index, uuid), rs in cards.items():
        unconfirmed = max((",".join(r.semantics_unconfirmed) for r in rs if r.semantics_unconfirmed), default=None)
        rows.append(
            (
                node,
                index,
                uuid,
                tuple(any(getattr(r.counters, k) is not None for r in rs) for k in HEALTH_KEYS),
                min(r.sampled_at for r in rs),
                max(r.sampled_at for r in rs),
                len(rs),
                tuple(unconfirmed.split(",")) if unconfirmed else (),
            )
        )
    return sorted(rows, key=lambda row: (order[str(row[0])], row[1], row[5]))


def actual(cards: Sequence[CardCapability]) -> list[tuple[object, ...]]:
    return [
        (
            c.node_id,
            c.gpu_index,
            c.uuid,
            tuple(c.collectable[k] for k in HEALTH_KEYS),
            c.first_sample_at,
            c.last_sample_at,
            c.sample_count,
            c.semantics_unconfirmed,
        )
        for c in cards
    ]


def periods() -> list[tuple[datetime, datetime]]:
    hour, day = timedelta(hours=1), timedelta(days=1)
    midnight = datetime(2026, 3, 2, tzinfo=UTC)
    return [
        (T0 - day, T0 + 10 * day),  # everything
        (T0 + timedelta(minutes=3), T0 + timedelta(minutes=40)),  # inside one hour
        (midnight - timedelta(minutes=20), midnight + timedelta(minutes=50)),  # across midnight, no whole hour
        (midnight - 3 * hour, midnight + 5 * hour + timedelta(minutes=9)),  # whole hours, no whole day
        (midnight, midnight + day),  # exactly one day, bounds on bucket edges
        (T0 + timedelta(hours=5, minutes=1), T0 + timedelta(days=2, hours=3, seconds=7)),  # days, hours and raw
        (T0 + timedelta(days=2), T0 + timedelta(days=2)),  # one instant
    ]


def test_every_period_matches_the_raw_count(engine: Engine) -> None:
    fleet = build(engine)
    for since, until in periods():
        assert actual(fleet.store.capabilities(scope=ALL, source="real", since=since, until=until)) == expected(
            fleet.readings, since, until
        ), (since, until)


def test_the_bucket_that_retention_cuts_is_rebuilt(engine: Engine) -> None:
    fleet = build(engine)
    cutoff = T0 + timedelta(days=1, hours=3, minutes=31, seconds=2)
    fleet.store.delete_older_than(cutoff, timeout_sec=30)
    kept = [r for r in fleet.readings if r.sampled_at >= cutoff]
    for since, until in [*periods(), (T0 - timedelta(days=1), cutoff + timedelta(minutes=45))]:
        assert actual(fleet.store.capabilities(scope=ALL, source="real", since=since, until=until)) == expected(
            kept, since, until
        ), (since, until)
    with engine.connect() as conn:
        oldest = conn.scalar(sa.select(sa.func.min(gpu_health_card_buckets.c.first_sample_at)))
    assert oldest is not None
    assert oldest >= cutoff


def test_the_migration_fills_the_buckets_of_stored_samples(engine: Engine) -> None:
    build(engine)
    with engine.connect() as conn:
        before = sorted(tuple(row) for row in conn.execute(sa.select(gpu_health_card_buckets)))
    config = alembic_config(engine)
    command.downgrade(config, "0007")
    upgrade_database(engine)
    with engine.connect() as conn:
        after = sorted(tuple(row) for row in conn.execute(sa.select(gpu_health_card_buckets)))
    assert after == before
    assert len(after) > 0


def test_filters_sort_and_pages_are_applied_in_sql(engine: Engine) -> None:
    fleet = build(engine)
    since, until = T0 - timedelta(days=1), T0 + timedelta(days=10)
    everything = fleet.store.capability_page(CapabilityQuery(scope=ALL, source="real", since=since, until=until))
    assert everything.total == len(everything.cards) >= 5
    page = fleet.store.capability_page(
        CapabilityQuery(scope=ALL, source="real", since=since, until=until, limit=2, offset=2)
    )
    assert page.total == everything.total
    assert actual(page.cards) == actual(everything.cards[2:4])
    past_end = fleet.store.capability_page(
        CapabilityQuery(scope=ALL, source="real", since=since, until=until, limit=2, offset=99)
    )
    assert past_end.cards == []
    assert past_end.total == everything.total
    # the swapped card's old uuid stopped reporting: stalled at any threshold after its last sample
    old = next(c for c in everything.cards if c.uuid == f"GPU-{fleet.nodes[0][:4]}-1")
    stalled_before = old.last_sample_at + timedelta(seconds=1)
    stalled = fleet.store.capability_page(
        CapabilityQuery(scope=ALL, source="real", since=since, until=until, stalled_before=stalled_before, stalled=True)
    )
    assert [c.uuid for c in stalled.cards] == [old.uuid]
    assert stalled.total == 1
    healthy = fleet.store.capability_page(
        CapabilityQuery(
            scope=ALL, source="real", since=since, until=until, stalled_before=stalled_before, stalled=False
        )
    )
    assert healthy.total == everything.total - 1
    first = fleet.store.capability_page(
        CapabilityQuery(scope=ALL, source="real", since=since, until=until, sort="stalled_first", limit=1)
    )
    assert first.cards[0].uuid == old.uuid
    newest = fleet.store.capability_page(
        CapabilityQuery(scope=ALL, source="real", since=since, until=until, sort="recent_first")
    )
    assert [c.last_sample_at for c in newest.cards] == sorted((c.last_sample_at for c in newest.cards), reverse=True)
    by_node = fleet.store.capability_page(
        CapabilityQuery(scope=ALL, source="real", since=since, until=until, node_id=fleet.nodes[1])
    )
    assert {c.node_id for c in by_node.cards} == {fleet.nodes[1]}
    assert by_node.total == len(by_node.cards)
    by_name = fleet.store.capability_page(CapabilityQuery(scope=ALL, source="real", since=since, until=until, q="BETA"))
    assert actual(by_name.cards) == actual(by_node.cards)
    by_uuid = fleet.store.capability_page(
        CapabilityQuery(scope=ALL, source="real", since=since, until=until, q="swapp")
    )
    assert [c.uuid for c in by_uuid.cards] == ["GPU-swapped"]
    wildcard = fleet.store.capability_page(CapabilityQuery(scope=ALL, source="real", since=since, until=until, q="%"))
    assert wildcard.total == 0  # a LIKE wildcard is a literal character
