"""A vendor tool that keeps timing out is reported with every beat (which tool, since when), the beats go on,
and the report ends at the tool's first answer."""

from __future__ import annotations

import threading

from heteroflow.agent.collectors import Selection
from heteroflow.agent.nvidia_smi import NvidiaSmiCollector
from heteroflow.agent.runner import Agent
from heteroflow.agent.scheduler import CollectionService
from heteroflow.agent.testing import FakeCollector, FakePlatformClient
from heteroflow.agent.tool_stalls import ToolStall, ToolStallTracker, WatchedRunner
from heteroflow.agent.xid_queue import XidQueue
from heteroflow.contracts.heartbeat import Heartbeat
from heteroflow.core.testing import FakeClock

from .conftest import OWN_FIXTURES, smi_runner

HELP = (OWN_FIXTURES / "help-query-gpu.synthetic.txt").read_text()
CSV = (OWN_FIXTURES / "query-gpu.synthetic.csv").read_text()


def smi_agent(clock: FakeClock) -> tuple[Agent, CollectionService, FakePlatformClient, set[str]]:
    fake = smi_runner(help_text=HELP, csv_text=CSV)
    stalls = ToolStallTracker(now=clock.now)
    collector = NvidiaSmiCollector(runner=WatchedRunner(fake, stalls), clock=clock, timeout_sec=5.0)
    svc = CollectionService(
        selection=Selection(collector=collector, first_health=None, warnings=()),
        clock=clock,
        heartbeat_interval_sec=5.0,
        health_interval_sec=60.0,
        tick_timeout_sec=5.0,
        stalls=stalls,
    )
    client = FakePlatformClient()
    agent = Agent(
        client=client,
        collection=svc,
        xid_queue=XidQueue(10),
        clock=clock,
        hostname="gpu-node-1",
        source="real",
        heartbeat_interval_sec=5.0,
        reconnect_initial_sec=1.0,
        reconnect_max_sec=30.0,
    )
    return agent, svc, client, fake.hang


def test_a_timing_out_tool_is_reported_with_every_beat_until_it_answers(clock: FakeClock) -> None:
    agent, svc, client, hang = smi_agent(clock)
    svc.tick_telemetry()
    agent.beat()
    assert "tool_stalls" not in client.beats[-1][1]  # every tool answers: the beat is as it always was
    hang.add("nvidia-smi")
    started = clock.now()
    svc.tick_telemetry()
    clock.advance(5)
    svc.tick_telemetry()
    clock.advance(5)
    agent.beat()
    body = client.beats[-1][1]
    assert body["tool_stalls"] == [{"tool": "nvidia-smi", "since": started.isoformat(), "timeouts": 2}]
    Heartbeat.model_validate(body)  # the wire contract takes it
    assert svc.status().tool_stalls == (ToolStall(tool="nvidia-smi", since=started, timeouts=2),)
    hang.clear()
    svc.tick_telemetry()
    agent.beat()
    assert "tool_stalls" not in client.beats[-1][1]
    assert svc.status().tool_stalls == ()


def test_a_tick_stuck_inside_the_collector_is_a_stall_of_the_collector_and_beats_go_on(clock: FakeClock) -> None:
    collector = FakeCollector(clock=clock, name="nvml")
    svc = CollectionService(
        selection=Selection(collector=collector, first_health=None, warnings=()),
        clock=clock,
        heartbeat_interval_sec=5.0,
        health_interval_sec=60.0,
        tick_timeout_sec=0.05,
    )
    assert svc.tick_telemetry() is not None
    assert svc.status().tool_stalls == ()
    collector.hold = threading.Event()  # NVML stuck in the driver
    try:
        assert svc.tick_telemetry() is None
        assert svc.tick_health() is None  # still stuck: answered at once
        (stall,) = svc.status().tool_stalls
        assert (stall.tool, stall.timeouts) == ("nvml", 2)
    finally:
        collector.hold.set()


def test_the_tracker_bounds_what_it_keeps(clock: FakeClock) -> None:
    tracker = ToolStallTracker(now=clock.now)
    for i in range(20):
        tracker.timed_out(f"tool-{i}" + "x" * 100)
    stalls = tracker.stalls()
    assert len(stalls) == 8
    assert all(len(stall.tool) <= 40 for stall in stalls)
