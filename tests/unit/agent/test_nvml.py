from __future__ import annotations

import pytest

from heteroflow.agent.nvml import (
    GPU_IS_LOST,
    LIBRARY_NOT_FOUND,
    NO_PERMISSION,
    NOT_SUPPORTED,
    RESET_REQUIRED,
    UNKNOWN,
    NvmlCollector,
    NvmlUnavailableError,
    XidWatcher,
)
from heteroflow.agent.testing import FakeGpu, FakeNvml
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import Counters


def nvml_collector(clock: FakeClock, fake: FakeNvml) -> NvmlCollector:
    return NvmlCollector(clock=clock, loader=lambda: fake)


def test_aggregate_ecc_retired_pages_of_both_causes_and_remapped_rows(clock: FakeClock) -> None:
    fake = FakeNvml(
        [
            FakeGpu(
                uuid="GPU-1",
                ecc_uncorrected=2,
                ecc_corrected=55_000_000_000,
                retired_sbe=3,
                retired_dbe=1,
                retired_pending=1,
                remapped=(5, 4, 1, 0),
            )
        ]
    )
    health = nvml_collector(clock, fake).read_health()
    gpu = health.gpus[0]
    assert (gpu.index, gpu.uuid, gpu.vendor, gpu.name) == (0, "GPU-1", "NVIDIA", "NVIDIA H100 80GB HBM3")
    # the remapped-row counts are counters; without a DRAM/SRAM split (NOT_SUPPORTED) the totals stand, SRAM unknown
    assert gpu.counters == Counters(2, 55_000_000_000, 4, 1, 0, 5, 4, None, None)
    assert dict(gpu.extras) == {"retired_pages_pending": 1}
    assert health.collector == "nvml"
    assert health.warnings == ()


@pytest.mark.parametrize("code", [NOT_SUPPORTED, NO_PERMISSION, GPU_IS_LOST, RESET_REQUIRED, UNKNOWN, 2])
@pytest.mark.parametrize(
    ("function", "unknown_keys"),
    [
        ("nvmlDeviceGetTotalEccErrors", {"ecc_uncorrected_total", "ecc_corrected_total"}),
        ("nvmlDeviceGetEccMode", {"ecc_uncorrected_total", "ecc_corrected_total"}),
        ("nvmlDeviceGetRetiredPages", {"retired_pages"}),
        (
            "nvmlDeviceGetRemappedRows",
            {
                "remapped_rows_pending",
                "remapped_rows_failure",
                "remapped_rows_correctable",
                "remapped_rows_uncorrectable",
            },
        ),
    ],
)
def test_every_nvml_error_class_makes_only_that_value_unknown(
    clock: FakeClock, code: int, function: str, unknown_keys: set[str]
) -> None:
    fake = FakeNvml([FakeGpu(errors={function: code}), FakeGpu()])
    health = nvml_collector(clock, fake).read_health()
    values = health.gpus[0].counters.as_dict()
    no_split = {"ecc_sram_uncorrected_total", "ecc_sram_corrected_total"}  # these fakes have no DRAM/SRAM split
    assert {key for key, value in values.items() if value is None} == unknown_keys | no_split
    assert health.gpus[1].counters == Counters(0, 0, 0, 0, 0, 0, 0)  # the other card is untouched
    lost = [w for w in health.warnings if "GPU 0" in w]
    if code in (NOT_SUPPORTED, NO_PERMISSION):
        assert lost == []  # expected on many cards; not worth a warning
    else:
        assert lost  # lost/reset is a health event, the rest an unexpected error: both are said


def test_a_lost_gpu_is_unknown_everywhere_and_reported(clock: FakeClock) -> None:
    fake = FakeNvml([FakeGpu(errors={"nvmlDeviceGetHandleByIndex": GPU_IS_LOST}), FakeGpu(uuid="GPU-2")])
    health = nvml_collector(clock, fake).read_health()
    assert [(g.index, g.uuid, g.counters) for g in health.gpus] == [
        (0, None, Counters()),
        (1, "GPU-2", Counters(0, 0, 0, 0, 0, 0, 0)),
    ]
    assert any("GPU 0: GPU is lost" in w for w in health.warnings)


def test_ecc_disabled_is_unknown_not_zero(clock: FakeClock) -> None:
    fake = FakeNvml([FakeGpu(ecc_mode=(0, 0))])
    counters = nvml_collector(clock, fake).read_health().gpus[0].counters
    assert counters.ecc_uncorrected_total is None
    assert counters.ecc_corrected_total is None
    assert "nvmlDeviceGetTotalEccErrors" not in fake.calls


def test_mig_mode_remapped_rows_not_supported(clock: FakeClock) -> None:
    fake = FakeNvml(
        [FakeGpu(errors={"nvmlDeviceGetRemappedRows": NOT_SUPPORTED, "nvmlDeviceGetRetiredPages": NOT_SUPPORTED})]
    )
    assert nvml_collector(clock, fake).read_health().gpus[0].counters == Counters(0, 0, None, None, None)


def test_library_not_found_means_unavailable_with_a_warning(clock: FakeClock) -> None:
    collector = nvml_collector(clock, FakeNvml(init_error=LIBRARY_NOT_FOUND))
    ok, why = collector.available()
    assert not ok
    assert "NVML unavailable" in why
    health = collector.read_health()
    assert health.gpus == ()
    assert health.warnings


