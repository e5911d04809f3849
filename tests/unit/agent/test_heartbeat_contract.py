"""What the agent sends is what the server reads: every collector's real beats, through the shared wire contract.

Each body is taken from the wire as the agent's HTTP client sends it (``httpx.MockTransport``), validated by the
server's models (``heteroflow.contracts.heartbeat``) and read by the server's own parsers; every value the
collector read comes back as the same value, and every unknown one comes back unknown — never 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest

from heteroflow.agent.client import HttpPlatformClient, PermanentError, Registration
from heteroflow.agent.cnmon import CnmonCollector
from heteroflow.agent.collectors import Collector
from heteroflow.agent.commands import CommandResult
from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.agent.nvidia_smi import NvidiaSmiCollector
from heteroflow.agent.nvml import GPU_IS_LOST, NOT_SUPPORTED, NvmlCollector
from heteroflow.agent.readings import HealthCollection, TelemetryCollection, XidEvent
from heteroflow.agent.runner import registration_for
from heteroflow.agent.simulated import SimulatedCollector
from heteroflow.agent.testing import FakeCommandRunner, FakeGpu, FakeNvml
from heteroflow.agent.xid_queue import XidQueue
from heteroflow.agent.xid_status import XidCollectionStatus, watcher_status
from heteroflow.agent.xpu_smi import XpuSmiCollector
from heteroflow.contracts.heartbeat import (
    GpuStat,
    Heartbeat,
    NodeRegistration,
    NodeSource,
    XidCollection,
    XidEventIn,
)
from heteroflow.core.ids import NodeId, Source
from heteroflow.core.testing import FakeClock
from heteroflow.health.beat_stats import WIRE_BEAT, beat_readings
from heteroflow.health.gpu_metrics import GpuMetrics
from heteroflow.health.heartbeat import xid_events_from_wire
from heteroflow.health.xid_collection import parse_xid_collection

from .conftest import FAKE_SMI, smi_runner

NODE = NodeId("node-1")
RECEIVED_AT = datetime(2030, 1, 1, tzinfo=UTC)


def _simulated(_fixtures: Path, clock: FakeClock) -> Collector:
    return SimulatedCollector(clock=clock, count=8, seed="node-1", speed=3600.0)


def _nvml(_fixtures: Path, clock: FakeClock) -> Collector:
    fake = FakeNvml(
        [
            FakeGpu(uuid="GPU-0", ecc_uncorrected=2, ecc_corrected=7, remapped=(5, 4, 1, 0)),
            FakeGpu(uuid="GPU-1", ecc_mode=(0, 0)),  # ECC off: the ECC counters are unknown, not 0
            FakeGpu(uuid="GPU-2", errors={"nvmlDeviceGetRemappedRows": NOT_SUPPORTED}),
            FakeGpu(uuid="GPU-3", errors={"nvmlDeviceGetTemperature": GPU_IS_LOST}),
        ]
    )
    return NvmlCollector(clock=clock, loader=lambda: fake)


def _nvidia_smi(stem: str, phase: str) -> Callable[[Path, FakeClock], Collector]:
    def make(fixtures: Path, clock: FakeClock) -> Collector:
        capture = (fixtures / "nvidia-smi" / f"nvidia_gpu_exporter__capture__linux-x86_64__{stem}.txt").read_text()
        runner = smi_runner(help_text=FAKE_SMI.help_section(capture), csv_text=FAKE_SMI.csv_section(capture, phase))
        return NvidiaSmiCollector(runner=runner, clock=clock, timeout_sec=5.0)

    return make


def _xpu_smi(fixtures: Path, clock: FakeClock) -> Collector:
    table = next((fixtures / "xpu-smi").glob("*cloudpods*P800*")).read_text()
    query = next((fixtures / "xpu-smi").glob("*xpu-smi_-q_P800*")).read_text()
    runner = FakeCommandRunner({"xpu-smi": lambda argv: CommandResult(0, query if "-q" in argv else table, "")})
    return XpuSmiCollector(runner=runner, clock=clock)


def _cnmon(name: str) -> Callable[[Path, FakeClock], Collector]:
    def make(fixtures: Path, clock: FakeClock) -> Collector:
        text = next((fixtures / "cnmon").glob(f"*{name}*")).read_text()
        return CnmonCollector(runner=FakeCommandRunner({"cnmon": CommandResult(0, text, "")}), clock=clock)

    return make


COLLECTORS: dict[str, Callable[[Path, FakeClock], Collector]] = {
    "simulated": _simulated,
    "nvml": _nvml,
    **{
        f"nvidia-smi-{card}-{phase}": _nvidia_smi(stem, phase)
        for card, stem in {
            "h100": "nvidia-h100-80gb-hbm3__590.48.01",
            "h100-mig": "nvidia-h100-mig__590.48.01",
            "h200": "nvidia-h200__590.48.01",
            "l40s": "nvidia-l40s__595.80",
            "rtx4080s": "nvidia-geforce-rtx-4080-super__595.71.05",
        }.items()
        for phase in ("idle", "load")
    },
    "xpu-smi-p800": _xpu_smi,
    "cnmon-v5.10.31": _cnmon("v5.10.31"),
    "cnmon-v5.10.10": _cnmon("v5.10.10"),
}


class Wire:
    """The platform server as the agent's HTTP client reaches it: every request body is kept as sent."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {"register": [], "heartbeat": []}

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/register"):
            self.bodies["register"].append(request.content)
            return httpx.Response(200, json={"node_id": NODE, "created": True, "heartbeat_interval_seconds": 5.0})
        self.bodies["heartbeat"].append(request.content)
        answer = {"received": 0, "stored": 0, "rejected": [], "retry": False}
        return httpx.Response(200, json={"status": "ok", "server_time": RECEIVED_AT.isoformat(), "xid_events": answer})


