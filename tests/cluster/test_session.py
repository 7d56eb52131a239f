"""A run's Ray session: the worker processes it starts ahead of its first tasks, the
priority of its workers, and trainflow shipped to a cluster's workers as runtime_env py_modules."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from trainflow.cluster.quiet import LOCAL_CLUSTER_ENV


def test_warm_workers_start_one_per_cpu_with_the_preprocessing_code_imported(ray_cluster):
    import ray

    from trainflow.cluster.session import warm_workers

    refs = warm_workers(["trainflow.pipelines.data.prepare"], most=8)
    assert len(refs) == min(int(ray.cluster_resources()["CPU"]), 8)
    ray.get(refs, timeout=60)  # a worker that cannot import trainflow.pipelines.data.prepare fails here
    assert len(warm_workers(["trainflow.pipelines.data.prepare"], most=1)) == 1


# A driver of its own, started at a niceness above the test's: the cluster it starts is
# the driver's, and its workers take the driver's priority, not Ray's lower one.
NICE_DRIVER = """\
import json, os
import ray
from trainflow.cluster.session import connect, shutdown
from trainflow.config import PipelineConfig

connect(PipelineConfig.model_validate({}))


@ray.remote(num_cpus=0)
def niceness():
    return os.getpriority(os.PRIO_PROCESS, 0)


@ray.remote(num_cpus=0)
class Worker:
    def niceness(self):
        return os.getpriority(os.PRIO_PROCESS, 0)


print("ANSWER " + json.dumps({
    "driver": os.getpriority(os.PRIO_PROCESS, 0),
    "task": ray.get(niceness.remote()),
    "actor": ray.get(Worker.remote().niceness.remote()),
}), flush=True)
shutdown()
"""


@pytest.mark.slow
def test_the_workers_of_a_local_cluster_run_at_the_drivers_priority(tmp_path):
    # The session's cluster settings stay out: the driver's connect() gives its own.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and k not in LOCAL_CLUSTER_ENV}
    done = subprocess.run(
        [sys.executable, "-c", NICE_DRIVER],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.nice(3),
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ANSWER ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    answer = json.loads(lines[0].removeprefix("ANSWER "))
    driver = os.getpriority(os.PRIO_PROCESS, 0) + 3
    assert answer == {"driver": min(driver, 19), "task": min(driver, 19), "actor": min(driver, 19)}


def test_ray_client_init_is_tried_again_only_when_the_jobs_server_process_died():
    from trainflow.cluster.session import client_server_died

    # As Ray Client's proxier reports a job's server that died as it started (ray#63202).
    zombie = (
        "Initialization failure from server:\nTraceback (most recent call last):\n  File "
        '"ray/util/client/server/proxier.py", line 396, in start_specific_server\n    cmd = '
        "psutil_proc.cmdline()\npsutil.ZombieProcess: PID still exists but it's a zombie (pid=17741)"
    )
    assert client_server_died(ConnectionAbortedError(zombie))
    assert client_server_died(
        ConnectionAbortedError("Initialization failure from server:\nStarting Ray client server failed")
    )
    # A refused token or a version mismatch is the user's to fix: not tried again.
    assert not client_server_died(
        ConnectionAbortedError("Initialization failure from server:\nPermissionError: bad token")
    )


# A driver of its own whose task leaves a process behind, out of its worker's reach (its
# parent exits at once, and it leads a session of its own), as out of Ray's reach as a
# worker that hangs on its way out: the cluster's end ends it.
LEAVING_DRIVER = """\
import json, subprocess, sys, time
import ray
from trainflow.cluster.session import connect, shutdown
from trainflow.cluster.watch import alive
from trainflow.config import PipelineConfig

connect(PipelineConfig.model_validate({}))


@ray.remote(num_cpus=0)
def leave_behind():
    quiet = "stdin=s.DEVNULL, stdout=s.DEVNULL, stderr=s.DEVNULL"
    daemon = f"import subprocess as s; print(s.Popen(['sleep', '600'], {quiet}, start_new_session=True).pid)"
    return int(subprocess.run([sys.executable, "-c", daemon], capture_output=True, text=True).stdout)


