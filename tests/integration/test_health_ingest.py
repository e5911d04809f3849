"""H-20…H-24 through the real heartbeat route, on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from httpx2 import Response
from sqlalchemy.engine import Engine

from heteroflow.storage.schema import gpu_health_samples
from tests.conftest import StatementCounter
from tests.support.harness import Harness, running_server

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def rows(engine: Engine) -> list[Any]:
    query = sa.select(gpu_health_samples).order_by(
        gpu_health_samples.c.gpu_index, gpu_health_samples.c.sampled_at, gpu_health_samples.c.id
    )
    with engine.connect() as conn:
        return list(conn.execute(query))


def stat(index: int, uuid: str | None = "GPU-a", **counters: Any) -> dict[str, Any]:
    base = {"index": index, "uuid": uuid, "temperature_c": 40, "utilization_pct": 3}
    return {**base, **counters}


HEALTHY: dict[str, Any] = {
    "ecc_uncorrected_total": 0,
    "ecc_corrected_total": 10,
    "retired_pages": 0,
    "remapped_rows_pending": 0,
    "remapped_rows_failure": 0,
}


@pytest.fixture
def harness(engine: Engine) -> Any:
    with running_server(engine, start=T0) as h:
        yield h


@pytest.fixture
def agent(harness: Harness) -> tuple[str, str]:
    token = harness.token("agent")
    return token, harness.register(token, "gpu-node-1")


def test_write_rules_first_change_unknown_to_known_uuid_and_keepalive(
    harness: Harness, agent: tuple[str, str], engine: Engine
) -> None:
    token, node = agent

    def beat(**c: Any) -> Response:
        return harness.beat(token, node, [stat(0, **c)])

    assert beat(**HEALTHY).status_code == 200  # first sample of the card
    harness.clock.advance(5)
    beat(**HEALTHY)  # unchanged, within keepalive: skipped
    harness.clock.advance(5)
    beat(**{**HEALTHY, "ecc_corrected_total": 11})  # a counter changed
    harness.clock.advance(5)
    beat(**{**HEALTHY, "ecc_corrected_total": 11, "retired_pages": None})  # known -> unknown is a change
    harness.clock.advance(5)
    beat(**{**HEALTHY, "ecc_corrected_total": 11})  # unknown -> known is a change
    harness.clock.advance(5)
    harness.beat(token, node, [stat(0, uuid="GPU-b", **{**HEALTHY, "ecc_corrected_total": 11})])  # new card
    harness.drain()

    stored = rows(engine)
    assert [(r.uuid, r.ecc_corrected_total, r.retired_pages) for r in stored] == [
        ("GPU-a", 10, 0),
        ("GPU-a", 11, 0),
        ("GPU-a", 11, None),
        ("GPU-a", 11, 0),
        ("GPU-b", 11, 0),
    ]
    assert [r.sampled_at for r in stored] == [T0 + timedelta(seconds=s) for s in (0, 10, 15, 20, 25)]


def test_keepalive_is_measured_from_the_stored_row_not_the_last_beat(
    harness: Harness, agent: tuple[str, str], engine: Engine
) -> None:
    token, node = agent
    for _ in range(121):  # 10 minutes of 5 s beats, counters never change
        harness.beat(token, node, [stat(0, **HEALTHY)])
        harness.clock.advance(5)
    harness.drain()
    times = [r.sampled_at for r in rows(engine)]
    assert times == [T0, T0 + timedelta(minutes=5), T0 + timedelta(minutes=10)]
    # keepalive rows repeat their predecessor: marked unchanged, so scans for changes can skip them
    assert [r.changed for r in rows(engine)] == [True, False, False]


def test_every_unknown_form_is_stored_as_null_and_never_fails_the_beat(
    harness: Harness, agent: tuple[str, str], engine: Engine
) -> None:
    token, _ = agent
    odd_values: list[Any] = ["[N/A]", None, "12", -1, 1.5, True, 2**63, [], {"v": 1}, float("inf")]
    node = harness.register(token, "gpu-node-10", gpu_count=len(odd_values))  # a card slot for each stat
    stats = []
    for index, value in enumerate(odd_values):
        # each stat: one odd corrected-ECC value, plus a known uncorrected count so the card is not all-unknown
        stats.append({"index": index, "uuid": f"GPU-{index}", "ecc_uncorrected_total": 0, "ecc_corrected_total": value})
    body = {"gpu_stats": stats}
    response = harness.client.post(
        f"/api/v1/nodes/{node}/heartbeat",
        content=_json_with_infinity(body),
        headers={**harness.node_auth(token, node), "content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    harness.drain()
    stored = rows(engine)
    assert len(stored) == len(odd_values)
    assert all(r.ecc_corrected_total is None for r in stored)
    assert all(r.ecc_uncorrected_total == 0 for r in stored)


def _json_with_infinity(body: dict[str, Any]) -> str:
    import json

    return json.dumps(body).replace("Infinity", "1e999")


def test_integral_float_and_64_bit_counters_round_trip(
    harness: Harness, agent: tuple[str, str], engine: Engine
) -> None:
    token, node = agent
    harness.beat(token, node, [stat(0, ecc_corrected_total=2**63 - 1, retired_pages=7.0)])
    harness.drain()
    [row] = rows(engine)
    assert row.ecc_corrected_total == 2**63 - 1
    assert row.retired_pages == 7
    assert row.ecc_uncorrected_total is None


def test_all_unknown_cards_are_rejected_before_any_database_access(
    harness: Harness, agent: tuple[str, str], engine: Engine, statements: StatementCounter
) -> None:
    token, node = agent
    harness.beat(token, node, [stat(0)])  # warms the token and node caches
    harness.drain()
    statements.reset()
    for _ in range(5):
        harness.clock.advance(5)
        response = harness.beat(token, node, [stat(0), stat(1, ecc_corrected_total="[N/A]")])
        assert response.status_code == 200
    harness.drain()
    assert statements.count == 0
    assert rows(engine) == []
    assert harness.ctx.ingestor.status().skipped_all_unknown_total == 11


def test_declared_index_wins_over_array_position(harness: Harness, agent: tuple[str, str], engine: Engine) -> None:
    token, node = agent
    harness.beat(
        token,
        node,
        [stat(5, uuid="GPU-5", ecc_corrected_total=55), stat(2, uuid="GPU-2", ecc_corrected_total=22)],
    )
    harness.clock.advance(5)
    harness.beat(token, node, [stat(2, uuid="GPU-2", ecc_corrected_total=22)])  # card 5 missing this beat
    harness.drain()
    assert [(r.gpu_index, r.uuid, r.ecc_corrected_total) for r in rows(engine)] == [
        (2, "GPU-2", 22),
        (5, "GPU-5", 55),
    ]


def test_uuid_slot_swap_writes_a_new_row_for_each_slot(
    harness: Harness, agent: tuple[str, str], engine: Engine
) -> None:
    token, node = agent
    harness.beat(token, node, [stat(0, uuid="GPU-a", **HEALTHY), stat(1, uuid="GPU-b", **HEALTHY)])
    harness.clock.advance(60)
    # the two cards were physically swapped: same counters, uuids exchanged
    harness.beat(token, node, [stat(0, uuid="GPU-b", **HEALTHY), stat(1, uuid="GPU-a", **HEALTHY)])
    harness.drain()
    assert [(r.gpu_index, r.uuid) for r in rows(engine)] == [(0, "GPU-a"), (0, "GPU-b"), (1, "GPU-b"), (1, "GPU-a")]


def test_steady_state_heartbeat_makes_zero_statements(
    harness: Harness, agent: tuple[str, str], statements: StatementCounter
) -> None:
    token, node = agent
    eight = [stat(i, uuid=f"GPU-{i}", **HEALTHY) for i in range(8)]
    harness.beat(token, node, eight)
    harness.drain()
    for _ in range(59):  # up to 295 s: no keepalive due yet
        harness.clock.advance(5)
        harness.maintain()  # the shared upkeep of every interval, counted apart
        statements.reset()
        assert harness.beat(token, node, eight).status_code == 200
        harness.drain()
        assert statements.statements == []
    status = harness.ctx.ingestor.status()
    assert status.skipped_dedup_total == 8 * 59
    assert status.written_total == 8
    harness.clock.advance(5)  # 300 s after the stored rows: the keepalive rows are due
    harness.beat(token, node, eight)
    harness.drain()
    assert harness.ctx.ingestor.status().written_total == 16
    # the upkeep itself is two statements per interval for all nodes: liveness and token re-confirmation
    statements.reset()
    harness.clock.advance(5)
    harness.maintain()
    assert len(statements.statements) == 2


def test_liveness_is_flushed_in_one_statement_for_all_nodes(
    harness: Harness, engine: Engine, statements: StatementCounter
) -> None:
    token = harness.token("agent")
    reader = harness.token("nodes:read")
    nodes = [harness.register(token, f"node-{i}") for i in range(30)]
    for node in nodes:
        harness.beat(token, node, [])
    statements.reset()
    harness.maintain()
    # one UPDATE for all 30 nodes, plus the one SELECT that re-confirms the cached token
    assert len(statements.matching("UPDATE")) == 1
    assert statements.count == 2
    with engine.connect() as conn:
        stored: dict[str, datetime | None] = dict(
            conn.execute(sa.text("SELECT id, last_heartbeat_at FROM nodes")).all()
        )
    assert all(stored[node] is not None for node in nodes)
    listing = harness.get(reader, "/api/v1/nodes").json()
    assert listing["total"] == 30
    assert all(item["online"] for item in listing["items"])


def test_cache_loss_costs_one_select_only(engine: Engine, statements: StatementCounter) -> None:
    with running_server(engine, start=T0) as first:
        token = first.token("agent")
        node = first.register(token, "gpu-node-1")
        first.beat(token, node, [stat(0, **HEALTHY)])
        first.drain()
    # a restarted server: empty dedup cache, same database
    with running_server(engine, start=T0 + timedelta(seconds=5)) as second:
        second.beat(token, node, [stat(0, **HEALTHY)])  # warm the token and node caches
        second.drain()
        assert second.ctx.ingestor.status().selects_total == 1
        statements.reset()
        second.clock.advance(5)
        second.beat(token, node, [stat(0, **HEALTHY)])
        second.drain()
        assert statements.count == 0
        assert second.ctx.ingestor.status().written_total == 0
    assert len(rows(engine)) == 1


def test_a_simulated_day_of_a_stable_card_writes_at_most_288_rows(
    harness: Harness, agent: tuple[str, str], engine: Engine
) -> None:
    _, node = agent
    ingestor = harness.ctx.ingestor
    from heteroflow.core.ids import NodeId
    from heteroflow.health.heartbeat import readings_from_stats

    # 17,280 beats through the side path itself (the HTTP layer adds nothing to this count)
    for _ in range(24 * 60 * 12):
        readings, _ = readings_from_stats(
            [stat(0, **HEALTHY)], node_id=NodeId(node), source="real", received_at=harness.clock.now()
        )
        ingestor.offer(readings)
        harness.clock.advance(5)
        if ingestor.status().pending_readings:
            harness.drain()
    harness.drain()
    assert len(rows(engine)) == 288


def test_deleting_a_node_removes_its_samples_and_later_beats_get_404(
    harness: Harness, agent: tuple[str, str], engine: Engine
) -> None:
    token, node = agent
    operator = harness.token("nodes:write,nodes:read")
    harness.beat(token, node, [stat(0, **HEALTHY)])
    harness.drain()
    assert harness.client.delete(f"/api/v1/nodes/{node}", headers=harness.auth(operator)).status_code == 204
    assert rows(engine) == []
    assert harness.beat(token, node, [stat(0, **HEALTHY)]).status_code == 404
    assert harness.get(operator, f"/api/v1/nodes/{node}").status_code == 404


def test_xid_events_are_stored_once_even_when_resent(harness: Harness, agent: tuple[str, str]) -> None:
    token, node = agent
    events = [
        {"index": 0, "uuid": "GPU-a", "xid": 48, "occurred_at": "2026-03-01T11:59:00Z"},
        {"index": 1, "xid": 79, "occurred_at": "2026-03-01T11:59:30+00:00"},
        {"index": 0, "xid": "bad", "occurred_at": "2026-03-01T11:59:00Z"},
    ]
    first = harness.beat(token, node, [], xid_events=events).json()["xid_events"]
    again = harness.beat(token, node, [], xid_events=events).json()["xid_events"]
    assert first == {"received": 3, "stored": 2, "rejected": [first["rejected"][0]], "retry": False}
    assert "xid" in first["rejected"][0]
    assert again["stored"] == 0
    assert again["retry"] is False
