from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from heteroflow.agent.commands import CommandResult
from heteroflow.agent.testing import FakeCommandRunner
from heteroflow.agent.xpu_query import parse_xpu_query
from heteroflow.agent.xpu_smi import XpuSmiCollector, parse_xpu_smi
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import COUNTER_MAX, Counters

from .conftest import OWN_FIXTURES


def test_the_real_p800_table(shared_fixtures: Path) -> None:
    text = next((shared_fixtures / "xpu-smi").glob("*cloudpods*P800*")).read_text()
    table = parse_xpu_smi(text)
    assert table is not None
    # device ids may be absent from the list (here 2..6): the declared index is kept
    assert [(g.index, g.name, g.vendor, g.uuid) for g in table.health] == [
        (0, "P800 OAM", "Kunlunxin", None),
        (1, "P800 OAM", "Kunlunxin", None),
        (7, "P800 OAM", "Kunlunxin", None),
    ]
    assert all(g.counters == Counters(ecc_uncorrected_total=0) for g in table.health)
    assert [(t.temperature_c, t.power_w, t.memory_total_mib) for t in table.telemetry] == [
        (35.0, 87.0, 98304.0),
        (37.0, 84.0, 98304.0),
        (35.0, 85.0, 98304.0),
    ]


def test_synthetic_values_na_and_negative() -> None:
    table = parse_xpu_smi((OWN_FIXTURES / "xpu-smi.gen3.synthetic.txt").read_text())
    assert table is not None
    assert [(g.index, g.counters.ecc_uncorrected_total) for g in table.health] == [(0, 3), (2, None), (5, None)]
    assert table.telemetry[0].utilization_pct == 97.0
    assert table.telemetry[0].memory_used_mib == 81234.0


def test_a_generation_without_the_column_is_unknown() -> None:
    table = parse_xpu_smi((OWN_FIXTURES / "xpu-smi.no-ecc-column.synthetic.txt").read_text())
    assert table is not None
    assert [(g.index, g.name, g.counters) for g in table.health] == [(0, "R200", Counters())]
    assert any("Volatile Uncorr. ECC" in w for w in table.warnings)


def test_intel_xpu_smi_is_not_taken_for_kunlunxin(clock: FakeClock) -> None:
    intel = (OWN_FIXTURES / "xpu-smi.intel.synthetic.txt").read_text()
    assert parse_xpu_smi(intel) is None
    runner = FakeCommandRunner({"xpu-smi": CommandResult(0, intel, "")})
    health = XpuSmiCollector(runner=runner, clock=clock).read_health()
    assert health.gpus == ()
    assert "not Kunlunxin" in health.warnings[0]


def test_one_table_process_per_tick_and_query_mode_only_for_health(clock: FakeClock) -> None:
    text = (OWN_FIXTURES / "xpu-smi.gen3.synthetic.txt").read_text()
    runner = FakeCommandRunner({"xpu-smi": CommandResult(0, text, "")})
    smi = XpuSmiCollector(runner=runner, clock=clock)
    smi.read_telemetry()
    assert runner.calls == [("xpu-smi",)]
    smi.read_health()  # the table, then -q (this fake answers -q with the table: no card, not retried for 30 min)
    smi.read_health()
    assert runner.calls[1:] == [("xpu-smi",), ("xpu-smi", "-q"), ("xpu-smi",)]


@given(st.text(max_size=600))
def test_parsing_arbitrary_text_never_raises(text: str) -> None:
    table = parse_xpu_smi("| XPU-SMI  Driver Version: 1 |\n" + text)
    if table is not None:
        for gpu in table.health:
            value = gpu.counters.ecc_uncorrected_total
            assert value is None or (type(value) is int and 0 <= value <= COUNTER_MAX)


@given(st.lists(st.sampled_from(["0", "N/A", "-1", "12", "x", "", str(2**64), "3 4"]), min_size=1, max_size=5))
def test_table_cells_never_yield_negative_counts(cells: list[str]) -> None:
    base = (OWN_FIXTURES / "xpu-smi.gen3.synthetic.txt").read_text().splitlines()
    lines = base[:8]
    for i, cell in enumerate(cells):
        lines.append(f"|   {i}  P800 OAM           N/A   | 00000000:03:00.0 N/A | {cell:>20} |")
        lines.append("| N/A   61C  N/A    310W / 400W |  81234MiB / 98304MiB |     97%      Default |")
        lines.append("+-------------------------------+----------------------+----------------------+")
    table = parse_xpu_smi("\n".join(lines))
    assert table is not None
    assert len(table.health) == len(cells)
    for gpu in table.health:
        value = gpu.counters.ecc_uncorrected_total
        assert value is None or (type(value) is int and value >= 0)


