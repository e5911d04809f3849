"""``heteroflow agent probe --collector nvidia-smi`` as a real process against driver shapes it must read:
an R535-branch tool (remapped rows only through ``--query-remapped-rows``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import OWN_FIXTURES, agent_env, fake_smi_path


def probe(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "heteroflow", "agent", "probe", "--json", "--collector", "nvidia-smi"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert isinstance(report, dict)
    return report


def r535_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return agent_env(
        fake_smi_path(tmp_path),
        FAKE_NVIDIA_SMI_HELP=str(OWN_FIXTURES / "help-query-gpu.r535.synthetic.txt"),
        FAKE_NVIDIA_SMI_CSV=str(OWN_FIXTURES / "query-gpu.r535.synthetic.csv"),
        FAKE_NVIDIA_SMI_REMAP_HELP=str(OWN_FIXTURES / "help-query-remapped-rows.synthetic.txt"),
        FAKE_NVIDIA_SMI_REMAP_CSV=str(OWN_FIXTURES / "query-remapped-rows.synthetic.csv"),
        **extra,
    )


def test_probe_reports_remaps_of_an_r535_tool(tmp_path: Path) -> None:
    report = probe(r535_env(tmp_path))
    assert report["collector"] == "nvidia-smi"
    gpus = {gpu["index"]: gpu for gpu in report["gpus"]}  # type: ignore[attr-defined]
    assert (gpus[0]["remapped_rows_pending"], gpus[0]["remapped_rows_failure"]) == (0, 0)
    assert (gpus[1]["remapped_rows_pending"], gpus[1]["remapped_rows_uncorrectable"]) == (1, 2)
    assert gpus[2]["remapped_rows_failure"] == 1
    assert gpus[3]["remapped_rows_pending"] is None


def test_probe_reports_a_card_lost_without_an_xid_number(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,1,1000,-;Linux version 6.8.0\n"
        "3,812,1843308145,-;NVRM: The NVIDIA GPU 0000:0f:00.0\\x0aNVRM: (PCI ID: 10de:20b2) installed in this "
        "system has\\x0aNVRM: fallen off the bus and is not responding to commands.\n"
        "3,813,1843308200,-;NVRM: The NVIDIA GPU 0000:0f:00.0 (PCI ID: 10de:20b2) installed in this system has\n"
        "3,814,1843308201,-;NVRM: fallen off the bus and is not responding to commands.\n"
    )
    report = probe(r535_env(tmp_path, HETEROFLOW_AGENT_KERNEL_LOG=str(kmsg)))
    xid = report["xid_events"]
    assert xid["lost"] == [1]  # type: ignore[index]
    assert xid["state"] == "partial"  # type: ignore[index]
    assert "kernel_log" in xid["sources"]  # type: ignore[index]
    assert any("GPU 1 lost (fallen off the bus, kernel log)" in w for w in report["warnings"])  # type: ignore[attr-defined]