def _send(
    fixtures: Path, clock: FakeClock, make: Callable[[Path, FakeClock], Collector]
) -> tuple[HealthCollection, TelemetryCollection, XidCollectionStatus, bytes, bytes]:
    collector = make(fixtures, clock)
    health, telemetry = collector.read_health(), collector.read_telemetry()
    assert health.gpus or telemetry.gpus, (health.warnings, telemetry.warnings)
    queue = XidQueue()
    queue.put(XidEvent(index=0, uuid=health.gpus[0].uuid if health.gpus else None, xid=79, occurred_at=clock.now()))
    xid_status = watcher_status(
        watched=(0,), unwatched=((1, "no permission"),), lost=(3,), wait_error=None, wait_failures_total=2
    )
    wire = Wire()
    client = HttpPlatformClient(
        base_url="http://platform", token="hf_agent", transport=httpx.MockTransport(wire.handler)
    )
    registered = client.register(
        registration_for(hostname="gpu-node-1", source="real", health=health, telemetry=telemetry)
    )
    body = heartbeat_body(health=health, telemetry=telemetry, xid_events=queue.peek(10), xid_collection=xid_status)
    client.heartbeat(registered.node_id, body)
    client.close()
    return health, telemetry, xid_status, wire.bodies["register"][0], wire.bodies["heartbeat"][0]


