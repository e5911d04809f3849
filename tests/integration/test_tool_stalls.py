"""A stalled vendor tool named by a node's beats shows in the node's status and in ``/metrics``, and is gone once
a beat no longer names it."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from heteroflow.health.tool_stalls import parse_tool_stalls
from tests.support.harness import Harness, running_server

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def platform(engine: Engine) -> Any:
    with running_server(engine, start=START) as harness:
        yield harness


def test_a_stalled_tool_shows_in_the_node_status_and_metrics_until_it_answers(platform: Harness) -> None:
    agent = platform.token("agent")
    node_id = platform.register(agent, "gpu-stall-1")
    since = "2026-03-01T11:58:30+00:00"
    stalls = [{"tool": "nvidia-smi", "since": since, "timeouts": 3}]
    assert platform.beat(agent, node_id, [], tool_stalls=stalls).status_code == 200
    reader = platform.token("nodes:read")
    node = platform.get(reader, f"/api/v1/nodes/{node_id}").json()
    assert node["tool_stalls"] == [{"tool": "nvidia-smi", "since": "2026-03-01T11:58:30Z", "timeouts": 3}]
    scraped = platform.get(platform.token("metrics:read"), "/metrics").text
    found = re.findall(
        r'^heteroflow_node_tool_stalled_since_seconds\{node="gpu-stall-1",tool="nvidia-smi"\} (\S+)$', scraped, re.M
    )
    assert [float(value) for value in found] == [datetime.fromisoformat(since).timestamp()]
    assert platform.beat(agent, node_id, []).status_code == 200  # the tool answered: the beat names none
    assert platform.get(reader, f"/api/v1/nodes/{node_id}").json()["tool_stalls"] is None
    scraped = platform.get(platform.token("metrics:read"), "/metrics").text
    assert 'tool="nvidia-smi"' not in scraped


def test_odd_reports_are_read_leniently() -> None:
    assert parse_tool_stalls(None) is None
    assert parse_tool_stalls({"tool": "x"}) is None
    parsed = parse_tool_stalls(
        [
            {"tool": "nvidia-smi", "since": "2026-03-01T11:58:30", "timeouts": True},
            {"tool": 7, "since": "2026-03-01T11:58:30"},
            {"tool": "xpu-smi", "since": "yesterday"},
            {"tool": 'a"b\\c\x00d', "since": "2026-03-01T11:58:30+08:00", "timeouts": 2},
            "junk",
        ]
    )
    assert parsed is not None
    assert [(s.tool, s.since.tzinfo is not None, s.timeouts) for s in parsed] == [
        ("abcd", True, 2),
        ("nvidia-smi", True, None),
    ]
