"""What `trainflow up`'s forkserver imports before its first command: enough that a warm
`trainflow run` of the default job imports no package of its own in its checks or when
it opens the registry (scikit-learn in the checks, before anything starts; MLflow's store
beside Ray Train's start), and no thread, which a forked child would lack."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # imports Ray Train, Ray Tune and PyTorch in a process of its own

REPO = Path(__file__).resolve().parents[2]

# The forkserver's imports, then what a warm command's checks of the bundled digits and
# its registry's first client import beyond them: top-level packages outside the
# standard library.
SCRIPT = """
import importlib, json, sys, threading
from trainflow.stack.forkserver import IMPORTS
for name in IMPORTS:
    importlib.import_module(name)
threads = threading.active_count()
before = {m.split(".")[0] for m in sys.modules}
from trainflow import run_checks
from trainflow.config import load_config
from trainflow.pipelines.registry.store import client
from trainflow.workspace import workspace
run_checks.source(load_config("configs/digits.yaml"))
client(workspace())
new = {m.split(".")[0] for m in sys.modules} - before - set(sys.stdlib_module_names)
print(json.dumps({"threads": threads, "new": sorted(m for m in new if not m.startswith("_"))}))
"""


def test_a_warm_commands_checks_and_registry_import_nothing_the_forkserver_lacks(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        env={**os.environ, "TRAINFLOW_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["threads"] == 1
    assert seen["new"] == []


def test_a_command_hands_itself_to_the_forkserver_before_it_imports_anything_of_a_run():
    """What the console script imports before it asks the forkserver for a child (and, for
    `python -m trainflow.cli`, its package): Python's standard library and trainflow's own
    light modules; not Typer, pydantic, the config, Prefect, Ray or PyTorch."""
    script = (
        "import json, sys\n"
        "import trainflow.cli.__main__, trainflow.stack.forkserver, trainflow.timeline\n"
        "packages = {m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)\n"
        "heavy = ('trainflow.config', 'trainflow.cluster', 'trainflow.cli.root')\n"
        "ours = [m for m in heavy if m in sys.modules]\n"
        "print(json.dumps([sorted(m for m in packages if not m.startswith('_')), ours]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [["trainflow"], []]