pid = ray.get(leave_behind.remote())
running = alive(pid)
shutdown()
deadline = time.monotonic() + 10  # a SIGKILL's delivery takes a moment
while alive(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
answer = {"pid": pid, "while the cluster runs": running, "after": alive(pid)}
print("ANSWER " + json.dumps(answer), flush=True)
"""


@pytest.mark.slow
def test_nothing_a_local_cluster_started_outlives_its_shutdown(tmp_path):
    from trainflow.cluster.watch import alive

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and k not in LOCAL_CLUSTER_ENV}
    command = [sys.executable, "-c", LEAVING_DRIVER]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ANSWER ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    answer = json.loads(lines[0].removeprefix("ANSWER "))
    try:
        assert answer["while the cluster runs"] and not answer["after"], answer
    finally:
        if alive(answer["pid"]):
            os.kill(answer["pid"], signal.SIGKILL)


# A cold start beside busy processes that ends in one line either way: started, after
# saying once that it waits, or the error past the bound.
SLOW_DRIVER = """\
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
from trainflow import start_wait
from trainflow.cluster.session import PreflightError, connect, shutdown
from trainflow.config import PipelineConfig

start_wait.SLOW_START_S = 0.2  # any real start is slower: the notice is due
try:
    connect(PipelineConfig.model_validate({}), logging.getLogger("trainflow.cli"))
except PreflightError as e:
    print(f"error: {e}", flush=True)
    sys.exit(2)
print("started", flush=True)
shutdown()
"""


@pytest.mark.slow
def test_a_slow_cold_start_beside_busy_processes_says_once_that_it_waits(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and k not in LOCAL_CLUSTER_ENV}
    env["TRAINFLOW_START_TIMEOUT"] = "120"
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        done = subprocess.run(
            [sys.executable, "-c", SLOW_DRIVER],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        for p in busy:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    out = done.stdout + done.stderr
    waiting = [line for line in out.splitlines() if line.startswith("waiting for ")]
    assert done.returncode == 0 and "started" in done.stdout, out[-3000:]
    assert len(waiting) == 1, out[-3000:]
    assert waiting[0].startswith("waiting for the local Ray cluster to start (load average ")
    assert waiting[0].endswith("CPUs), up to 120 s (TRAINFLOW_START_TIMEOUT)...")


def test_a_local_cluster_past_the_start_bound_is_one_line_naming_it(monkeypatch):
    """Ray's node gives up once its raylet's registration outlasts the wait it was given: the
    bound (TRAINFLOW_START_TIMEOUT), handed to Ray for that start alone."""
    import ray

    from trainflow.cluster import session
    from trainflow.ray_internals import switches

    handed = {}

    def late_node(**kwargs):
        handed["wait"] = os.environ.get(switches.RAYLET_START_WAIT)
        raise Exception(  # as ray._private.node.Node words it
            "The current node timed out during startup. This could happen because some of the raylet "
            "failed to startup or the GCS has become overloaded."
        )

    monkeypatch.setenv("TRAINFLOW_START_TIMEOUT", "45")
    monkeypatch.delenv(switches.RAYLET_START_WAIT, raising=False)
    monkeypatch.setattr(ray, "init", late_node)
    with pytest.raises(session.PreflightError) as failed:
        session._local_init(None, {})
    assert handed["wait"] == "45" and switches.RAYLET_START_WAIT not in os.environ
    assert str(failed.value).startswith("the local Ray cluster did not start within 45 s (load average ")
    assert str(failed.value).endswith(
        " CPUs): set TRAINFLOW_START_TIMEOUT above 45 (seconds), or run when the machine is less busy"
    )
    assert "\n" not in str(failed.value)


def test_a_shipped_trainflow_comes_before_one_the_cluster_has(ray_cluster, tmp_path):
    """A cluster's own trainflow (here: an older copy first on the workers' PYTHONPATH, and
    the session's editable install) loses to the copy shipped as runtime_env py_modules:
    Ray puts py_modules ahead of the path the worker had."""
    import ray

    from trainflow import __version__
    from trainflow.cluster.session import trainflow_package, uploaded_modules

    # An older release of trainflow, as a cluster's image might hold (a copy, since every
    # worker of this job runs trainflow's setup hook from whichever copy it imports).
    stale = tmp_path / "site" / "trainflow"
    shutil.copytree(trainflow_package(), stale, ignore=shutil.ignore_patterns("__pycache__"))
    version = stale / "version.py"
    version.write_text(version.read_text().replace(f'__version__ = "{__version__}"', '__version__ = "0.0.1"'))
    older = {"env_vars": {"PYTHONPATH": str(stale.parent)}}

    @ray.remote(num_cpus=0)
    def imported() -> tuple[str, str]:
        import trainflow

        return trainflow.__file__, trainflow.__version__

    where, version = ray.get(
        imported.options(runtime_env={**uploaded_modules([trainflow_package()]), **older}).remote()
    )
    assert "runtime_resources" in where and version != "0.0.1", where
    # Without the shipped copy, the same worker environment imports the stale one: the
    # check above is about the order, not about a path that was never there.
    assert ray.get(imported.options(runtime_env=older).remote()) == (
        str(stale / "__init__.py"),
        "0.0.1",
    )
