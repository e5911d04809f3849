from __future__ import annotations

import threading

import pytest

from heteroflow.agent.client import CredentialRequiredError, PermanentError, ServerUnavailableError
from heteroflow.agent.collectors import Selection
from heteroflow.agent.readings import GpuHealth, GpuTelemetry, HealthCollection, TelemetryCollection, XidEvent
from heteroflow.agent.runner import Agent, registration_for
from heteroflow.agent.scheduler import CollectionService
from heteroflow.agent.testing import FakeCollector, FakePlatformClient
from heteroflow.agent.xid_queue import XidQueue
from heteroflow.core.ids import Source
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import Counters


def make_agent(
    clock: FakeClock,
    client: FakePlatformClient,
    *,
    source: Source = "real",
    capacity: int = 100,
    interval_sec: float = 5.0,
    backoff_sec: tuple[float, float] = (1.0, 30.0),
) -> tuple[Agent, CollectionService, XidQueue]:
    health = HealthCollection(
        collector="nvidia-smi",
        collected_at=clock.now(),
        gpus=tuple(
            GpuHealth(
                index=i, vendor="NVIDIA", uuid=f"GPU-{i}", name="NVIDIA H100", counters=Counters(0, i, None, 0, 0)
            )
            for i in range(2)
        ),
    )
    telemetry = TelemetryCollection(
        collector="nvidia-smi", collected_at=clock.now(), gpus=(GpuTelemetry(index=0, temperature_c=40.0),)
    )
    collector = FakeCollector(clock=clock, health=health, telemetry=telemetry)
    svc = CollectionService(
        selection=Selection(collector=collector, first_health=health, warnings=()),
        clock=clock,
        heartbeat_interval_sec=5.0,
        health_interval_sec=60.0,
        tick_timeout_sec=5.0,
    )
    svc.tick_telemetry()
    queue = XidQueue(capacity)
    agent = Agent(
        client=client,
        collection=svc,
        xid_queue=queue,
        clock=clock,
        hostname="gpu-node-1",
        source=source,
        heartbeat_interval_sec=interval_sec,
        reconnect_initial_sec=backoff_sec[0],
        reconnect_max_sec=backoff_sec[1],
    )
    return agent, svc, queue


def test_registers_once_then_beats_the_cached_readings(clock: FakeClock) -> None:
    client = FakePlatformClient()
    agent, _, _ = make_agent(clock, client)
    agent.beat()
    agent.beat()
    assert client.nodes["gpu-node-1"][1].gpu_count == 2
    assert client.nodes["gpu-node-1"][1].model == "NVIDIA H100"
    assert client.nodes["gpu-node-1"][1].vendor == "NVIDIA"
    assert client.nodes["gpu-node-1"][1].source == "real"
    assert agent.status().registrations == 1
    assert agent.status().beats_sent == 2
    stats = client.beats[-1][1]["gpu_stats"]
    assert stats[1]["ecc_corrected_total"] == 1
    assert "retired_pages" not in stats[1]


def test_a_deleted_node_registers_again(clock: FakeClock) -> None:
    from heteroflow.agent.client import NodeGoneError

    client = FakePlatformClient()
    agent, _, _ = make_agent(clock, client)
    agent.beat()
    client.forget("gpu-node-1")
    with pytest.raises(NodeGoneError):
        agent.beat()
    agent.beat()
    assert agent.status().registrations == 2
    assert agent.status().node_id == client.nodes["gpu-node-1"][0]


def test_xid_events_survive_an_outage_and_a_retry_answer(clock: FakeClock) -> None:
    client = FakePlatformClient()
    agent, _, queue = make_agent(clock, client)
    agent.beat()
    queue.put(XidEvent(index=1, uuid="GPU-1", xid=48, occurred_at=clock.now()))
    client.fail_with = ServerUnavailableError("connection refused")
    with pytest.raises(ServerUnavailableError):
        agent.beat()
    assert queue.status().pending == 1
    client.fail_with = None
    client.xid_retry = True  # the server could not store them: keep
    agent.beat()
    assert queue.status().pending == 1
    client.xid_retry = False
    agent.beat()
    assert queue.status().pending == 0
    assert len(client.stored_xids) == 1
    assert [len(body["xid_events"]) for _, body in client.beats] == [0, 1, 1]


def test_a_simulated_node_registers_as_simulated(clock: FakeClock) -> None:
    client = FakePlatformClient()
    agent, _, _ = make_agent(clock, client, source="simulated")
    agent.beat()
    assert client.nodes["gpu-node-1"][1].source == "simulated"


def test_run_backs_off_while_the_server_is_away_and_stops_cleanly(clock: FakeClock) -> None:
    client = FakePlatformClient()
    client.fail_with = ServerUnavailableError("connection refused")
    agent, _, _ = make_agent(clock, client, interval_sec=0.01, backoff_sec=(0.01, 0.02))
    thread = threading.Thread(target=agent.run)
    thread.start()
    deadline = 200
    while agent.status().beats_failed < 3 and deadline:
        agent.stop_event.wait(0.02)
        deadline -= 1
    assert agent.status().consecutive_failures >= 3
    client.fail_with = None
    while agent.status().beats_sent < 1 and deadline:
        agent.stop_event.wait(0.02)
        deadline -= 1
    assert agent.status().consecutive_failures == 0
    agent.stop_event.set()
    thread.join(5)
    assert not thread.is_alive()
    assert agent.status().stopped_reason == "stopped"
    assert client.closed


