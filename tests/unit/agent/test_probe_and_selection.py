from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from heteroflow.agent.assembly import run_probe
from heteroflow.agent.collectors import select_collector
from heteroflow.agent.commands import CommandResult
from heteroflow.agent.nvml import LIBRARY_NOT_FOUND
from heteroflow.agent.testing import FakeCommandRunner, FakeGpu, FakeNvml
from heteroflow.agent.xid_status import XID_NEEDS_NVML
from heteroflow.cli.main import app
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import HEALTH_KEYS

from .conftest import OWN_FIXTURES, smi_runner

HELP = (OWN_FIXTURES / "help-query-gpu.synthetic.txt").read_text()
CSV = (OWN_FIXTURES / "query-gpu.synthetic.csv").read_text()


def test_nvml_is_preferred_where_it_loads(clock: FakeClock) -> None:
    report = run_probe(
        "auto",
        runner=smi_runner(help_text=HELP, csv_text=CSV),
        clock=clock,
        timeout_sec=5,
        nvml_loader=lambda: FakeNvml([FakeGpu(uuid="GPU-x")]),
    )
    assert report["collector"] == "nvml"
    assert report["gpus"][0]["uuid"] == "GPU-x"
    assert XID_NEEDS_NVML not in report["warnings"]


def test_falls_back_to_nvidia_smi_with_a_warning_when_nvml_is_missing(clock: FakeClock) -> None:
    report = run_probe(
        "auto",
        runner=smi_runner(help_text=HELP, csv_text=CSV),
        clock=clock,
        timeout_sec=5,
        nvml_loader=lambda: FakeNvml(init_error=LIBRARY_NOT_FOUND),
    )
    assert report["collector"] == "nvidia-smi"
    assert any("NVML unavailable" in w for w in report["warnings"])
    assert XID_NEEDS_NVML in report["warnings"]
    gpu = report["gpus"][0]
    assert set(gpu) >= {"index", "uuid", "vendor", "name", *HEALTH_KEYS}
    assert report["gpus"][1]["ecc_corrected_total"] is None  # unknown is null, never 0


def test_cnmon_readings_are_marked_semantics_unconfirmed(clock: FakeClock) -> None:
    text = (OWN_FIXTURES / "cnmon.v1-layout.synthetic.txt").read_text()
    report = run_probe(
        "cnmon", runner=FakeCommandRunner({"cnmon": CommandResult(0, text, "")}), clock=clock, timeout_sec=5
    )
    assert report["collector"] == "cnmon"
    assert report["gpus"][0]["semantics_unconfirmed"] == ["ecc_uncorrected_total"]
    assert report["gpus"][0]["vendor"] == "Cambricon"


def test_nothing_installed_means_no_cards_and_every_reason(clock: FakeClock) -> None:
    selection = select_collector(
        "auto",
        runner=FakeCommandRunner(installed=[]),
        clock=clock,
        timeout_sec=5,
        nvml_loader=lambda: FakeNvml(init_error=LIBRARY_NOT_FOUND),
    )
    assert selection.collector.name == "none"
    assert len(selection.warnings) == 5  # nvml, nvidia-smi, xpu-smi, cnmon, other vendors


def test_an_installed_tool_that_sees_no_card_is_passed_over(clock: FakeClock) -> None:
    text = (OWN_FIXTURES / "cnmon.v1-layout.synthetic.txt").read_text()
    runner = FakeCommandRunner(
        {
            "xpu-smi": CommandResult(0, (OWN_FIXTURES / "xpu-smi.intel.synthetic.txt").read_text(), ""),
            "cnmon": CommandResult(0, text, ""),
        }
    )
    selection = select_collector(
        "auto", runner=runner, clock=clock, timeout_sec=5, nvml_loader=lambda: FakeNvml(init_error=LIBRARY_NOT_FOUND)
    )
    assert selection.collector.name == "cnmon"
    assert any("xpu-smi found no cards" in w for w in selection.warnings)


@pytest.mark.parametrize("collector", ["auto", "nvidia-smi", "nvml", "xpu-smi", "cnmon"])
def test_cli_probe_exits_0_on_this_machine_without_gpus(
    collector: str, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no vendor tool; NVML finds no driver here
    result = CliRunner().invoke(app, ["agent", "probe", "--json", "--collector", collector])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["gpus"] == []
    assert report["warnings"]


def test_cli_probe_rejects_an_unknown_collector() -> None:
    result = CliRunner().invoke(app, ["agent", "probe", "--collector", "rocm-smi"])
    assert result.exit_code != 0


def plain(output: str) -> str:
    """CLI error text without rich's box drawing and line wrapping."""
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", output).split())


def test_cli_run_refuses_a_bad_node_name_and_a_missing_token() -> None:
    bad = CliRunner().invoke(app, ["agent", "run", "--token", "t", "--node-name", "bad name"])
    assert bad.exit_code == 2  # a usage error, before anything starts
    assert "letters, digits" in plain(bad.output)
    missing = CliRunner().invoke(app, ["agent", "run"])
    assert missing.exit_code == 2
    assert "token is required" in plain(missing.output)
