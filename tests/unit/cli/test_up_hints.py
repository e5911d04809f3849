"""`heteroflow up`'s hints name this same program in a form that runs as printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from heteroflow.cli.local import command_prefix


def _script(tmp_path: Path) -> Path:
    script = tmp_path / ".venv" / "bin" / "heteroflow"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    return script


def test_a_script_not_on_path_is_named_by_its_path_from_the_working_directory(tmp_path: Path) -> None:
    _script(tmp_path)
    assert command_prefix(".venv/bin/heteroflow", cwd=tmp_path, executable="/py", on_path=None) == (
        ".venv/bin/heteroflow"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert command_prefix(str(tmp_path / ".venv/bin/heteroflow"), cwd=elsewhere, executable="/py", on_path=None) == str(
        tmp_path / ".venv/bin/heteroflow"
    )


def test_a_virtualenv_behind_a_link_keeps_its_name(tmp_path: Path) -> None:
    shared = _script(tmp_path / "shared")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(shared.parents[1])
    assert command_prefix(".venv/bin/heteroflow", cwd=work, executable="/py", on_path=None) == ".venv/bin/heteroflow"


def test_another_heteroflow_on_path_is_not_this_one(tmp_path: Path) -> None:
    _script(tmp_path)
    other = tmp_path / "other-heteroflow"
    other.write_text("#!/bin/sh\n")
    assert command_prefix(".venv/bin/heteroflow", cwd=tmp_path, executable="/py", on_path=str(other)) == (
        ".venv/bin/heteroflow"
    )


def test_the_plain_name_only_when_path_finds_this_program(tmp_path: Path) -> None:
    script = _script(tmp_path)
    assert command_prefix(".venv/bin/heteroflow", cwd=tmp_path, executable="/py", on_path=str(script)) == "heteroflow"
    assert command_prefix("heteroflow", cwd=tmp_path, executable="/py", on_path=str(script)) == "heteroflow"


def test_a_module_run_is_named_with_its_interpreter(tmp_path: Path) -> None:
    main = "/src/heteroflow/__main__.py"
    assert command_prefix(main, cwd=tmp_path, executable="/venv/bin/python", on_path=None) == (
        "/venv/bin/python -m heteroflow"
    )


def test_the_printed_prefix_runs(tmp_path: Path) -> None:
    """What the hint prints for this interpreter run as a module is a command that answers."""
    prefix = command_prefix("/x/heteroflow/__main__.py", cwd=tmp_path, executable=sys.executable, on_path=None)
    done = subprocess.run(
        [*prefix.split(), "status", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "state-file" in done.stdout