def _shared(shared_fixtures: Path, pattern: str) -> str:
    return next((shared_fixtures / "xpu-smi").glob(pattern)).read_text()


def test_the_public_xpu_smi_q_capture_gives_uuid_and_aggregate_dram_ecc(shared_fixtures: Path) -> None:
    # the only evidence is one public capture (a copy in a utility module's docstring): layout, not every value
    cards = parse_xpu_query(_shared(shared_fixtures, "*xpu-smi_-q_P800*"))
    assert cards is not None
    assert [(c.bus_id, c.minor, c.uuid, c.dram_corrected, c.dram_uncorrected) for c in cards] == [
        ("00000000:01:00.0", 0, "GPU-420716f2-9928-5108-a5b2-e6b7cf36b37c", 0, 0)
    ]
    assert parse_xpu_query(_shared(shared_fixtures, "*cloudpods*P800*")) is None  # the default table is not -q


def test_query_mode_gives_the_table_cards_a_uuid_and_aggregate_counts(shared_fixtures: Path, clock: FakeClock) -> None:
    table = _shared(shared_fixtures, "*cloudpods*P800*")
    query = _shared(shared_fixtures, "*xpu-smi_-q_P800*")
    # the same card as the table's GPU 1 (bus 05:00.0), with errors in its aggregate counters
    query = query.replace("00000000:01:00.0", "00000000:05:00.0").replace(
        "Minor Number                          : 0", "Minor Number                          : 1"
    )
    lines = query.splitlines()
    aggregate = next(i for i, line in enumerate(lines) if line.strip() == "Aggregate")
    lines[aggregate + 1] = lines[aggregate + 1].replace(": 0", ": 17")
    lines[aggregate + 2] = lines[aggregate + 2].replace(": 0", ": 2")
    answers = {"xpu-smi": lambda argv: CommandResult(0, "\n".join(lines) if "-q" in argv else table, "")}
    runner = FakeCommandRunner(answers)
    health = XpuSmiCollector(runner=runner, clock=clock).read_health()
    by_index = {gpu.index: gpu for gpu in health.gpus}
    assert by_index[1].uuid == "GPU-420716f2-9928-5108-a5b2-e6b7cf36b37c"
    assert (by_index[1].counters.ecc_corrected_total, by_index[1].counters.ecc_uncorrected_total) == (17, 2)
    assert by_index[0].uuid is None  # no -q card for it: the table's volatile value stays
    assert by_index[0].counters == Counters(ecc_uncorrected_total=0)
    assert any("no card for 2 table row(s)" in w for w in health.warnings)


def test_a_failing_query_mode_keeps_the_table_and_is_not_retried_every_tick(
    shared_fixtures: Path, clock: FakeClock
) -> None:
    table = _shared(shared_fixtures, "*cloudpods*P800*")
    answers = {
        "xpu-smi": lambda argv: (
            CommandResult(2, "", "unknown option -q") if "-q" in argv else CommandResult(0, table, "")
        )
    }
    runner = FakeCommandRunner(answers)
    smi = XpuSmiCollector(runner=runner, clock=clock)
    health = smi.read_health()
    assert [g.counters for g in health.gpus] == [Counters(ecc_uncorrected_total=0)] * 3
    assert any("xpu-smi -q gave no card" in w for w in health.warnings)
    smi.read_health()
    assert sum(1 for call in runner.calls if "-q" in call) == 1


@given(st.text(max_size=600))
def test_query_parsing_arbitrary_text_never_raises(text: str) -> None:
    cards = parse_xpu_query("==============XPUSMI LOG==============\nXPU 00000000:01:00.0\n" + text)
    assert cards is not None
    for card in cards:
        assert card.dram_corrected is None or 0 <= card.dram_corrected <= COUNTER_MAX
        assert card.uuid is None or len(card.uuid) <= 128
