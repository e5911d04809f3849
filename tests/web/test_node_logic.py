"""The pure front-end logic (hourly increases, labels, stats-card state) under Node's built-in test runner."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

JS_TESTS = Path(__file__).parent / "js"


def test_front_end_logic_passes_node_test() -> None:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is required in CI to run the front-end logic tests")
        pytest.skip("node is not installed: the front-end logic tests (node --test) cannot run")
    assert list(JS_TESTS.glob("*.test.mjs")), "no front-end test files found"
    result = subprocess.run([node, "--test", str(JS_TESTS)], capture_output=True, text=True, timeout=100, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
