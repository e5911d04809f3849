"""The liveness statement on SQLite and PostgreSQL: one UPDATE for every node, its parameter encoded in chunks."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from heteroflow.core.ids import NodeId
from heteroflow.storage import node_store
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.node_store import SqlNodeStore
from heteroflow.storage.schema import nodes as nodes_t
from tests.conftest import BACKENDS, new_database

T0 = datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_node_of_a_flush_spanning_several_encoder_chunks_is_written_and_named(
    backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_db_engine(new_database(backend, request))
    upgrade_database(engine)
    store = SqlNodeStore(engine)
    ids = [
        store.register(
            name=f"h{n}", vendor="nvidia", model="m", gpu_count=8, source="real", tenant_id=None, now=T0
        ).node.id
        for n in range(7)
    ]
    monkeypatch.setattr(node_store, "LIVENESS_ENCODE_CHUNK", 3)  # 7 nodes and a missing one: three chunks
    encoded: list[int] = []
    dumps = json.dumps

    def counted(value: list[object]) -> str:
        encoded.append(len(value))
        return dumps(value)

    monkeypatch.setattr(json, "dumps", counted)
    beats = {node: T0 + timedelta(seconds=n) for n, node in enumerate(ids)} | {NodeId("gone"): T0}

    assert store.record_heartbeats(beats) == set(ids)  # the missing node is not named
    assert encoded == [3, 3, 2]
    with engine.connect() as conn:
        stored = dict(conn.execute(sa.select(nodes_t.c.id, nodes_t.c.last_heartbeat_at)).all())
    assert {node: stored[node].replace(tzinfo=UTC) for node in ids} == {node: beats[node] for node in ids}
    engine.dispose()
