"""Shared helpers of the agent's unit tests: the fake nvidia-smi, the shared fixtures folder, a clock."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from heteroflow.agent.commands import CommandResult
from heteroflow.agent.testing import FakeCommandRunner
from heteroflow.core.testing import FakeClock

REPO = Path(__file__).resolve().parents[3]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
OWN_FIXTURES = REPO / "tests" / "fixtures" / "agent"


def load_fake_smi() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fake_nvidia_smi", OWN_FIXTURES / "fake_nvidia_smi.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAKE_SMI = load_fake_smi()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"the shared vendor-tool captures are not here ({SHARED_FIXTURES}); CI has them")
    return SHARED_FIXTURES


def smi_runner(
    *, help_text: str, csv_text: str, remap_help: str | None = None, remap_csv: str | None = None
) -> FakeCommandRunner:
    """A FakeCommandRunner whose nvidia-smi is the fake script's logic, run in-process (with the R535 remap
    switch where ``remap_help`` and ``remap_csv`` are given)."""

    def nvidia_smi(argv: object) -> CommandResult:
        code, out, err = FAKE_SMI.answer(
            argv, help_text=help_text, csv_text=csv_text, remap_help=remap_help, remap_csv=remap_csv
        )
        return CommandResult(returncode=code, stdout=out, stderr=err)

    return FakeCommandRunner({"nvidia-smi": nvidia_smi})