@pytest.mark.parametrize("kind", sorted(COLLECTORS))
def test_every_collectors_beat_is_what_the_server_reads(shared_fixtures: Path, clock: FakeClock, kind: str) -> None:
    health, telemetry, xid_status, registration, sent = _send(shared_fixtures, clock, COLLECTORS[kind])

    NodeRegistration.model_validate_json(registration)
    beat = Heartbeat.model_validate_json(sent)
    body: dict[str, Any] = json.loads(sent)
    assert set(body) <= set(Heartbeat.model_fields)
    for stat in beat.gpu_stats:
        GpuStat.model_validate(stat)
        assert set(stat) <= set(GpuStat.model_fields), "the agent sends only the fields the contract declares"
    for event in beat.xid_events:
        XidEventIn.model_validate(event)
        assert set(event) <= set(XidEventIn.model_fields)

    read = beat_readings(beat.gpu_stats, node_id=NODE, source="real", received_at=RECEIVED_AT)
    assert read.invalid == 0
    counters = {reading.key.gpu_index: reading for reading in read.health}
    for gpu in health.gpus:
        assert counters[gpu.index].counters == gpu.counters  # the same values, None where unknown
        assert counters[gpu.index].uuid == gpu.uuid
        known = any(value is not None for value in gpu.counters.as_dict().values())
        # an unconfirmed meaning travels with the values it qualifies; a card without any has nothing to qualify
        assert set(counters[gpu.index].semantics_unconfirmed) == (set(gpu.semantics_unconfirmed) if known else set())
        if known:
            assert counters[gpu.index].sampled_at == health.collected_at
    metrics = {reading.key.gpu_index: reading.metrics for reading in read.metrics}
    for card in telemetry.gpus:
        expected = GpuMetrics(
            temperature_c=card.temperature_c,
            utilization_pct=card.utilization_pct,
            memory_used_mib=card.memory_used_mib,
            memory_total_mib=card.memory_total_mib,
            power_w=card.power_w,
        )
        assert metrics.get(card.index, GpuMetrics()) == expected

    # every collector's beat takes the server's typed one-step decode, and reads the same there
    wired = WIRE_BEAT.decode(sent)
    assert beat_readings(wired.gpu_stats, node_id=NODE, source="real", received_at=RECEIVED_AT) == read
    assert (wired.xid_events, wired.xid_collection) == (beat.xid_events, beat.xid_collection)

    events, rejected = xid_events_from_wire(beat.xid_events)
    assert rejected == []
    assert [(e.gpu_index, e.xid, e.occurred_at) for e in events] == [(0, 79, clock.now())]
    assert isinstance(beat.xid_collection, dict)
    XidCollection.model_validate(beat.xid_collection)
    assert set(beat.xid_collection) <= set(XidCollection.model_fields)
    report = parse_xid_collection(beat.xid_collection)
    assert report is not None
    assert (report.state, report.watched, report.unwatched, report.lost, report.wait_failures_total) == (
        xid_status.state,
        xid_status.watched,
        xid_status.unwatched,
        xid_status.lost,
        xid_status.wait_failures_total,
    )


def test_unknown_travels_as_unknown_never_as_zero(clock: FakeClock) -> None:
    """A card whose every value is unknown: counters absent, telemetry null, and the server reads None."""
    fake = FakeNvml([FakeGpu(uuid="GPU-9", ecc_mode=(0, 0), errors={"nvmlDeviceGetTemperature": GPU_IS_LOST})])
    collector = NvmlCollector(clock=clock, loader=lambda: fake)
    health, telemetry = collector.read_health(), collector.read_telemetry()
    body = json.loads(json.dumps(heartbeat_body(health=health, telemetry=telemetry, xid_events=[])))
    (stat,) = body["gpu_stats"]
    assert "ecc_uncorrected_total" not in stat
    assert "ecc_corrected_total" not in stat
    assert stat["temperature_c"] is None
    (reading,) = beat_readings(body["gpu_stats"], node_id=NODE, source="real", received_at=RECEIVED_AT).health
    assert reading.counters.ecc_uncorrected_total is None
    assert reading.counters.ecc_corrected_total is None


def test_a_registration_the_server_would_refuse_is_refused_before_it_is_sent() -> None:
    wire = Wire()
    client = HttpPlatformClient(
        base_url="http://platform", token="hf_agent", transport=httpx.MockTransport(wire.handler)
    )
    refused = Registration(hostname="gpu-node-1", vendor="NVIDIA\u202e", model="", gpu_count=1, source="real")
    with pytest.raises(PermanentError, match="vendor"):
        client.register(refused)
    with pytest.raises(PermanentError, match="hostname"):
        client.register(Registration(hostname="-bad", vendor="NVIDIA", model="", gpu_count=1, source="real"))
    assert wire.bodies["register"] == []


def test_the_contracts_node_source_is_the_platforms() -> None:
    assert get_args(NodeSource) == get_args(Source)
