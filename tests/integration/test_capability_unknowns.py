"""Every unknown findable: the capability matrix's ``unknown`` filter (any counter, or one), the fleet's count of
cards per unknown counter, and the CSV export of what is filtered (SQLite and PostgreSQL)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

from heteroflow.health.counters import HEALTH_KEYS
from tests.integration.test_predictions import NOW
from tests.support.harness import Harness, running_server

CAPS = "/api/v1/gpu-health/capabilities"


@pytest.fixture
def harness(engine: Engine) -> Iterator[Harness]:
    with running_server(engine, start=NOW) as h:
        yield h


def full(index: int) -> dict[str, object]:
    return {"index": index, "uuid": f"GPU-{index}", **dict.fromkeys(HEALTH_KEYS, 0)}


def test_unknown_filter_counts_and_export(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "n1")
    other = harness.register(agent, "n2")
    # card 0 reports everything; card 1 no retired pages; card 2 neither retired pages nor uncorrected ECC
    harness.beat(
        agent,
        node,
        [
            full(0),
            {**full(1), "uuid": "=GPU-1", "retired_pages": "[N/A]"},  # a uuid a spreadsheet would run
            {**full(2), "retired_pages": None, "ecc_uncorrected_total": "[N/A]"},
        ],
    )
    harness.beat(agent, other, [full(0)])
    harness.drain()

    every = harness.get(reader, CAPS).json()
    assert every["total"] == 4
    assert every["unknown_counts"]["retired_pages"] == 2
    assert every["unknown_counts"]["ecc_uncorrected_total"] == 1
    assert every["unknown_counts"]["ecc_corrected_total"] == 0

    # counted in SQL over every page when a page is asked for, from the cards when every card is read: the same
    assert harness.get(reader, CAPS, limit=1).json()["unknown_counts"] == every["unknown_counts"]
    anything = harness.get(reader, CAPS, unknown="any").json()
    assert anything["unknown"] == "any"
    assert sorted((c["node_id"], c["gpu_index"]) for c in anything["cards"]) == [(node, 1), (node, 2)]
    assert anything["total"] == 2
    assert anything["unknown_counts"] == every["unknown_counts"]  # the fleet's, whatever the filter shows
    assert {c["node_name"] for c in anything["cards"]} == {"n1"}

    one = harness.get(reader, CAPS, unknown="ecc_uncorrected_total").json()
    assert [(c["gpu_index"], c["metrics"]["ecc_uncorrected_total"]) for c in one["cards"]] == [(2, "unknown")]
    # a page past the end still has the total and the counts
    past = harness.get(reader, CAPS, unknown="any", limit=1, offset=5).json()
    assert (past["cards"], past["total"]) == ([], 2)
    assert past["unknown_counts"] == every["unknown_counts"]
    none = harness.get(reader, CAPS, unknown="ecc_corrected_total").json()
    assert (none["cards"], none["total"]) == ([], 0)
    assert none["unknown_counts"] == every["unknown_counts"]
    # other filters narrow the counts too
    elsewhere = harness.get(reader, CAPS, node_id=other).json()
    assert elsewhere["unknown_counts"]["retired_pages"] == 0
    assert harness.get(reader, CAPS, unknown="temperature").status_code == 400
    assert "unknown must be" in harness.get(reader, CAPS, unknown="bogus").text

    exported = harness.get(reader, CAPS + ".csv", unknown="any")
    assert exported.status_code == 200, exported.text
    assert exported.headers["content-type"].startswith("text/csv")
    assert "heteroflow-capabilities-real-unknown-any.csv" in exported.headers["content-disposition"]
    assert exported.headers["x-total-count"] == "2"
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert [(r["gpu_index"], r["retired_pages"], r["ecc_uncorrected_total"], r["unknown_count"]) for r in rows] == [
        ("1", "unknown", "collectable", "1"),
        ("2", "unknown", "unknown", "2"),
    ]
    assert [r["uuid"] for r in rows] == ["'=GPU-1", "GPU-2"]  # never a formula
    assert {r["node_name"] for r in rows} == {"n1"}
    assert harness.get(reader, CAPS + ".csv", unknown="bogus").status_code == 400
    assert len(list(csv.DictReader(io.StringIO(harness.get(reader, CAPS + ".csv").text)))) == 4
