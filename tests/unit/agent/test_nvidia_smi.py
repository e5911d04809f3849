from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.agent.commands import CommandResult
from heteroflow.agent.nvidia_smi import (
    HEALTH_FIELDS,
    NvidiaSmiCollector,
    choose_fields,
    health_from_rows,
    parse_help_fields,
    parse_query_rows,
)
from heteroflow.agent.testing import FakeCommandRunner
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import COUNTER_MAX, Counters

from .conftest import FAKE_SMI, OWN_FIXTURES, smi_runner

HELP = (OWN_FIXTURES / "help-query-gpu.synthetic.txt").read_text()
CSV = (OWN_FIXTURES / "query-gpu.synthetic.csv").read_text()


def collector(clock: FakeClock, runner: FakeCommandRunner) -> NvidiaSmiCollector:
    return NvidiaSmiCollector(runner=runner, clock=clock, timeout_sec=5.0)


def test_help_text_fields_and_aliases_are_found() -> None:
    fields = parse_help_fields(HELP)
    assert {"index", "name", "gpu_name", "retired_pages.double_bit.count", "retired_pages.dbe"} <= fields
    assert "retired_pages.double_bit_ecc" not in fields
    # descriptions that quote words are not field lines
    assert "--query-gpu" not in fields


def test_synthetic_rows_cover_sentinels_flags_lost_gpu_negative_and_huge(clock: FakeClock) -> None:
    health = collector(clock, smi_runner(help_text=HELP, csv_text=CSV)).read_health()
    by_index = {gpu.index: gpu for gpu in health.gpus}
    assert sorted(by_index) == [0, 1, 3, 4]  # the lost GPU's rows are left out, the others kept
    # an A10 with 4 uncorrectable remaps and a remap pending: the counts are counters now (no SRAM split here)
    assert by_index[0].counters == Counters(0, 12, 0, 1, 0, 0, 4)
    assert by_index[0].uuid == "GPU-aaaaaaaa-0000-0000-0000-000000000000"
    assert dict(by_index[0].extras) == {"retired_pages_pending": 0}
    assert by_index[1].counters == Counters()  # every sentinel is unknown, never 0
    assert by_index[3].counters == Counters(None, 55_000_000_000, 5, 0, 1, 1, 0)  # negative → unknown
    assert by_index[4].counters == Counters(None, None, None, 1, 0, 0, 0)  # > 2**63-1, blank, fractional
    assert any("lost GPU" in w or "unreadable line" in w for w in health.warnings)
    assert health.collected_at == clock.now()


def test_the_query_asks_only_for_listed_fields_in_csv_noheader_nounits(clock: FakeClock) -> None:
    runner = smi_runner(help_text=HELP, csv_text=CSV)
    collector(clock, runner).read_health()
    query = runner.calls[-1]
    assert query[-1] == "--format=csv,noheader,nounits"
    assert query[1].startswith("--query-gpu=index,")


def test_a_field_missing_from_the_help_text_is_never_queried_and_stays_unknown(clock: FakeClock) -> None:
    old_driver_help = "\n".join(line for line in HELP.splitlines() if "remapped_rows" not in line)
    runner = smi_runner(help_text=old_driver_help, csv_text=CSV)
    health = collector(clock, runner).read_health()
    assert "remapped_rows" not in runner.calls[-1][1]
    gpu0 = next(gpu for gpu in health.gpus if gpu.index == 0)
    assert gpu0.counters == Counters(0, 12, 0, None, None)
    assert any("remapped_rows.pending" in w for w in health.warnings)


def test_an_invalid_field_degrades_the_tick_to_unknown_but_not_telemetry(clock: FakeClock) -> None:
    def rejecting(argv: object) -> CommandResult:
        args = list(argv)  # type: ignore[call-overload]
        if args[1] == "--help-query-gpu":
            return CommandResult(0, HELP, "")
        if "ecc.errors" in args[1]:  # the driver lists a field its query then rejects
            return CommandResult(
                2, 'Field "ecc.errors.uncorrected.aggregate.total" is not a valid field to query.\n', ""
            )
        code, out, err = FAKE_SMI.answer(args, help_text=HELP, csv_text=CSV)
        return CommandResult(code, out, err)

    smi = collector(clock, FakeCommandRunner({"nvidia-smi": rejecting}))
    health = smi.read_health()
    assert health.gpus == ()
    assert any("rejected the field" in w for w in health.warnings)
    telemetry = smi.read_telemetry()
    assert [gpu.temperature_c for gpu in telemetry.gpus] == [41.0, 44.0, 39.0, 39.0]
    assert telemetry.gpus[0].utilization_pct == 3.0
    assert telemetry.gpus[0].power_w == 60.1


