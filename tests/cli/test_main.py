"""The `trainflow` console script: its exit, once every exit hook ran, and the folder it
imports a config's own code from."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import REPO, trainflow


@pytest.mark.parametrize(
    "args, code, printed",
    [
        (["validate", "configs/digits.yaml"], 0, "ok: digits (config hash"),
        (["run", "--set", "train.epochs=ten"], 2, ""),
    ],
)
def test_a_command_ends_with_its_exit_code_once_every_exit_hook_ran(tmp_path, args, code, printed):
    import re

    # The command ends its process without the interpreter's teardown, after the exit
    # hooks (cli._exit_without_teardown): the timeline's mark, the first hook registered,
    # runs last, and what the command printed before is all there.
    out = trainflow(*args, home=tmp_path / "home", env={"TRAINFLOW_TIMELINE": "1"})
    assert out.returncode == code, out.stderr
    assert re.fullmatch(r"timeline [\d.]+ exit", out.stderr.strip().splitlines()[-1]), out.stderr
    assert printed in out.stdout


def test_the_command_imports_a_configs_own_code_from_the_current_folder(tmp_path):
    """As its README runs it: the console script, from the folder that holds the model's module."""
    import shutil

    folder = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "custom_model", folder)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRAINFLOW_HOME"] = str(tmp_path / "home")
    script = Path(sys.executable).with_name("trainflow")
    out = subprocess.run(
        [script, "validate", "digits-resmlp.yaml"], cwd=folder, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok: digits-resmlp ")
