"""The worker forkserver of `trainflow up`, without Ray: a program started through the
launcher Ray is given as its py_executable runs in a child that imported PyTorch before it
started, with the launcher's folder, environment, arguments, streams and exit code; where
the forkserver cannot serve it, the program starts in the launcher's own process."""

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from trainflow.stack import worker_forks
from trainflow.stack.services import stop

pytestmark = pytest.mark.slow  # the forkserver imports PyTorch

# What a Ray worker would report of itself: the first argument is the program's path. Ray
# sets OMP_NUM_THREADS once the worker takes a task (its CPUs), after PyTorch's import.
PROGRAM = """
import json, os, sys
print(json.dumps({
    "torch_before": "torch" in sys.modules,
    "helpers_before": "requests" in sys.modules and "pydantic.main" in sys.modules,
    "ray_before": "ray" in sys.modules,
    "parent": os.getppid(),
    "cwd": os.getcwd(),
    "argv": sys.argv[1:],
    "marker": os.environ.get("MARKER"),
    "threads_at_start": __import__("torch").get_num_threads(),
    "threads": (os.environ.update(OMP_NUM_THREADS="1"), __import__("torch").get_num_threads())[1],
    "path0": sys.path[0],
    "frozen": __import__("gc").get_freeze_count(),
}))
sys.exit(3)
"""


@pytest.fixture(scope="module")
def forkserver(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warm")
    served = subprocess.Popen(
        [sys.executable, "-m", "trainflow.stack.worker_forks", str(folder)],
        env={**os.environ, "OMP_NUM_THREADS": "2"},  # the workers ask for 1: each child sets its own
        stdout=open(folder / "workers.log", "w"),  # noqa: SIM115 - the server's, for its life
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a group of its own, as `trainflow up` starts it (stop() ends groups)
    )
    deadline = time.monotonic() + 120
    while not (folder / worker_forks.SOCKET).is_socket():
        assert served.poll() is None and time.monotonic() < deadline, (folder / "workers.log").read_text()
        time.sleep(0.1)
    yield folder, served.pid
    stop([served.pid])


def _launch(folder, program, tmp_path, env=None):
    """The program through the launcher, as Ray starts a worker with the job's py_executable."""
    command = [*shlex.split(worker_forks.worker_python(folder)), str(program), "--flag", "value"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"MARKER": "mine", **(env or {})}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_launched_program_is_a_child_of_the_forkserver_that_takes_over_the_launchers_process(
    forkserver, tmp_path
):
    folder, server = forkserver
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    launched = _launch(folder, program, tmp_path)
    assert launched.returncode == 3, launched.stderr
    seen = json.loads(launched.stdout)
    assert seen["torch_before"] and seen["parent"] == server
    # What Ray's worker imports of other packages too, and not Ray, which reads the
    # worker's settings from its environment when imported.
    assert seen["helpers_before"] and not seen["ray_before"]
    assert seen["cwd"] == str(tmp_path) and seen["argv"] == ["--flag", "value"] and seen["marker"] == "mine"
    # As many threads as Ray's OMP_NUM_THREADS asks once set, whatever the forkserver's were.
    assert seen["threads_at_start"] == 2 and seen["threads"] == 1
    assert seen["path0"] == str(tmp_path)  # the program's own folder, as Python sets it
    # The forkserver's objects frozen before the fork: no collection in the child walks them.
    assert seen["frozen"] > 100_000
    assert "program.py --flag value" in (folder / "workers.log").read_text()


def test_a_program_the_forkserver_cannot_serve_starts_in_the_launchers_process(forkserver, tmp_path):
    folder, server = forkserver
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    # Another variable PyTorch reads when imported: the forkserver refuses.
    refused = _launch(folder, program, tmp_path, env={"TORCH_SHOW_CPP_STACKTRACES": "1"})
    assert refused.returncode == 3, refused.stderr
    seen = json.loads(refused.stdout)
    assert not seen["torch_before"] and seen["parent"] != server and seen["argv"] == ["--flag", "value"]
    assert seen["frozen"] == 0
    # What the forkserver's imports set themselves, as a driver that imported torch._dynamo
    # before Ray started hands it on: the same imports, served.
    cache = subprocess.run(
        [sys.executable, "-c", "import os, torch._dynamo; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    served = _launch(folder, program, tmp_path, env={"TORCHINDUCTOR_CACHE_DIR": cache})
    assert served.returncode == 3 and json.loads(served.stdout)["parent"] == server, served.stderr
    elsewhere = _launch(folder, program, tmp_path, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
    assert json.loads(elsewhere.stdout)["parent"] != server, elsewhere.stderr  # another value: refused
    # No forkserver at all.
    alone = _launch(tmp_path, program, tmp_path)
    assert alone.returncode == 3 and not json.loads(alone.stdout)["torch_before"], alone.stderr


# A command that starts a local cluster of its own: its worker forkserver, started beside
# its start-up. It prints what Ray would be given, then waits for a line on stdin.
COMMAND = """
import json, os, sys, time
from pathlib import Path
from trainflow.stack.worker_forks import SOCKET, RunForks

forks = RunForks(Path(sys.argv[1]) / "worker-forks.log")
while not (forks.folder / SOCKET).is_socket():
    assert forks.process.poll() is None, "the forkserver exited"
    time.sleep(0.1)
print(json.dumps({"python": forks.use(), "pid": forks.process.pid, "folder": str(forks.folder)}), flush=True)
sys.stdin.readline()
os._exit(0)  # dies as a killed command would: no stop(), no exit hooks
"""


def _within(seconds: float, condition) -> bool:
    """Whether ``condition()`` holds within ``seconds``, asked every 0.1 s."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_commands_own_forkserver_serves_its_workers_and_ends_with_the_command(tmp_path):
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        started = json.loads(command.stdout.readline())
        program = tmp_path / "program.py"
        program.write_text(PROGRAM)
        # Ray's workers have the command's environment, with what it set for the forkserver.
        env = {**os.environ, **worker_forks.SKLEARN_ENV}
        launched = subprocess.run(
            [*shlex.split(started["python"]), str(program)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert launched.returncode == 3, launched.stderr
        seen = json.loads(launched.stdout)
        assert seen["torch_before"] and seen["parent"] == started["pid"]
        assert "program.py" in (tmp_path / "worker-forks.log").read_text()  # the log under its own name
    finally:
        command.stdin.close()
    assert command.wait(timeout=60) == 0
    # The command died without stopping it: the kernel ended the forkserver, which took its folder.
    assert _within(60, lambda: not os.path.exists(f"/proc/{started['pid']}"))
    assert _within(30, lambda: not os.path.exists(started["folder"]))


def test_a_command_stopped_before_ray_started_leaves_no_forkserver_log_or_folder(tmp_path):
    forks = worker_forks.RunForks(tmp_path / "worker-forks.log")
    assert forks.early_log.is_file()  # its output goes there while the command starts
    forks.stop()  # a command whose checks failed: it never used it
    assert forks.process.poll() is not None
    assert not forks.folder.exists() and list(tmp_path.iterdir()) == []
