"""The agent's real registrations and beats through the real routes: every value a collector read is stored as read.

The unit test (``tests/unit/agent/test_heartbeat_contract.py``) checks the bodies against the contract models and
the server's parsers; this one sends them to the platform server on a real database and reads the samples back
through the API: a known counter comes back as its value, an unknown one as ``null`` — never 0.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.agent.runner import registration_for
from heteroflow.contracts.heartbeat import NodeRegistration
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import HEALTH_KEYS
from tests.support.harness import Harness, running_server
from tests.unit.agent.conftest import SHARED_FIXTURES
from tests.unit.agent.test_heartbeat_contract import COLLECTORS

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KINDS = ["simulated", "nvml", "nvidia-smi-h100-load", "xpu-smi-p800", "cnmon-v5.10.31"]


@pytest.fixture
def platform(engine: Engine) -> Any:
    with running_server(engine, start=START) as harness:
        yield harness


@pytest.mark.parametrize("kind", KINDS)
def test_a_collectors_beat_is_stored_as_the_collector_read_it(platform: Harness, kind: str) -> None:
    if kind not in ("simulated", "nvml") and not SHARED_FIXTURES.is_dir():
        pytest.skip(f"the shared vendor-tool captures are not here ({SHARED_FIXTURES}); CI has them")
    clock = FakeClock(START)
    collector = COLLECTORS[kind](SHARED_FIXTURES, clock)
    health, telemetry = collector.read_health(), collector.read_telemetry()
    registration = registration_for(hostname=f"node-{kind}", source="real", health=health, telemetry=telemetry)
    fields = NodeRegistration.model_validate(registration, from_attributes=True).model_dump(mode="json")
    token = platform.token("agent")
    node_id = platform.register(token, **fields)
    body = heartbeat_body(health=health, telemetry=telemetry, xid_events=[])
    beat = platform.beat(token, node_id, body["gpu_stats"])
    assert beat.status_code == 200, beat.text
    platform.drain()

    reader = platform.token("nodes:read")
    stored = 0
    for gpu in health.gpus:
        sent = gpu.counters.as_dict()
        if all(value is None for value in sent.values()):
            continue  # nothing known: the server writes no row for it
        answer = platform.get(reader, "/api/v1/gpu-health/samples", node_id=node_id, gpu_index=gpu.index)
        assert answer.status_code == 200, answer.text
        (sample,) = answer.json()["samples"]
        assert {key: sample[key] for key in HEALTH_KEYS} == {key: sent[key] for key in HEALTH_KEYS}
        assert sample["uuid"] == gpu.uuid
        stored += 1
    assert stored > 0, "the collector read at least one known counter"
