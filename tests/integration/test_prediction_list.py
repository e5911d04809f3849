"""The prediction list at fleet scale: server-side filters (status, type, card search), sort and the CSV export,
on SQLite and PostgreSQL, against predictions the real worker made from simulated profiles."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.simulation import Profile, series
from heteroflow.storage.health_store import SqlHealthSampleStore
from tests.support.harness import Harness, running_server

NOW = datetime(2026, 5, 20, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def write_profile(h: Harness, node: str, index: int, profile: Profile) -> None:
    key = CardKey(node_id=NodeId(node), gpu_index=index, source="real")
    SqlHealthSampleStore(h.ctx.engine).insert(
        [
            HealthReading(key=key, uuid=s.uuid, sampled_at=s.sampled_at, counters=s.counters)
            for s in series(profile, card=index, start=NOW - 10 * DAY, end=NOW)
        ]
    )


@pytest.fixture
def fleet(engine: Engine) -> Iterator[tuple[Harness, str, dict[str, str]]]:
    """Three nodes: ``gpu-a`` with a degrading card (trend) and a card with uncorrectable errors (strong),
    ``gpu-b`` with a remap failure (strong), ``gpu-c`` with a degrading card."""
    with running_server(engine, start=NOW) as h:
        agent = h.token("agent")
        nodes = {name: h.register(agent, name) for name in ("gpu-a", "gpu-b", "gpu-c")}
        write_profile(h, nodes["gpu-a"], 0, "degrading")
        write_profile(h, nodes["gpu-a"], 1, "sudden-ue")
        write_profile(h, nodes["gpu-b"], 0, "remap-failure")
        write_profile(h, nodes["gpu-c"], 3, "degrading")
        assert sum(h.ctx.worker.tick().predictions_created.values()) == 4
        yield h, h.token("nodes:read"), nodes


def listed(h: Harness, token: str, **params: Any) -> list[dict[str, Any]]:
    response = h.get(token, "/api/v1/gpu-health/predictions", **params)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    assert response.json()["total"] == len(items)
    return items


def cards(items: list[dict[str, Any]], nodes: dict[str, str]) -> list[tuple[str, int]]:
    names = {node_id: name for name, node_id in nodes.items()}
    return [(names[i["node_id"]], i["gpu_index"]) for i in items]


def test_type_filters_and_strong_first_answer_which_cards_to_replace(
    fleet: tuple[Harness, str, dict[str, str]],
) -> None:
    h, reader, nodes = fleet
    strong = listed(h, reader, type="strong")
    assert sorted(cards(strong, nodes)) == [("gpu-a", 1), ("gpu-b", 0)]
    assert all({"uncorrectable_ecc", "remap_failure"} & set(i["signals"]) for i in strong)
    assert sorted(cards(listed(h, reader, type="trend"), nodes)) == [("gpu-a", 0), ("gpu-c", 3)]
    assert cards(listed(h, reader, type="remap_failure"), nodes) == [("gpu-b", 0)]
    # "predicted this week, uncorrectable first": one filter and one sort
    week = listed(h, reader, since=(NOW - 7 * DAY).isoformat(), sort="strong_first", status="pending")
    assert len(week) == 4
    assert set(cards(week[:2], nodes)) == {("gpu-a", 1), ("gpu-b", 0)}
    assert all(not {"uncorrectable_ecc", "remap_failure"} & set(i["signals"]) for i in week[2:])
    soonest = listed(h, reader, sort="window_end")
    assert [i["window_end"] for i in soonest] == sorted(i["window_end"] for i in soonest)


def test_card_search_matches_uuid_or_node_name_and_wildcards_are_literal(
    fleet: tuple[Harness, str, dict[str, str]],
) -> None:
    h, reader, nodes = fleet
    assert sorted(cards(listed(h, reader, q="GPU-A"), nodes)) == [("gpu-a", 0), ("gpu-a", 1)]
    some = listed(h, reader, node_id=nodes["gpu-b"])[0]
    assert cards(listed(h, reader, q=some["uuid"][-6:].lower()), nodes) == [("gpu-b", 0)]
    assert listed(h, reader, q="%") == []  # a LIKE wildcard is a character, not "anything"
    assert listed(h, reader, q="gpu_a") == []
    tenant = h.token("nodes:read", tenant="other")
    assert listed(h, tenant, q="gpu") == []  # searching never crosses the tenant's scope


@pytest.mark.parametrize(
    ("params", "message"),
    [({"type": "weak"}, "type must be one of"), ({"sort": "random"}, "sort must be one of"), ({"q": ""}, "")],
)
def test_bad_filters_are_400_or_422(fleet: tuple[Harness, str, dict[str, str]], params: Any, message: str) -> None:
    h, reader, _ = fleet
    for path in ("/api/v1/gpu-health/predictions", "/api/v1/gpu-health/predictions.csv"):
        response = h.get(reader, path, **params)
        assert response.status_code in (400, 422), response.text
        assert message in response.text


def test_the_csv_export_has_every_filtered_row_with_node_names(
    fleet: tuple[Harness, str, dict[str, str]],
) -> None:
    h, reader, _ = fleet
    response = h.get(reader, "/api/v1/gpu-health/predictions.csv", sort="strong_first")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    assert "attachment" in response.headers["content-disposition"]
    assert response.headers["x-total-count"] == "4"
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [(r["node_id"], int(r["gpu_index"])) for r in rows] == [
        (i["node_id"], i["gpu_index"]) for i in listed(h, reader, sort="strong_first")
    ]
    assert {r["node_name"] for r in rows} == {"gpu-a", "gpu-b", "gpu-c"}
    trend = list(csv.DictReader(io.StringIO(h.get(reader, "/api/v1/gpu-health/predictions.csv", type="trend").text)))
    assert len(trend) == 2
    assert h.client.get("/api/v1/gpu-health/predictions.csv").status_code == 401


def test_the_capability_matrix_filters_stalled_cards_nodes_and_searches(
    fleet: tuple[Harness, str, dict[str, str]],
) -> None:
    h, reader, nodes = fleet

    def listed_cards(**params: Any) -> list[tuple[str, int]]:
        response = h.get(reader, "/api/v1/gpu-health/capabilities", **params)
        assert response.status_code == 200, response.text
        return cards(response.json()["cards"], nodes)

    every = listed_cards()
    assert sorted(every) == [("gpu-a", 0), ("gpu-a", 1), ("gpu-b", 0), ("gpu-c", 3)]
    assert listed_cards(stalled="true") == []  # every card reported a sample just now
    assert sorted(listed_cards(stalled="false")) == sorted(every)
    h.clock.advance(2 * 3600)  # no sample for two hours: past the 60-minute stall threshold
    assert sorted(listed_cards(stalled="true")) == sorted(every)
    assert sorted(listed_cards(node_id=nodes["gpu-a"])) == [("gpu-a", 0), ("gpu-a", 1)]
    assert listed_cards(q="GPU-B") == [("gpu-b", 0)]
    assert h.get(reader, "/api/v1/gpu-health/capabilities", stalled="maybe").status_code == 422