def test_the_help_probe_is_cached_for_30_minutes(clock: FakeClock) -> None:
    runner = smi_runner(help_text=HELP, csv_text=CSV)
    smi = collector(clock, runner)
    smi.read_health()
    smi.read_telemetry()
    clock.advance(29 * 60)
    smi.read_health()
    assert smi.probe_runs == 1
    before = len(runner.calls)
    smi.read_health()
    assert len(runner.calls) == before + 1  # a warm tick starts exactly one process
    clock.advance(61)
    smi.read_health()
    assert smi.probe_runs == 2


def test_a_missing_tool_is_a_warning_with_no_cards(clock: FakeClock) -> None:
    smi = collector(clock, FakeCommandRunner(installed=[]))
    assert smi.available()[0] is False
    health = smi.read_health()
    assert health.gpus == ()
    assert "not installed" in health.warnings[0]


def test_a_hung_tool_gives_an_unknown_tick(clock: FakeClock) -> None:
    runner = smi_runner(help_text=HELP, csv_text=CSV)
    runner.hang.add("nvidia-smi")
    health = collector(clock, runner).read_health()
    assert health.gpus == ()
    assert "did not answer" in health.warnings[0]


CAPTURES = {
    # ECC from the .dram fields these drivers list; remapped-row counts 0 (unknown under MIG); SRAM counts apart
    "h100": ("nvidia-h100-80gb-hbm3__590.48.01", "NVIDIA H100 80GB HBM3", Counters(0, 0, None, 0, 0, 0, 0, 0, 0)),
    "h100-mig": (
        "nvidia-h100-mig__590.48.01",
        "NVIDIA H100 80GB HBM3",
        Counters(0, 0, None, None, None, None, None, 0, 0),
    ),
    "h200": ("nvidia-h200__590.48.01", "NVIDIA H200", Counters(0, 0, None, 0, 0, 0, 0, 0, 0)),
    "l40s": ("nvidia-l40s__595.80", "NVIDIA L40S", Counters(0, 0, None, 0, 0, 0, 0, 0, 0)),
    "rtx4080s": ("nvidia-geforce-rtx-4080-super__595.71.05", "NVIDIA GeForce RTX 4080 SUPER", Counters()),
}


@pytest.mark.parametrize("phase", ["idle", "load"])
@pytest.mark.parametrize("card", sorted(CAPTURES))
def test_real_captures_give_the_expected_readings(
    shared_fixtures: Path, clock: FakeClock, card: str, phase: str
) -> None:
    stem, name, expected = CAPTURES[card]
    capture = (shared_fixtures / "nvidia-smi" / f"nvidia_gpu_exporter__capture__linux-x86_64__{stem}.txt").read_text()
    runner = smi_runner(help_text=FAKE_SMI.help_section(capture), csv_text=FAKE_SMI.csv_section(capture, phase))
    smi = collector(clock, runner)
    health = smi.read_health()
    assert [(g.index, g.name, g.uuid, g.vendor) for g in health.gpus] == [
        (0, name, "GPU-00000000-0000-0000-0000-000000000000", "NVIDIA")
    ]
    # retired_pages: [N/A] on row-remap GPUs (H100/H200/L40S), so the sum is unknown, never 0.
    assert health.gpus[0].counters == expected
    telemetry = smi.read_telemetry()
    assert telemetry.gpus[0].temperature_c is not None
    assert telemetry.gpus[0].memory_total_mib is not None
    assert telemetry.gpus[0].memory_total_mib > 10_000
    assert smi.probe_runs == 1  # one probe, then one query per tick


_cell = st.one_of(
    st.sampled_from(["[N/A]", "Yes", "No", "ERR!", "", "-3", "1.5", str(2**64), "[Unknown Error]"]),
    st.integers(min_value=-(2**65), max_value=2**65).map(str),
    st.text(alphabet=st.characters(blacklist_characters='\n\r,"'), max_size=12),
)


