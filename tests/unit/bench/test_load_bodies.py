"""The fleet bench's heartbeat bodies: between the agent's health reads, the last full build with the send time."""

from __future__ import annotations

import json
from typing import Any

import pytest
from bench import load_heartbeats
from bench.load_heartbeats import HEALTH_INTERVAL_SEC, SimulatedNode

from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.core.testing import FakeClock


def _node(clock: FakeClock) -> SimulatedNode:
    return SimulatedNode("load-00042", cards=8, clock=clock, started_at=clock.now())


def _without_telemetry_time(body: bytes) -> list[dict[str, Any]]:
    stats: list[dict[str, Any]] = json.loads(body)["gpu_stats"]
    for stat in stats:
        stat.pop("telemetry_at")
    return stats


def test_a_beat_between_health_reads_is_the_last_full_build_with_the_send_time() -> None:
    clock = FakeClock()
    node = _node(clock)
    first = node.body()
    clock.advance(5.0)
    later = node.body()

    stats = json.loads(later)["gpu_stats"]
    assert len(stats) == 8
    assert {stat["telemetry_at"] for stat in stats} == {clock.now().isoformat()}
    assert _without_telemetry_time(later) == _without_telemetry_time(first)
    # the first build is byte for byte the agent's own body
    twin = _node(FakeClock())
    expected = heartbeat_body(
        health=twin.collector.read_health(), telemetry=twin.collector.read_telemetry(), xid_events=()
    )
    assert first == json.dumps(expected).encode()


def test_the_health_read_every_minute_rebuilds_the_body_in_full() -> None:
    clock = FakeClock()
    node = _node(clock)
    first = json.loads(node.body())["gpu_stats"]
    clock.advance(HEALTH_INTERVAL_SEC)
    again = json.loads(node.body())["gpu_stats"]

    assert {stat["sampled_at"] for stat in again} == {clock.now().isoformat()}
    # simulated time ran an hour (speed 60): a degrading card's corrected errors grew with the new read
    assert [s["ecc_corrected_total"] for s in again] != [s["ecc_corrected_total"] for s in first]


def test_live_bodies_read_the_collector_every_beat() -> None:
    clock, twin_clock = FakeClock(), FakeClock()
    node, twin = _node(clock), _node(twin_clock)
    first = node.body(live=True)
    health = twin.collector.read_health()
    clock.advance(5.0)
    twin_clock.advance(5.0)

    expected = heartbeat_body(health=health, telemetry=twin.collector.read_telemetry(), xid_events=())
    live = node.body(live=True)
    assert live == json.dumps(expected).encode()
    assert _without_telemetry_time(live) != _without_telemetry_time(first)  # fresh values, not the last build's


def test_a_body_whose_card_times_cannot_be_found_is_built_in_full_every_beat(monkeypatch: pytest.MonkeyPatch) -> None:
    # the send time goes where each card's telemetry time was; a build where those points are not one per card
    # (here: none found) makes no template, and every beat is the agent's own full build
    monkeypatch.setattr(load_heartbeats, "_telemetry_at", lambda at: b'"never in a body": 0')
    clock, twin_clock = FakeClock(), FakeClock()
    node, twin = _node(clock), _node(twin_clock)
    node.body()
    health = twin.collector.read_health()
    twin.collector.read_telemetry()
    clock.advance(5.0)
    twin_clock.advance(5.0)

    later = node.body()
    assert (
        later
        == json.dumps(heartbeat_body(health=health, telemetry=twin.collector.read_telemetry(), xid_events=())).encode()
    )
