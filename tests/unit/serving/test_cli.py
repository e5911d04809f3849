"""``heteroflow node-manager``: usage errors before anything starts, help text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heteroflow.cli.main import app

BASE = ["node-manager", "--controller", "http://127.0.0.1:1", "--pod-id", "p", "--pod-ip", "127.0.0.1"]


def test_a_spec_is_required() -> None:
    result = CliRunner().invoke(app, BASE)
    assert result.exit_code == 2
    assert "instance spec is required" in result.output


def test_an_invalid_spec_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pod.json").write_text(json.dumps({"instance_id": "i", "dp_size": 2, "endpoints": []}))
    # a relative path: the error box wraps long lines, and a long temporary path split the name across two
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*BASE, "--config", "pod.json"])
    assert result.exit_code == 2
    assert "pod.json" in result.output


def test_help_renders() -> None:
    result = CliRunner().invoke(app, ["node-manager", "--help"])
    assert result.exit_code == 0
    assert "--pod-ip" in result.output
