"""`trainflow up` and `down` as a user runs them: the workspace's Ray cluster, Prefect
server and forkservers start in the background, a `trainflow run` of the same
TRAINFLOW_HOME uses them instead of starting its own (in a child of the forkserver, which
Ctrl-C stops as it stops a run of its own; its Ray workers children of the worker
forkserver), `down` stops every process they started, and, unused for their idle time,
they stop by themselves."""

import json
import os
import signal
import time

import pytest

from tests.commands import trainflow
from tests.e2e.test_front_door import PREFECT_LINE, _signal_at_epoch_2
from trainflow.stack.services import alive, answers, members, stop_members

pytestmark = pytest.mark.slow


@pytest.fixture
def home(tmp_path):
    """A workspace whose services stop after the test, whatever it asserted."""
    home = tmp_path / "home"
    yield home
    stop_members(home / "warm")


def _state(home) -> dict:
    return json.loads((home / "warm" / "warm.json").read_text())


def test_a_run_uses_the_services_of_trainflow_up_and_down_stops_them(home):
    up = trainflow("up", home=home)
    assert up.returncode == 0, up.stderr
    state = _state(home)
    api = f"http://127.0.0.1:{state['ports']['prefect']}/api"
    assert answers(f"{api}/health")
    assert (home / "warm" / "auth_token").stat().st_mode & 0o077 == 0  # Ray's token: its owner's alone

    again = trainflow("up", home=home)  # already up: the same services
    assert again.returncode == 0, again.stderr
    assert _state(home)["pids"] == state["pids"]

    run = trainflow("run", "configs/digits.yaml", "--smoke", home=home)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "using the services of trainflow up" in run.stderr
    assert f"connecting to the Ray cluster at 127.0.0.1:{state['ports']['ray']}" in run.stderr
    assert "Starting temporary server" not in run.stderr
    assert f"View at http://127.0.0.1:{state['ports']['prefect']}/" in run.stderr
    assert "as this driver does" not in run.stderr  # its own trainflow: nothing shipped, nothing to compare
    levels = [(line, PREFECT_LINE.match(line)) for line in run.stderr.splitlines() if line.strip()]
    others = [line for line, prefect in levels if not (prefect and prefect.group(1) == "INFO")]
    assert others == [], run.stderr[-3000:]
    assert "digits-smoke version 1 -> champion" in run.stdout
    forked = (home / "warm" / "logs" / "forkserver.log").read_text()
    assert "trainflow run configs/digits.yaml --smoke" in forked and "exit code 0" in forked, forked
    assert (home / "warm" / "forkserver.sock").stat().st_mode & 0o077 == 0
    # Its Ray workers (the Train worker and controller among them) were forks of the worker forkserver.
    forks = (home / "warm" / "logs" / "workers.log").read_text()
    assert forks.count(": default_worker.py") >= 2 and "refused" not in forks, forks
    assert (home / "warm" / "workers.sock").stat().st_mode & 0o077 == 0

    # Ctrl-C reaches the forkserver's child through the command, which exits with its code.
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
    log = home / "stopped.log"
    args = ["configs/digits.yaml", "--set", "train.epochs=50"]
    _, code, _ = _signal_at_epoch_2(args, {**env, "TRAINFLOW_HOME": str(home)}, log, signal.SIGINT)
    assert code == 128 + signal.SIGINT, log.read_text()[-3000:]
    assert log.read_text().strip().splitlines()[-1] == "stopped (SIGINT)", log.read_text()[-3000:]
    assert "train.epochs=50" in (home / "warm" / "logs" / "forkserver.log").read_text()
    # Another import-time environment: the command runs in a process of its own, and says so.
    other = trainflow("run", "--set", "train.epochs=none", home=home, env={"OMP_NUM_THREADS": "1"})
    assert other.returncode == 2 and "the forkserver of trainflow up has other imports" in other.stderr
    assert other.stderr.strip().splitlines()[-1].startswith("error: invalid config: train.epochs")
    # A config naming another cluster runs in a process of its own, with Ray imported for it.
    elsewhere = trainflow("run", "--smoke", "--set", "ray.address=127.0.0.1:1", home=home)
    assert elsewhere.returncode == 2, elsewhere.stderr
    last = elsewhere.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no Ray cluster answers at 127.0.0.1:1"), elsewhere.stderr

    down = trainflow("down", home=home)
    assert down.returncode == 0, down.stderr
    assert down.stdout.strip() == "stopped"
    assert not any(alive(pid) for pid in state["pids"].values())
    assert members(home / "warm") == []  # Ray's workers too
    assert not (home / "warm" / "warm.json").exists()
    assert not (home / "warm" / "forkserver.sock").exists()
    assert not (home / "warm" / "workers.sock").exists()
    assert trainflow("down", home=home).stdout.startswith("nothing was up")


def test_the_services_stop_once_idle(home):
    up = trainflow("up", "--idle-minutes", "0.05", home=home)  # 3 s
    assert up.returncode == 0, up.stderr
    pids = _state(home)["pids"]
    deadline = time.monotonic() + 60
    while (home / "warm" / "warm.json").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not (home / "warm" / "warm.json").exists()
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(alive(pid) for pid in pids.values())
    assert members(home / "warm") == []
