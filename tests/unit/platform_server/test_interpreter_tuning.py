"""The server process's interpreter once start-up is over: the thread switch interval its settings name."""

from __future__ import annotations

import sys

import pytest

from heteroflow.cli.server import tune_interpreter
from heteroflow.platform_server.settings import ServerSettings


def test_the_switch_interval_is_the_settings_in_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    before = sys.getswitchinterval()
    try:
        # gc_young_threshold 0 leaves this process's collector as it is
        tune_interpreter(ServerSettings.load(gc_young_threshold=0))
        assert sys.getswitchinterval() == pytest.approx(0.0005)  # the default: a tenth of Python's
        monkeypatch.setenv("HETEROFLOW_SERVER_SWITCH_INTERVAL_MS", "2.5")
        tune_interpreter(ServerSettings.load(gc_young_threshold=0))
        assert sys.getswitchinterval() == pytest.approx(0.0025)
    finally:
        sys.setswitchinterval(before)