def test_run_stops_with_exit_2_when_refused(clock: FakeClock) -> None:
    client = FakePlatformClient()
    client.fail_with = PermanentError("hostname registered with another source")
    agent, _, _ = make_agent(clock, client, interval_sec=0.01)
    assert agent.run() == 2
    assert "another source" in (agent.status().stopped_reason or "")


def test_run_waits_for_its_node_when_its_credential_is_missing_and_never_exits(clock: FakeClock) -> None:
    client = FakePlatformClient()
    client.fail_with = CredentialRequiredError("this token may reclaim the node in 1 s", retry_after_sec=0.01)
    agent, _, _ = make_agent(clock, client, interval_sec=0.01, backoff_sec=(5.0, 5.0))
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        deadline = 250  # polled, 20 ms each: the server's Retry-After (10 ms) paces it, not the 5 s backoff
        while agent.status().beats_failed < 3 and deadline:
            agent.stop_event.wait(0.02)
            deadline -= 1
        assert agent.status().beats_failed >= 3, agent.status()
        assert thread.is_alive()  # no exit: a lost credential is waited out
        assert agent.status().stopped_reason is None
        assert "reclaim the node" in (agent.status().last_error or "")
        client.fail_with = None  # the node may be reclaimed now
        while agent.status().beats_sent < 1 and deadline:
            agent.stop_event.wait(0.02)
            deadline -= 1
        assert agent.status().beats_sent >= 1
    finally:
        agent.stop_event.set()
        thread.join(5)
    assert not thread.is_alive()


def test_registration_of_a_node_with_nothing_collected(clock: FakeClock) -> None:
    registration = registration_for(hostname="h", source="real", health=None, telemetry=None)
    assert (registration.vendor, registration.model, registration.gpu_count) == ("unknown", "", 0)


def test_beats_go_on_while_the_collector_hangs(clock: FakeClock) -> None:
    client = FakePlatformClient()
    agent, svc, _ = make_agent(clock, client, interval_sec=0.01)
    collector = svc.collector
    assert isinstance(collector, FakeCollector)
    collector.hold = threading.Event()  # every read from now on blocks, like a hung driver
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        for _ in range(500):
            if collector.telemetry_reads >= 1:
                break
            agent.stop_event.wait(0.01)
        assert collector.telemetry_reads >= 1  # the telemetry loop is now stuck inside the collector
        beats_then = agent.status().beats_sent
        for _ in range(500):
            if agent.status().beats_sent >= beats_then + 20:
                break
            agent.stop_event.wait(0.01)
        assert agent.status().beats_sent >= beats_then + 20
    finally:
        agent.stop_event.set()
        collector.hold.set()
        thread.join(10)
    assert not thread.is_alive()


class _RecordingStop(threading.Event):
    """The agent's stop event, recording every wait's timeout (the XID loop's backoff) without waiting."""

    def __init__(self, *, stop_after: int) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []
        self._stop_after = stop_after

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        if len(self.timeouts) >= self._stop_after:
            self.set()
        return self.is_set()


def test_the_xid_loop_backs_off_a_persistent_nvml_error_instead_of_spinning(clock: FakeClock) -> None:
    from heteroflow.agent.nvml import GPU_IS_LOST, NvmlCollector, XidWatcher
    from heteroflow.agent.testing import FakeGpu, FakeNvml

    fake = FakeNvml([FakeGpu(), FakeGpu()])
    fake.wait_error = GPU_IS_LOST  # which card is lost cannot be told: every card still answers
    collector = NvmlCollector(clock=clock, loader=lambda: fake)
    assert collector.available()[0]
    assert collector.api is not None
    watcher = XidWatcher(api=collector.api, clock=clock)
    assert watcher.start()
    client = FakePlatformClient()
    agent, _, _ = make_agent(clock, client)
    stop = _RecordingStop(stop_after=8)
    agent.stop_event = stop
    loop = threading.Thread(target=agent._xid_loop, args=(watcher,), daemon=True)
    loop.start()
    loop.join(10.0)
    alive = loop.is_alive()
    stop.set()
    assert not alive, f"the XID loop spun: {fake.calls.count('nvmlEventSetWait')} waits"
    assert fake.calls.count("nvmlEventSetWait") == 8  # one wait per backoff, never a tight loop
    assert stop.timeouts == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert watcher.status().state == "not_collected"


def test_every_beat_says_whether_xid_events_are_collected(clock: FakeClock) -> None:
    client = FakePlatformClient()
    agent, _, _ = make_agent(clock, client)  # nvidia-smi: no event source
    agent.beat()
    sent = client.beats[-1][1]["xid_collection"]
    assert sent["state"] == "not_collected"
    assert "through NVML only" in sent["reason"]
    assert agent.status().xid_collection.state == "not_collected"
