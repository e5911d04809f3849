from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from heteroflow.agent.cnmon import CnmonCollector, parse_cnmon
from heteroflow.agent.commands import CommandResult
from heteroflow.agent.testing import FakeCommandRunner
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import COUNTER_MAX, Counters

from .conftest import OWN_FIXTURES


def test_the_real_v5_eight_card_table(shared_fixtures: Path) -> None:
    text = next((shared_fixtures / "cnmon").glob("*v5.10.31*")).read_text()
    table = parse_cnmon(text)
    assert table is not None
    assert [g.index for g in table.health] == list(range(8))
    assert all(g.counters == Counters(ecc_uncorrected_total=0) for g in table.health)
    assert all(g.name == "MLUXXX-XX" and g.vendor == "Cambricon" for g in table.health)
    assert all(g.semantics_unconfirmed == ("ecc_uncorrected_total",) for g in table.health)
    assert table.telemetry[0].temperature_c == 35.0
    assert table.telemetry[0].power_w == 105.0
    assert table.telemetry[0].memory_used_mib == 0.0
    assert table.telemetry[0].memory_total_mib is None  # masked "xxxxx" by the authors: unknown


def test_the_real_two_card_table_inside_documentation_reads_na_as_unknown(shared_fixtures: Path) -> None:
    text = next((shared_fixtures / "cnmon").glob("*v5.10.10*")).read_text()
    table = parse_cnmon(text)
    assert table is not None
    # the processes table that follows is not read as cards
    assert [(g.index, g.name, g.counters) for g in table.health] == [
        (0, "MLU370-X4", Counters()),
        (1, "MLU370-X4", Counters()),
    ]
    assert table.telemetry[1].memory_total_mib == 23308.0


def test_the_old_header_layout() -> None:
    table = parse_cnmon((OWN_FIXTURES / "cnmon.v1-layout.synthetic.txt").read_text())
    assert table is not None
    assert [(g.index, g.name, g.counters.ecc_uncorrected_total) for g in table.health] == [
        (0, "MLU270-S4", 2),
        (1, "MLU270-S4", None),
    ]
    assert table.telemetry[0].utilization_pct == 12.0


def test_the_column_is_found_by_header_wherever_it_sits() -> None:
    table = parse_cnmon((OWN_FIXTURES / "cnmon.ecc-second-line.synthetic.txt").read_text())
    assert table is not None
    assert [(g.index, g.counters.ecc_uncorrected_total) for g in table.health] == [(3, 7)]


def test_a_missing_ecc_column_is_unknown(clock: FakeClock) -> None:
    text = (OWN_FIXTURES / "cnmon.no-ecc-column.synthetic.txt").read_text()
    runner = FakeCommandRunner({"cnmon": CommandResult(0, text, "")})
    health = CnmonCollector(runner=runner, clock=clock).read_health()
    assert [(g.index, g.counters) for g in health.gpus] == [(0, Counters())]
    assert any("Ecc-Error" in w for w in health.warnings)


def test_no_banner_no_cards(clock: FakeClock) -> None:
    runner = FakeCommandRunner({"cnmon": CommandResult(1, "cnmon: command failed\n", "")})
    health = CnmonCollector(runner=runner, clock=clock).read_health()
    assert health.gpus == ()
    assert health.warnings


@given(st.text(max_size=600))
def test_parsing_arbitrary_text_never_raises(text: str) -> None:
    table = parse_cnmon("| CNMON v5.10.31 |\n" + text)
    if table is not None:
        for gpu in table.health:
            value = gpu.counters.ecc_uncorrected_total
            assert value is None or (type(value) is int and 0 <= value <= COUNTER_MAX)


@given(st.lists(st.sampled_from(["0", "N/A", "-1", "12", "x", "", str(2**64), "1 2"]), min_size=1, max_size=5))
def test_table_cells_never_yield_negative_counts(cells: list[str]) -> None:
    head = (OWN_FIXTURES / "cnmon.no-ecc-column.synthetic.txt").read_text().splitlines()[:7]
    head[3] = "| Card  VF  Name       Firmware |               Bus-Id | Util        Ecc-Error |"
    lines = list(head)
    for i, cell in enumerate(cells):
        lines.append(f"| {i}     /   MLU370-X4    v1.1.6 |         0000:1B:00.0 | 0%  {cell:>17} |")
        lines.append("|  0%   41C         27 W/ 150 W |     0 MiB/ 23308 MiB | N/A         Exclusive |")
        lines.append("+-------------------------------+----------------------+-----------------------+")
    table = parse_cnmon("\n".join(lines))
    assert table is not None
    assert len(table.health) == len(cells)
    for gpu in table.health:
        value = gpu.counters.ecc_uncorrected_total
        assert value is None or (type(value) is int and value >= 0)
