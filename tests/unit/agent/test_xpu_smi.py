from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from heteroflow.agent.commands import CommandResult
from heteroflow.agent.testing import FakeCommandRunner
from heteroflow.agent.xpu_smi import XpuSmiCollector, parse_xpu_smi
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import COUNTER_MAX, Counters

from .conftest import OWN_FIXTURES


def test_the_real_p800_table(shared_fixtures: Path) -> None:
    text = next((shared_fixtures / "xpu-smi").glob("*P800*")).read_text()
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


def test_one_process_per_tick(clock: FakeClock) -> None:
    text = (OWN_FIXTURES / "xpu-smi.gen3.synthetic.txt").read_text()
    runner = FakeCommandRunner({"xpu-smi": CommandResult(0, text, "")})
    XpuSmiCollector(runner=runner, clock=clock).read_health()
    assert runner.calls == [("xpu-smi",)]


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
