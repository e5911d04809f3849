"""The API-server side and the fake never import torch; the CLI refuses contradictory launches."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from heteroflow.cli.engine_sim import parse_rank_list
from heteroflow.cli.main import app


def test_server_side_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import heteroflow.cli.main, heteroflow.engine_sim.assembly, heteroflow.engine_sim.testing\n"
        "import heteroflow.engine_sim.conformance, heteroflow.engine_sim.process_backend\n"
        "import heteroflow.engine_sim.released_conformance\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_rank_lists() -> None:
    assert parse_rank_list("") == frozenset()
    assert parse_rank_list("0, 2,2") == {0, 2}


BASE = ["engine-sim", "--dp-size", "4", "--master-addr", "127.0.0.1", "--master-port", "29500", "--port", "8001"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dp-rank", "4"], "outside range"),
        (["--dp-rank", "1", "--dead-ranks", "1"], "among the dead ranks"),
        (["--dp-rank", "1", "--dead-ranks", "x"], "not a DP rank"),
        (
            ["--dp-rank", "1", "--num-experts", "8", "--num-redundant-experts", "4", "--slots-per-rank", "1"],
            "cannot hold",
        ),
    ],
)
def test_contradictory_launch_options_exit_with_a_usage_error(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(app, [*BASE, *extra])
    assert result.exit_code == 2
    assert message in result.output


def test_help_renders() -> None:
    result = CliRunner().invoke(app, ["engine-sim", "--help"])
    assert result.exit_code == 0
    assert "--dead-ranks" in result.output
