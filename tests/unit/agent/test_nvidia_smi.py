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