@given(st.lists(st.lists(_cell, min_size=1, max_size=12), max_size=6))
def test_query_parsing_never_raises_nor_returns_negative_counts(rows: list[list[str]]) -> None:
    fields = ["index", *[names[0] for names in HEALTH_FIELDS]]
    chosen = choose_fields(frozenset(fields), [("index",), *HEALTH_FIELDS])
    text = "\n".join(", ".join(row) for row in rows)
    parsed, _ = parse_query_rows(text, fields)
    gpus, _ = health_from_rows(parsed, chosen)
    for gpu in gpus:
        for value in gpu.counters.as_dict().values():
            assert value is None or (type(value) is int and 0 <= value <= COUNTER_MAX)


@given(st.text(max_size=400))
def test_help_parsing_never_raises(text: str) -> None:
    assert isinstance(parse_help_fields(text), frozenset)


def test_every_shared_capture_has_expected_readings(shared_fixtures: Path) -> None:
    captures = {p.name for p in (shared_fixtures / "nvidia-smi").glob("nvidia_gpu_exporter__capture__*.txt")}
    covered = {f"nvidia_gpu_exporter__capture__linux-x86_64__{stem}.txt" for stem, _, _ in CAPTURES.values()}
    assert captures == covered  # a new capture must get its expected readings here


@pytest.mark.parametrize("help_answer", [(0, ""), (1, "Failed to initialize NVML: Unknown Error\n"), (0, "garbage\n")])
def test_a_failed_field_probe_makes_health_unknown_but_keeps_every_gpus_telemetry(
    shared_fixtures: Path, clock: FakeClock, help_answer: tuple[int, str]
) -> None:
    capture = (
        shared_fixtures
        / "nvidia-smi"
        / "nvidia_gpu_exporter__capture__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
    ).read_text()
    real_help, csv_text = FAKE_SMI.help_section(capture), FAKE_SMI.csv_section(capture, "idle")

    def probe_fails(argv: object) -> CommandResult:
        args = list(argv)  # type: ignore[call-overload]
        if args[1] == "--help-query-gpu":
            return CommandResult(help_answer[0], help_answer[1], "")
        code, out, err = FAKE_SMI.answer(args, help_text=real_help, csv_text=csv_text)  # the real query logic
        return CommandResult(code, out, err)

    runner = FakeCommandRunner({"nvidia-smi": probe_fails})
    smi = collector(clock, runner)
    telemetry = smi.read_telemetry()
    assert telemetry.gpus, telemetry.warnings
    assert all(gpu.temperature_c is not None and gpu.memory_total_mib is not None for gpu in telemetry.gpus)
    assert all(gpu.uuid for gpu in telemetry.gpus)
    assert any("health values unknown" in w for w in telemetry.warnings)
    health = smi.read_health()
    assert [gpu.index for gpu in health.gpus] == [gpu.index for gpu in telemetry.gpus]
    assert all(gpu.counters.all_unknown for gpu in health.gpus)  # unknown, never 0
    assert smi.probe_runs == 1  # a failed probe is retried after a minute, not on every tick
    clock.advance(61)
    smi.read_telemetry()
    assert smi.probe_runs == 2


# --- R535: remapped rows through their own switch -------------------------------------------------------------

R535_HELP = (OWN_FIXTURES / "help-query-gpu.r535.synthetic.txt").read_text()
R535_CSV = (OWN_FIXTURES / "query-gpu.r535.synthetic.csv").read_text()
REMAP_HELP = (OWN_FIXTURES / "help-query-remapped-rows.synthetic.txt").read_text()
REMAP_CSV = (OWN_FIXTURES / "query-remapped-rows.synthetic.csv").read_text()


def r535_runner() -> FakeCommandRunner:
    return smi_runner(help_text=R535_HELP, csv_text=R535_CSV, remap_help=REMAP_HELP, remap_csv=REMAP_CSV)


def test_r535_reads_remapped_rows_through_their_switch_joined_by_uuid_or_bus_id(clock: FakeClock) -> None:
    runner = r535_runner()
    health = collector(clock, runner).read_health()
    by_index = {gpu.index: gpu.counters for gpu in health.gpus}
    assert (by_index[0].remapped_rows_pending, by_index[0].remapped_rows_failure) == (0, 0)
    assert by_index[1].remapped_rows_pending == 1
    assert (by_index[1].remapped_rows_correctable, by_index[1].remapped_rows_uncorrectable) == (1, 2)
    assert by_index[1].ecc_uncorrected_total == 2  # the main query's values are untouched
    # GPU 2's uuid is unreadable in the main query: joined by its PCI address instead
    assert (by_index[2].remapped_rows_failure, by_index[2].remapped_rows_uncorrectable) == (1, 5)
    # MIG-style [N/A] stays unknown, never 0
    assert by_index[3].remapped_rows_pending is None
    assert by_index[3].remapped_rows_correctable is None
    remap_calls = [c for c in runner.calls if c[1].startswith("--query-remapped-rows=")]
    assert len(remap_calls) == 1
    assert remap_calls[0][1] == (
        "--query-remapped-rows=gpu_uuid,gpu_bus_id,remapped_rows.pending,remapped_rows.failure,"
        "remapped_rows.correctable,remapped_rows.uncorrectable"
    )
    assert not any("does not list remapped_rows" in w for w in health.warnings)


