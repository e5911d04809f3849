"""``heteroflow coordinator``: registered on the command surface, usage errors before anything starts."""

from __future__ import annotations

from typer.testing import CliRunner

from heteroflow.cli.main import app


def test_help_names_the_options_and_their_variables() -> None:
    result = CliRunner().invoke(app, ["coordinator", "--help"], env={"COLUMNS": "240"})
    assert result.exit_code == 0
    for text in ("--host", "--port", "--platform-url", "HETEROFLOW_COORDINATOR_PORT", "HETEROFLOW_CLUSTER_TOKEN"):
        assert text in result.output


def test_a_port_out_of_range_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["coordinator", "--port", "70000"])
    assert result.exit_code == 2
