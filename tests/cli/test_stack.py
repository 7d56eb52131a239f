"""`trainflow stack`'s refusals, in this process; tests/e2e/test_team_stack.py brings a team's
stack up and down."""

import pytest
from typer.testing import CliRunner

from trainflow.cli import app


@pytest.mark.parametrize("command", ["status", "env", "down"])
def test_a_stack_command_where_no_stack_was_brought_up_says_so_in_one_line(tmp_path, command):
    result = CliRunner().invoke(app, ["stack", command, "--folder", str(tmp_path / "none")])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        f"error: no stack in {tmp_path / 'none'}"
        + ("" if command == "down" else ": start one with trainflow stack up")
    ]
