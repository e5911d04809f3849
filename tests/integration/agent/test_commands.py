"""The subprocess runner against real child processes: answers, a missing tool, a hung tool."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from heteroflow.agent.commands import SubprocessRunner, ToolMissingError, ToolTimeoutError

from .conftest import OWN_FIXTURES, fake_smi_path


def env_with(bin_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVIDIA")}
    env["PATH"] = f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"
    env.update(extra)
    return env


def test_a_real_child_process_answers(tmp_path: Path) -> None:
    runner = SubprocessRunner(
        env_with(
            fake_smi_path(tmp_path),
            FAKE_NVIDIA_SMI_HELP=str(OWN_FIXTURES / "help-query-gpu.synthetic.txt"),
            FAKE_NVIDIA_SMI_CSV=str(OWN_FIXTURES / "query-gpu.synthetic.csv"),
        )
    )
    result = runner.run(
        ["nvidia-smi", "--query-gpu=index,bogus.field", "--format=csv,noheader,nounits"], timeout_sec=30
    )
    assert result.returncode != 0
    assert 'Field "bogus.field" is not a valid field to query.' in result.stdout


def test_a_missing_tool(tmp_path: Path) -> None:
    runner = SubprocessRunner(env_with(tmp_path))
    assert runner.which("cnmon") is None
    with pytest.raises(ToolMissingError):
        runner.run(["cnmon"], timeout_sec=5)


def test_a_hung_tool_is_killed_at_the_time_limit(tmp_path: Path) -> None:
    runner = SubprocessRunner(env_with(fake_smi_path(tmp_path), FAKE_NVIDIA_SMI_HANG="1"))
    started = time.monotonic()
    with pytest.raises(ToolTimeoutError):
        runner.run(["nvidia-smi", "--help-query-gpu"], timeout_sec=1.0)
    assert time.monotonic() - started < 10
