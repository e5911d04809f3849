"""The API-server side and the fake never import torch; the CLI refuses contradictory launches."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from heteroflow.cli.main import app
from heteroflow.contracts.engine_protocol import PROFILE_ALIASES, PROFILE_NAMES


def test_server_side_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import heteroflow.cli.main, heteroflow.engine_sim.assembly, heteroflow.engine_sim.testing\n"
        "import heteroflow.engine_sim.conformance, heteroflow.engine_sim.process_backend\n"
        "import heteroflow.engine_sim.released_conformance\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


BASE = ["engine-sim", "--dp-size", "4", "--master-addr", "127.0.0.1", "--master-port", "29500", "--port", "8001"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dp-rank", "4"], "data_parallel_rank (4) must be in the range [0, 4)"),
        # vLLM 0.34's own start-up refusals of the expert layout (E + K over N EP ranks, K ≥ 0)
        (
            ["--dp-rank", "1", "--num-experts", "8", "--num-redundant-experts", "3"],
            "EPLB currently only supports even distribution of experts across ranks. Got 11 experts and 4 EP ranks.",
        ),
        (
            ["--dp-rank", "1", "--num-experts", "8", "--num-redundant-experts", "-4"],
            "Input should be greater than or equal to 0",
        ),
        # the simulator's own option says the same layout or nothing
        (
            ["--dp-rank", "1", "--num-experts", "8", "--num-redundant-experts", "4", "--slots-per-rank", "1"],
            "are 3 physical experts per rank",
        ),
    ],
)
def test_contradictory_launch_options_exit_with_a_usage_error(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(app, [*BASE, *extra])
    assert result.exit_code == 2
    assert message in " ".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize("ft_profile", [*PROFILE_NAMES, *PROFILE_ALIASES])
def test_a_launch_with_dead_ranks_is_refused_like_an_unknown_vllm_flag(ft_profile: str) -> None:
    """A release has no "ranks already dead" at launch; the simulator refuses the option under every profile."""
    result = CliRunner().invoke(app, [*BASE, "--dp-rank", "1", "--ft-profile", ft_profile, "--dead-ranks", "0"])
    assert result.exit_code == 2
    assert "No such option: --dead-ranks" in result.output


def test_the_relaunch_of_survivors_as_a_smaller_world_is_a_valid_launch() -> None:
    """What the NodeManager starts after rank 0 of 4 is lost (8 experts + 4 redundant, 3 slots per rank):
    dp_size 3, dp_rank 0..2, 3 x 3 - 8 = 1 redundant expert, the same slots per rank."""
    from heteroflow.engine_sim.settings import Topology

    for rank in range(3):
        Topology(
            dp_size=3, dp_rank=rank, master_addr="127.0.0.1", master_port=29500, num_redundant_experts=1,
            slots_per_rank=3,
        ).validate()  # fmt: skip


def test_help_renders() -> None:
    result = CliRunner().invoke(app, ["engine-sim", "--help"])
    assert result.exit_code == 0
    assert "--dp-size" in result.output
    assert "--dead-ranks" not in result.output
