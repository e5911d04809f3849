"""The command surface imports a command's module only when that command runs: a serving process starts light."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from heteroflow.cli.main import COMMANDS, app

HEAVY = ("sqlalchemy", "alembic", "fastapi", "torch")
"""Libraries the controller's process never uses: the platform server's and the admin commands' stack, torch."""


def test_the_controller_command_loads_none_of_the_platform_stack() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from heteroflow.cli.main import app\n"
        "result = CliRunner().invoke(app, ['controller', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        f"print(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True)
    assert loaded.stdout.strip() == ""


def test_help_lists_every_command_and_each_one_loads() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output
        assert CliRunner().invoke(app, [name, "--help"]).exit_code == 0, name
