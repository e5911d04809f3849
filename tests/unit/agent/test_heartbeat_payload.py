from __future__ import annotations

from pathlib import Path

from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.agent.readings import GpuHealth, GpuTelemetry, HealthCollection, TelemetryCollection, XidEvent
from heteroflow.agent.xid_queue import XidQueue
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import Counters


def test_known_keys_only_with_the_collection_time(clock: FakeClock) -> None:
    collected_at = clock.now()
    health = HealthCollection(
        collector="nvidia-smi",
        collected_at=collected_at,
        gpus=(
            GpuHealth(index=3, vendor="NVIDIA", uuid="GPU-3", counters=Counters(0, 12, None, 1, 0)),
            GpuHealth(index=1, vendor="NVIDIA", uuid="GPU-1", counters=Counters()),
        ),
    )
    clock.advance(40)
    telemetry = TelemetryCollection(
        collector="nvidia-smi",
        collected_at=clock.now(),
        gpus=(GpuTelemetry(index=1, uuid="GPU-1", temperature_c=41.0), GpuTelemetry(index=7, temperature_c=50.0)),
    )
    queue = XidQueue()
    queue.put(XidEvent(index=3, uuid="GPU-3", xid=48, occurred_at=clock.now()))
    body = heartbeat_body(health=health, telemetry=telemetry, xid_events=queue.peek(10))
    stats = {stat["index"]: stat for stat in body["gpu_stats"]}
    assert sorted(stats) == [1, 3, 7]
    assert stats[3] == {
        "index": 3,
        "uuid": "GPU-3",
        "sampled_at": collected_at.isoformat(),
        "ecc_uncorrected_total": 0,
        "ecc_corrected_total": 12,
        "remapped_rows_pending": 1,
        "remapped_rows_failure": 0,
    }
    assert "retired_pages" not in stats[3]  # unknown is absent, never 0 or null
    assert "sampled_at" not in stats[1]
    assert "ecc_corrected_total" not in stats[1]
    assert stats[1]["temperature_c"] == 41.0
    assert stats[1]["telemetry_at"] == clock.now().isoformat()  # the metrics' own time, 40 s after the counters'
    assert body["xid_events"] == [{"index": 3, "uuid": "GPU-3", "xid": 48, "occurred_at": clock.now().isoformat()}]


def test_no_collection_no_stats() -> None:
    assert heartbeat_body(health=None, telemetry=None, xid_events=[]) == {"gpu_stats": [], "xid_events": []}


def test_cnmon_readings_carry_their_unconfirmed_semantics_to_the_server(
    shared_fixtures: Path, clock: FakeClock
) -> None:
    from heteroflow.agent.cnmon import parse_cnmon

    text = (shared_fixtures / "cnmon" / "cnmon__paddlenlp_llm_devices_mlu_llama_README__CNMON_v5.10.31.txt").read_text()
    table = parse_cnmon(text)
    assert table is not None
    assert table.health, table.warnings
    health = HealthCollection(collector="cnmon", collected_at=clock.now(), gpus=table.health)
    body = heartbeat_body(health=health, telemetry=None, xid_events=[])
    sent = [stat for stat in body["gpu_stats"] if "ecc_uncorrected_total" in stat]
    assert sent, "the capture has a known Ecc-Error value"
    assert all(stat["semantics_unconfirmed"] == ["ecc_uncorrected_total"] for stat in sent)