def test_the_package_missing_means_unavailable(clock: FakeClock) -> None:
    def missing() -> FakeNvml:
        raise NvmlUnavailableError("nvidia-ml-py (pynvml) is not installed")

    ok, why = NvmlCollector(clock=clock, loader=missing).available()
    assert not ok
    assert "not installed" in why


def test_the_real_library_on_this_machine_falls_back_cleanly(clock: FakeClock) -> None:
    # Either pynvml is absent or it finds no driver here: both must be "unavailable", never a crash.
    ok, why = NvmlCollector(clock=clock).available()
    if ok:  # pragma: no cover - only on a machine with an NVIDIA driver
        pytest.skip("an NVIDIA driver is present on this machine")
    assert "NVML unavailable" in why


def test_telemetry_in_si_units(clock: FakeClock) -> None:
    fake = FakeNvml([FakeGpu(temperature=55, utilization=97, power_mw=312_500, memory_used=2 * 1024**3)])
    gpu = nvml_collector(clock, fake).read_telemetry().gpus[0]
    assert (gpu.temperature_c, gpu.utilization_pct, gpu.power_w, gpu.memory_used_mib) == (55.0, 97.0, 312.5, 2048.0)


def test_xid_events_are_read_with_index_uuid_and_time(clock: FakeClock) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    collector = nvml_collector(clock, fake)
    assert collector.available()[0]
    assert collector.api is not None
    watcher = XidWatcher(api=collector.api, clock=clock)
    assert watcher.start()
    assert fake.registered == {0, 1}
    assert watcher.poll(0) is None  # NVML timeout: nothing happened
    fake.emit_xid(1, 94)
    event = watcher.poll(1000)
    assert event is not None
    assert (event.index, event.uuid, event.xid, event.occurred_at) == (1, "GPU-b", 94, clock.now())
    assert watcher.warnings == []
    watcher.close()
    collector.close()
    assert not fake.initialised


def test_xid_registration_not_supported_on_a_card_is_a_warning(clock: FakeClock) -> None:
    fake = FakeNvml([FakeGpu(errors={"nvmlDeviceRegisterEvents": NOT_SUPPORTED}), FakeGpu()])
    collector = nvml_collector(clock, fake)
    collector.available()
    assert collector.api is not None
    watcher = XidWatcher(api=collector.api, clock=clock)
    assert watcher.start()
    assert fake.registered == {1}
    assert any("GPU 0" in w for w in watcher.warnings)


def _watching(clock: FakeClock, fake: FakeNvml) -> XidWatcher:
    collector = nvml_collector(clock, fake)
    assert collector.available()[0]
    assert collector.api is not None
    watcher = XidWatcher(api=collector.api, clock=clock)
    watcher.start()
    return watcher


def test_a_card_lost_from_the_bus_is_reported_and_the_other_cards_still_watched(clock: FakeClock) -> None:
    lost = {"nvmlEventSetWait": GPU_IS_LOST, "nvmlDeviceGetUUID": GPU_IS_LOST}
    fake = FakeNvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", errors=lost)])
    watcher = _watching(clock, fake)
    assert watcher.status().state == "collected"
    assert watcher.poll(0) is None  # GPU_IS_LOST: the lost card is found and left out of a new set
    status = watcher.status()
    assert (status.state, status.lost, status.watched) == ("partial", (1,), (0,))
    assert "GPU 1 lost" in (status.reason or "")
    assert fake.registered == {0}
    assert watcher.retry_delay_sec() > 0  # the failed wait is backed off once
    fake.emit_xid(0, 79)
    event = watcher.poll(1000)
    assert event is not None
    assert (event.index, event.xid) == (0, 79)
    assert watcher.retry_delay_sec() == 0


def test_a_persistent_wait_error_is_backed_off_and_its_warnings_stay_bounded(clock: FakeClock) -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    fake.wait_error = UNKNOWN
    watcher = _watching(clock, fake)
    delays = []
    for _ in range(10_000):
        assert watcher.poll(0) is None
        delays.append(watcher.retry_delay_sec())
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0]
    assert delays[-1] == XidWatcher.RETRY_MAX_SEC
    assert len(watcher.warnings) <= XidWatcher.MAX_WARNINGS
    assert len(watcher.warnings) == len(set(watcher.warnings))
    status = watcher.status()
    assert status.state == "not_collected"
    assert status.wait_failures_total == 10_000
    assert "waiting for events fails: unknown error" in (status.reason or "")


def test_where_the_driver_splits_ecc_by_location_dram_is_the_memory_count_and_sram_is_kept_apart(
    clock: FakeClock,
) -> None:
    split = {(1, 2): 1, (0, 2): 40, (1, 7): 3, (0, 7): 9}  # (uncorrected 1 / corrected 0, DRAM 2 / SRAM 7)
    fake = FakeNvml([FakeGpu(ecc_uncorrected=4, ecc_corrected=49, memory_errors=split)])  # totals mix both
    counters = nvml_collector(clock, fake).read_health().gpus[0].counters
    assert (counters.ecc_uncorrected_total, counters.ecc_corrected_total) == (1, 40)
    assert (counters.ecc_sram_uncorrected_total, counters.ecc_sram_corrected_total) == (3, 9)
