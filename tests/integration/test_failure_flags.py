"""The ``ue_changed`` flag: computed on insert, backfilled by migration 0004, kept by retention (H-50…H-52).

The failure scan and the card lists read only the flagged rows. The oracle for every statistics check is the
same database with every row flagged: the scans then read every row, which is what the statistics mean.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.heartbeat import ParsedXid
from heteroflow.health.samples import Card, CardKey, HealthReading
from heteroflow.health.simulation import Profile, series
from heteroflow.platform.auth import NodeScope
from heteroflow.storage.db import alembic_config, create_db_engine, upgrade_database
from heteroflow.storage.health_store import SqlHealthSampleStore
from heteroflow.storage.node_store import SqlNodeStore
from heteroflow.storage.prediction_statistics import failure_events_query
from heteroflow.storage.prediction_store import PredictionRecord, SqlPredictionStore
from heteroflow.storage.schema import gpu_health_samples as samples_t
from heteroflow.storage.schema import gpu_xid_events, nodes, predictions
from tests.conftest import BACKENDS, new_database

START = datetime(2026, 4, 1, 0, 0, 0, 250000, tzinfo=UTC)
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
END = START + 2 * DAY

# what the samples table held at revision 0003 (no ue_changed column, nor the columns of later revisions)
LATER_COLUMNS = (
    "ue_changed",  # 0004
    "semantics_unconfirmed",  # 0005
    "remapped_rows_correctable",  # 0006
    "remapped_rows_uncorrectable",
    "ecc_sram_uncorrected_total",
    "ecc_sram_corrected_total",
)
samples_0003 = sa.table(
    "gpu_health_samples",
    *(sa.column(c.name, c.type) for c in samples_t.c if c.name not in ("id", *LATER_COLUMNS)),
)


def node(engine: Engine, name: str = "h1") -> NodeId:
    record = (
        SqlNodeStore(engine)
        .register(name=name, vendor="nvidia", model="H100", gpu_count=8, source="real", tenant_id=None, now=START)
        .node
    )
    return record.id


def reading(
    node_id: NodeId, at: datetime, *, ue: int | None, ce: int | None = 1, uuid: str | None = "G", index: int = 0
) -> HealthReading:
    return HealthReading(
        key=CardKey(node_id=node_id, gpu_index=index, source="real"),
        uuid=uuid,
        sampled_at=at,
        counters=Counters(ecc_uncorrected_total=ue, ecc_corrected_total=ce),
    )


def flags(engine: Engine) -> list[tuple[str, int, datetime, bool, bool]]:
    t = samples_t
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.c.node_id, t.c.gpu_index, t.c.sampled_at, t.c.changed, t.c.ue_changed).order_by(
                t.c.node_id, t.c.gpu_index, t.c.sampled_at, t.c.id
            )
        ).all()
    return [(r.node_id, r.gpu_index, r.sampled_at, bool(r.changed), bool(r.ue_changed)) for r in rows]


# -- on insert ------------------------------------------------------------------------------------------------


def test_the_flag_marks_first_samples_uncorrectable_steps_unknowns_and_card_swaps(engine: Engine) -> None:
    n = node(engine)
    store = SqlHealthSampleStore(engine)
    steps: list[tuple[dict[str, Any], bool, bool]] = [
        # (reading, changed, ue_changed)
        ({"ue": 0}, True, True),  # the card's first sample
        ({"ue": 0}, False, False),  # a keepalive row
        ({"ue": 0, "ce": 5}, True, False),  # a corrected-ECC step is a change, never a failure
        ({"ue": None, "ce": 5}, True, True),  # unknown is not 0: a different value
        ({"ue": None, "ce": 6}, True, False),  # still unknown
        ({"ue": 0, "ce": 6}, True, True),  # known again
        ({"ue": 3, "ce": 6}, True, True),  # an increase
        ({"ue": 1, "ce": 6}, True, True),  # a decrease
        ({"ue": 1, "ce": 6, "uuid": "H"}, True, True),  # another card in the slot, same counters
        ({"ue": 1, "ce": 7, "uuid": "H"}, True, False),
        ({"ue": 1, "ce": 7, "uuid": None}, True, True),  # uuid unknown
        ({"ue": 1, "ce": 7, "uuid": None}, False, False),
    ]
    # half in one batch (the chain inside the batch), the rest one by one (the predecessor read from the table)
    store.insert([reading(n, START + i * HOUR, **r) for i, (r, _, _) in enumerate(steps[:6])])
    for i, (r, _, _) in enumerate(steps[6:], start=6):
        store.insert([reading(n, START + i * HOUR, **r)])
    # another slot's first sample, counters unknown but for corrected ECC
    store.insert([reading(n, START, ue=None, ce=1, index=1)])
    got = flags(engine)
    assert [(c, u) for _, index, _, c, u in got if index == 0] == [(c, u) for _, c, u in steps]
    assert [(c, u) for _, index, _, c, u in got if index == 1] == [(True, True)]


def test_the_flag_follows_the_previous_row_the_caller_hands_over(engine: Engine) -> None:
    n = node(engine)
    store = SqlHealthSampleStore(engine)
    [first] = store.insert([reading(n, START, ue=2)])
    store.insert([reading(n, START + HOUR, ue=2, ce=9)], previous={first.key: first})
    store.insert([reading(n, START + 2 * HOUR, ue=2, ce=9, index=1)], previous={first.key: first})
    assert [(c, u) for *_, c, u in flags(engine)] == [(True, True), (True, False), (True, True)]


# -- retention ------------------------------------------------------------------------------------------------


def test_retention_flags_the_row_that_becomes_each_slots_first(engine: Engine) -> None:
    n = node(engine)
    store = SqlHealthSampleStore(engine)
    store.insert([reading(n, START + i * HOUR, ue=0, ce=1 if i < 2 else 2) for i in range(5)])  # F, F, T, F, F
    store.insert([reading(n, START + i * HOUR, ue=0, index=1) for i in range(3)])
    assert store.delete_older_than(START + 90 * timedelta(minutes=1), timeout_sec=5) == 4
    got = [(index, at, c, u) for _, index, at, c, u in flags(engine)]
    assert got == [
        (0, START + 2 * HOUR, True, True),  # was changed, now both
        (0, START + 3 * HOUR, False, False),
        (0, START + 4 * HOUR, False, False),
        (1, START + 2 * HOUR, True, True),  # a keepalive row, now both: the healthy card stays visible
    ]


# -- statistics over a simulated fleet --------------------------------------------------------------------------

PROFILES: tuple[Profile, ...] = (
    "healthy",
    "degrading",
    "sudden-ue",
    "remap-failure",
    "stalled",
    "card-swap",
    "remap-pending",
)


def hand_made(n: NodeId) -> list[HealthReading]:
    """Cards whose uncorrectable-ECC series has unknowns, decreases, no uuid, no value at all and a swap back."""
    series_by_card: dict[int, list[tuple[int | None, str | None]]] = {
        0: [(0, "U0"), (0, "U0"), (None, "U0"), (None, "U0"), (0, "U0"), (1, "U0"), (1, "U0"), (None, "U0"), (3, "U0")],
        1: [(5, "U1"), (5, "U1"), (2, "U1"), (2, "U1"), (4, "U1"), (4, "U1")],
        2: [(0, None), (0, None), (1, None), (1, None)],
        3: [(None, "U3")] * 5,
        4: [(0, "A"), (0, "A"), (0, "B"), (0, "B"), (0, "A"), (1, "A"), (1, "A")],
    }
    out = []
    for index, values in series_by_card.items():
        step = (END - START) / len(values)
        for i, (ue, uuid) in enumerate(values):
            # the corrected counter changes on every sample of card 0: changed rows that are not failures
            ce = i if index == 0 else 1
            out.append(reading(n, START + i * step, ue=ue, ce=ce, uuid=uuid, index=index))
    return out


def build_fleet(engine: Engine) -> None:
    """Two nodes: the simulation profiles, and the hand-made cards; counted and uncounted XIDs; predictions."""
    store = SqlHealthSampleStore(engine)
    sim, hand = node(engine, "sim"), node(engine, "hand")
    readings = [
        HealthReading(key=CardKey(sim, index, "real"), uuid=s.uuid, sampled_at=s.sampled_at, counters=s.counters)
        for index, profile in enumerate(PROFILES)
        for s in series(profile, card=index, start=START, end=END)
    ]
    store.insert(readings)
    store.insert(hand_made(hand))
    store.insert_xid_events(
        [
            ParsedXid(gpu_index=0, uuid=None, xid=48, occurred_at=START + 30 * HOUR),  # counted
            ParsedXid(gpu_index=0, uuid=None, xid=13, occurred_at=START + 31 * HOUR),  # not counted
        ],
        node_id=sim,
        source="real",
        received_at=END,
    )
    store.insert_xid_events(
        [ParsedXid(gpu_index=4, uuid="B", xid=94, occurred_at=START + 20 * HOUR)],
        node_id=hand,
        source="real",
        received_at=END,
    )
    prediction_store = SqlPredictionStore(engine)
    for node_id, index, uuid, t0 in (
        (hand, 0, "U0", START + 10 * HOUR),
        (hand, 1, "U1", START + 2 * HOUR),
        (sim, 2, "SIM-sudden-ue-0002", START + 5 * HOUR),
    ):
        for window_days in (7, 30):
            prediction_store.insert(
                PredictionRecord(
                    id=f"{node_id}-{index}-{window_days}",
                    card=Card(node_id, index, uuid, "real"),
                    rule_version="test",
                    window_days=window_days,
                    t0=t0,
                    window_end=t0 + window_days * DAY,
                    status="pending",
                    signals=("ce_acceleration",),
                    evidence="test",
                    created_at=t0,
                    judged_at=None,
                    conclusion=None,
                    alert_id=None,
                )
            )


PERIODS = [
    (START - DAY, END),  # everything
    (START + DAY, END),  # failures before `since` are not counted, their cards still monitorable
    (START - DAY, START + DAY),  # samples after `now` are not read
    (START + 20 * HOUR, START + 30 * HOUR),
    (END + HOUR, END + DAY),  # nothing in the period
]


def statistics(engine: Engine) -> list[Any]:
    store = SqlPredictionStore(engine)
    out: list[Any] = []
    for since, now in PERIODS:
        bands, exposure = store.statistics(
            source="real", scope=NodeScope(None), since=since, now=now, window_days=[7, 30]
        )
        with engine.connect() as conn:
            failures = sorted(
                (r.node_id, r.gpu_index, r.uuid, r.at)
                for r in conn.execute(failure_events_query(source="real", scope=NodeScope(None), since=since, now=now))
            )
        cards = store.evaluation_cards(source="real", now=now)
        out.append((bands, exposure, failures, cards))
    return out


def flag_every_row(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.update(samples_t).values(changed=True, ue_changed=True))


def test_statistics_read_through_the_flag_equal_those_read_over_every_row(engine: Engine) -> None:
    build_fleet(engine)
    flagged = statistics(engine)
    # the fleet has failures, including one found only through its uuid's earlier value and one by XID
    assert any(failures for _, _, failures, _ in flagged)
    assert flagged[0][0][7].failed_cards >= 5
    assert flagged[0][0][7].predicted_cards >= 1
    flag_every_row(engine)
    assert statistics(engine) == flagged


def test_after_retention_the_statistics_still_equal_those_read_over_every_row(engine: Engine) -> None:
    build_fleet(engine)
    # the sudden-ue card's first row goes: its step at 60% must still compare with the value before it
    SqlHealthSampleStore(engine).delete_older_than(START + 20 * HOUR, timeout_sec=30)
    flagged = statistics(engine)
    monitorable = flagged[0][1].monitorable_cards
    assert monitorable == 7 + 5 + 1  # every card (the swapped ones count twice) stays monitorable
    flag_every_row(engine)
    assert statistics(engine) == flagged


# -- migration 0004 ----------------------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def two_databases(request: pytest.FixtureRequest) -> Iterator[tuple[Engine, Engine]]:
    """A database at the newest revision and an empty one of the same backend."""
    engines = [create_db_engine(new_database(request.param, request)) for _ in range(2)]
    upgrade_database(engines[0])
    yield engines[0], engines[1]
    for e in engines:
        e.dispose()


def migrate(engine: Engine, revision: str) -> None:
    """As ``upgrade_database`` migrates: on SQLite with foreign keys off (a table recreated by a migration must
    not cascade into the rows that reference it)."""
    config = alembic_config(engine)
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()
        with conn.begin():
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.commit()


def copy_at_0003(source: Engine, target: Engine) -> None:
    """The source's nodes, samples (without the new flag), XIDs and predictions, written into a database at 0003."""
    columns = [c.name for c in samples_0003.c]
    with source.connect() as src:
        # columns of migrations 0007 and 0010
        later = {"credential_hash", "registered_by", "tenant_key", "credential_issued_at", "credential_released_at"}
        node_rows = [{k: v for k, v in r._mapping.items() if k not in later} for r in src.execute(sa.select(nodes))]
        sample_rows = [
            dict(r._mapping)
            for r in src.execute(sa.select(*(samples_t.c[name] for name in columns)).order_by(samples_t.c.id))
        ]
        xid_rows = [dict(r._mapping) for r in src.execute(sa.select(gpu_xid_events))]
        prediction_rows = [dict(r._mapping) for r in src.execute(sa.select(predictions))]
    with target.begin() as conn:
        conn.execute(sa.insert(nodes), node_rows)
        conn.execute(sa.insert(samples_0003), sample_rows)
        conn.execute(sa.insert(gpu_xid_events), xid_rows)
        conn.execute(sa.insert(predictions), prediction_rows)


def test_the_migration_backfills_the_flag_as_inserts_compute_it(two_databases: tuple[Engine, Engine]) -> None:
    reference, migrated = two_databases
    build_fleet(reference)
    migrate(migrated, "0003")
    copy_at_0003(reference, migrated)
    migrate(migrated, "head")
    assert flags(migrated) == flags(reference)
    assert statistics(migrated) == statistics(reference)


def test_the_migration_restores_first_rows_that_retention_removed(two_databases: tuple[Engine, Engine]) -> None:
    reference, migrated = two_databases
    build_fleet(reference)
    migrate(migrated, "0003")
    copy_at_0003(reference, migrated)
    cutoff = START + 20 * HOUR
    with migrated.begin() as conn:  # what the retention of 0003 did: delete, flag nothing
        conn.execute(sa.delete(samples_0003).where(samples_0003.c.sampled_at < cutoff))
    SqlHealthSampleStore(reference).delete_older_than(cutoff, timeout_sec=30)
    migrate(migrated, "head")
    assert flags(migrated) == flags(reference)
    assert statistics(migrated) == statistics(reference)