def test_the_remap_help_is_probed_once_per_cache_period_and_one_call_per_tick(clock: FakeClock) -> None:
    runner = r535_runner()
    smi = collector(clock, runner)
    for _ in range(5):
        smi.read_health()
        clock.advance(60)
    assert smi.remap_probe_runs == 1
    assert sum(1 for c in runner.calls if c[1].startswith("--query-remapped-rows=")) == 5
    clock.advance(1800)
    smi.read_health()
    assert smi.remap_probe_runs == 2


def test_a_driver_without_the_switch_leaves_remaps_unknown_and_does_not_retry_every_tick(clock: FakeClock) -> None:
    runner = smi_runner(help_text=R535_HELP, csv_text=R535_CSV)  # no remap switch (a pre-Ampere driver)
    smi = collector(clock, runner)
    for _ in range(3):
        health = smi.read_health()
        clock.advance(30)
    assert smi.remap_probe_runs == 1
    assert all(gpu.counters.remapped_rows_pending is None for gpu in health.gpus)
    assert not any(c[1].startswith("--query-remapped-rows=") for c in runner.calls)


def test_the_main_help_listing_remaps_needs_no_extra_call(clock: FakeClock) -> None:
    runner = smi_runner(help_text=HELP, csv_text=CSV, remap_help=REMAP_HELP, remap_csv=REMAP_CSV)
    smi = collector(clock, runner)
    smi.read_health()
    assert smi.remap_probe_runs == 0
    assert not any(c[1].startswith(("--query-remapped-rows", "--help-query-remapped")) for c in runner.calls)


def test_a_hung_or_failing_remap_switch_keeps_the_other_values(clock: FakeClock) -> None:
    def answer(argv: object) -> CommandResult:
        args = list(argv)  # type: ignore[call-overload]
        if args[1].startswith("--query-remapped-rows="):
            return CommandResult(6, "", "Unable to query remapped rows\n")
        code, out, err = FAKE_SMI.answer(
            args, help_text=R535_HELP, csv_text=R535_CSV, remap_help=REMAP_HELP, remap_csv=REMAP_CSV
        )
        return CommandResult(code, out, err)

    health = collector(clock, FakeCommandRunner({"nvidia-smi": answer})).read_health()
    assert {gpu.index: gpu.counters.ecc_corrected_total for gpu in health.gpus} == {0: 3, 1: 120, 2: 0, 3: 0}
    assert all(gpu.counters.remapped_rows_pending is None for gpu in health.gpus)
    assert any("--query-remapped-rows exited 6" in w for w in health.warnings)


def test_join_gives_no_value_to_the_wrong_card() -> None:
    from heteroflow.agent.nvidia_smi import REMAP_BUS_ID, REMAP_UUID, join_remap_rows

    chosen = {("index",): "index", ("uuid", "gpu_uuid"): "uuid"}
    remap_chosen = {REMAP_UUID: "gpu_uuid", HEALTH_FIELDS[4]: "remapped_rows.pending", REMAP_BUS_ID: "gpu_bus_id"}
    rows = [{"index": "0", "uuid": "GPU-a"}, {"index": "1", "uuid": "GPU-b"}]
    remaps = [
        {"gpu_uuid": "GPU-a", "gpu_bus_id": "0000:01:00.0", "remapped_rows.pending": "Yes"},
        {"gpu_uuid": "GPU-a", "gpu_bus_id": "0000:02:00.0", "remapped_rows.pending": "No"},  # duplicate uuid
        {"gpu_uuid": "GPU-z", "gpu_bus_id": "0000:03:00.0", "remapped_rows.pending": "Yes"},  # no such GPU
    ]
    merged, merged_chosen, unmatched = join_remap_rows(rows, chosen, remaps, remap_chosen)
    gpus, _ = health_from_rows(merged, merged_chosen)
    assert [gpu.counters.remapped_rows_pending for gpu in gpus] == [None, None]
    assert unmatched == 2
