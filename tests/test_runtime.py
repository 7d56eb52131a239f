"""A command's start-up without Ray or a server: the garbage collector, off while a run's
command imports what it needs (``cli/main.py``), back on with those imports frozen
(``runtime.collect_from_here``, where the flow's module is imported)."""

import json
import subprocess
import sys

import pytest

# The console script's main() in a process of its own (the collector's state is the whole
# process's), which prints whether the collector was on as the command ended.
COMMAND = (
    "import atexit, gc, sys\n"
    "atexit.register(lambda: print(gc.isenabled(), flush=True))\n"
    "from trainflow.cli.main import main\n"
    "sys.argv = ['trainflow', *sys.argv[1:]]\n"
    "main()\n"
)


@pytest.mark.parametrize(
    ("args", "collecting"),
    [
        (["run", "--set", "train.epochs=ten"], "False"),  # failed its checks, before the start-up
        (["validate", "configs/digits.yaml"], "True"),  # not a run: the collector as Python has it
    ],
)
def test_a_run_command_checks_its_run_with_the_collector_off(tmp_path, args, collecting):
    env = {"TRAINFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "TRAINFLOW_FORKSERVER": "0"}
    out = subprocess.run(
        [sys.executable, "-c", COMMAND, *args], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.stdout.strip().splitlines()[-1] == collecting, out.stdout + out.stderr


def test_the_start_up_turns_the_collector_back_on_with_what_it_imported_frozen():
    check = (
        "import gc, json\n"
        "from trainflow.runtime import collect_from_here\n"
        "gc.disable(); collect_from_here(); first = (gc.isenabled(), gc.get_freeze_count())\n"
        "collect_from_here(); again = gc.get_freeze_count()\n"
        "print(json.dumps([*first, again]))\n"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    enabled, frozen, frozen_again = json.loads(out.stdout)
    assert enabled and frozen > 10_000  # the imports' objects, which no collection walks now
    assert frozen_again == frozen  # on already: nothing more frozen


# A command's runtime in a process of its own (Ray not imported, no session fixture): an
# elastic config whose checks fail.
FAILED_CHECK = (
    "import json\n"
    "from trainflow.config import ConfigError, PipelineConfig\n"
    "from trainflow.runtime import Command, Ended\n"
    "config = PipelineConfig(scaling={'num_workers': [1, 3]})\n"
    "flow = 'trainflow.flows.training'\n"
    "command = Command('training-pipeline', 'digits-test', imports=flow, cluster=config)\n"
    "def check():\n"
    "    raise ConfigError('invalid config: train.epochs: give a whole number')\n"
    "try:\n"
    "    with command:\n"
    "        workers = command.workers\n"
    "        command.check(check)\n"
    "except Ended as e:\n"
    "    stopped = workers is not None and workers.process.poll() is not None\n"
    "    print(json.dumps([e.line, e.code, e.error, workers is not None, stopped]))\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the worker forkserver runs on Linux")
def test_a_failed_check_ends_the_command_in_one_line_and_stops_what_it_started(tmp_path):
    """The runtime starts the worker forkserver of an elastic run for its most workers
    (three), and a check that fails ends the command in the check's line, exit code 2,
    with the forkserver stopped."""
    env = {
        "TRAINFLOW_HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "PREFECT_API_URL": "http://127.0.0.1:9/api",  # a server that does not answer: no run recorded
        "PREFECT_HOME": str(tmp_path / "prefect"),
    }
    command = [sys.executable, "-c", FAILED_CHECK]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert json.loads(out.stdout) == [
        "invalid config: train.epochs: give a whole number",
        2,
        True,
        True,  # a forkserver, for the elastic run's three workers
        True,  # stopped with the command
    ], out.stdout + out.stderr
