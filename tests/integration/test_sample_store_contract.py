"""One contract for every HealthSampleStore: in memory, SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.store import HealthSampleStore
from heteroflow.health.testing import InMemoryHealthSampleStore
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.health_store import SqlHealthSampleStore
from heteroflow.storage.node_store import SqlNodeStore
from tests.conftest import BACKENDS, new_database

T0 = datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)


@pytest.fixture(params=["memory", *BACKENDS])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[HealthSampleStore, NodeId]]:
    if request.param == "memory":
        yield InMemoryHealthSampleStore(), NodeId("node-1")
        return
    engine = create_db_engine(new_database(request.param, request))
    upgrade_database(engine)
    node = (
        SqlNodeStore(engine)
        .register(name="h1", vendor="nvidia", model="m", gpu_count=8, source="real", tenant_id=None, now=T0)
        .node
    )
    yield SqlHealthSampleStore(engine), node.id
    engine.dispose()


def reading(node: NodeId, at: timedelta, value: int | None, *, index: int = 0, uuid: str | None = "G") -> HealthReading:
    return HealthReading(
        key=CardKey(node_id=node, gpu_index=index, source="real"),
        uuid=uuid,
        sampled_at=T0 + at,
        counters=Counters(ecc_corrected_total=value, ecc_uncorrected_total=0),
    )


def test_insert_reads_back_exactly_what_was_written(store: tuple[HealthSampleStore, NodeId]) -> None:
    s, node = store
    written = s.insert([reading(node, timedelta(0), 2**63 - 1), reading(node, timedelta(seconds=1), None, uuid=None)])
    assert [(w.counters.ecc_corrected_total, w.uuid) for w in written] == [(2**63 - 1, "G"), (None, None)]
    assert written[0].sampled_at == T0  # microseconds survive the round trip
    latest = s.latest(written[0].key)
    assert latest == written[1]


def test_latest_is_by_sample_time_per_slot_and_source(store: tuple[HealthSampleStore, NodeId]) -> None:
    s, node = store
    s.insert([reading(node, timedelta(seconds=10), 1), reading(node, timedelta(seconds=5), 2)])
    s.insert([reading(node, timedelta(seconds=20), 3, index=1)])
    latest = s.latest(CardKey(node_id=node, gpu_index=0, source="real"))
    assert latest is not None
    assert latest.counters.ecc_corrected_total == 1
    assert s.latest(CardKey(node_id=node, gpu_index=0, source="simulated")) is None
    assert s.latest(CardKey(node_id=node, gpu_index=7, source="real")) is None


def test_latest_many_is_latest_of_each_slot_in_any_number(store: tuple[HealthSampleStore, NodeId]) -> None:
    s, node = store
    s.insert([reading(node, timedelta(seconds=10), 1), reading(node, timedelta(seconds=5), 2)])
    s.insert([reading(node, timedelta(seconds=20), 3, index=1), reading(node, timedelta(seconds=30), 4, index=1)])
    keys = [CardKey(node_id=node, gpu_index=index, source="real") for index in range(150)]  # more than a statement
    keys.append(CardKey(node_id=node, gpu_index=0, source="simulated"))
    found = s.latest_many(keys)
    assert set(found) == set(keys)
    assert found == {key: s.latest(key) for key in keys}
    first, second = found[keys[0]], found[keys[1]]
    assert first is not None
    assert first.counters.ecc_corrected_total == 1
    assert second is not None
    assert second.counters.ecc_corrected_total == 4
    assert [key for key, row in found.items() if row is not None] == keys[:2]
    # not after: the newest row at or before the bound
    bounded = s.latest_many(keys[:2], not_after=T0 + timedelta(seconds=25))
    bounded_second = bounded[keys[1]]
    assert bounded_second is not None
    assert bounded_second.counters.ecc_corrected_total == 3
    assert bounded[keys[0]] == s.latest(keys[0], not_after=T0 + timedelta(seconds=25))
    assert s.latest_many([]) == {}


def test_counter_decreases_are_stored_as_read(store: tuple[HealthSampleStore, NodeId]) -> None:
    s, node = store
    s.insert([reading(node, timedelta(0), 50), reading(node, timedelta(seconds=1), 0)])
    latest = s.latest(CardKey(node_id=node, gpu_index=0, source="real"))
    assert latest is not None
    assert latest.counters.ecc_corrected_total == 0


def test_delete_older_than(store: tuple[HealthSampleStore, NodeId]) -> None:
    s, node = store
    s.insert([reading(node, timedelta(days=-200), 1), reading(node, timedelta(days=-1), 2)])
    assert s.delete_older_than(T0 - timedelta(days=180), timeout_sec=5) == 1
    assert s.delete_older_than(T0 - timedelta(days=180), timeout_sec=5) == 0
    latest = s.latest(CardKey(node_id=node, gpu_index=0, source="real"))
    assert latest is not None
    assert latest.counters.ecc_corrected_total == 2
