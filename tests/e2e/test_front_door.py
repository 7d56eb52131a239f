"""The front door as a new user meets it: the first `trainflow run` on a machine with an
empty PREFECT_HOME, a quiet console, and expected failures in one line, fast.

The command runs as a subprocess, as a user types it; a data failure inside the flow, one
line on the console and in the run's logs, is tests/e2e/test_data_configs.py's."""

import re

import pytest

from tests.commands import trainflow
from trainflow.cluster.watch import marked
from trainflow.prefect_server import PrefectServerError, TemporaryServer
from trainflow.ray_internals import local_cluster_resources, switches

# A Prefect log line, as its console handler writes one: "04:22:49.465 | INFO    | ...".
PREFECT_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \| (\w+) +\| ")
# What a start slowed by a busy machine says, once (trainflow/start_wait.py): for a user to read.
SLOW_START = re.compile(
    r"\| WARNING \| trainflow - waiting for .* \(load average [\d.]+ on \d+ CPUs\), up to "
)


@pytest.mark.slow
def test_first_run_on_a_new_machine_succeeds_quietly(tmp_path):
    """An empty PREFECT_HOME: Prefect's server creates its database while Ray and torch
    start beside it, the moment the first `make run` used to fail."""
    home, prefect_home = tmp_path / "home", tmp_path / "prefect-home"
    out = trainflow(
        "run", "configs/digits.yaml", "--smoke", home=home, env={"PREFECT_HOME": str(prefect_home)}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (prefect_home / "prefect.db").is_file()  # the run's own, new Prefect database
    # One Train worker: Ray starts its workers itself (a forkserver pays off from two on).
    assert not (home / "worker-forks.log").exists()

    # The summary; a smoke run registers under its own name.
    summary = out.stdout[out.stdout.index("model       digits-smoke") :]
    assert "digits-smoke version 1 -> champion" in summary
    assert re.search(r"test        accuracy 0\.\d+, macro_f1 0\.\d+", summary)
    assert "steps       ingest" in summary

    # Nothing on the console a user cannot act on: Prefect's INFO lines of the flow and
    # its tasks, and nothing else (no traceback, no native log line, no warning but the
    # one a start slowed by a busy machine says).
    others = [
        line
        for line in out.stderr.splitlines()
        if line.strip()
        and not (PREFECT_LINE.match(line) and PREFECT_LINE.match(line).group(1) == "INFO")
        and not SLOW_START.search(line)
    ]
    assert others == [], out.stderr[-3000:]
    assert "Starting temporary server" not in out.stderr

    show = trainflow("models", "show", "digits-smoke@champion", home=home)
    assert show.returncode == 0, show.stderr
    assert '"gate.passed": "True"' in show.stdout


def more_than_this_machine_has() -> list[tuple[list[str], str]]:
    """Scalings a local cluster on this machine cannot hold, whatever the machine."""
    total = local_cluster_resources()
    gpus, cpus = int(total.get("GPU", 0)), int(total["CPU"])
    return [
        (
            ["--set", "scaling.use_gpu=true", "--set", f"scaling.num_workers={gpus + 1}"],
            rf"{gpus + 1} workers x 1 GPU = {gpus + 1} GPUs, the local Ray cluster on this machine "
            rf"would have {gpus}: set scaling.use_gpu=false",
        ),
        (
            ["--set", f"scaling.num_workers={4 * cpus + 64}"],
            rf"the local Ray cluster on this machine would have {cpus}: set "
            r"scaling.resources_per_worker.CPU to at most",
        ),
    ]


@pytest.mark.parametrize("args, message", more_than_this_machine_has())
def test_a_run_the_machine_cannot_hold_fails_in_one_line_before_anything_starts(tmp_path, args, message):
    home = tmp_path / "home"
    out = trainflow("run", *args, home=home)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), out.stderr
    # Neither Prefect's server, Ray nor the registry started.
    assert not (home / "prefect-server.log").exists() and not (home / "mlflow.db").exists()


def test_predict_on_a_gpu_the_machine_lacks_fails_in_one_line_before_anything_starts(
    trainflow_home, tmp_path
):
    """`trainflow predict --gpu` where the local cluster would have no GPU (Ray Data would
    wait for one forever): refused before Prefect or Ray start. The machine's GPUs are
    overridden to none (Ray's ``switches.OVERRIDE_RESOURCES``), so this runs anywhere."""
    import pandas as pd

    from tests.pipelines.test_registry import make_checkpoint, register
    from trainflow.workspace import workspace

    register(workspace(), make_checkpoint(tmp_path / "checkpoint"), 0.9)
    pd.DataFrame({"a": [0.5], "b": [1.0]}).to_parquet(tmp_path / "rows.parquet")
    out = trainflow(
        "predict", "toy@champion", str(tmp_path / "rows.parquet"), str(tmp_path / "out"), "--gpu",
        home=trainflow_home, env={switches.OVERRIDE_RESOURCES: '{"GPU": 0}'},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (
        "error: use_gpu (--gpu) asks for 1 GPU per actor, the local Ray cluster on this machine "
        "would have 0: predict without --gpu, or run on a cluster with GPUs"
    )
    assert not (trainflow_home / "prefect-server.log").exists() and not (tmp_path / "out").exists()


def test_the_temporary_server_that_exits_says_so_in_one_line(tmp_path):
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

    # A database the server cannot open: its start-up fails, and the wait says so at once.
    bad = f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/x.db"
    with temporary_settings(updates={PREFECT_API_DATABASE_CONNECTION_URL: bad}):
        with pytest.raises(
            PrefectServerError,
            match=r"^Prefect's temporary server exited with code \d+ before it answered: .*unable to open",
        ):
            with TemporaryServer(tmp_path / "server.log", timeout_s=120) as server:
                server.wait()


def test_the_temporary_server_that_does_not_answer_in_time_says_what_to_do(tmp_path):
    with pytest.raises(
        PrefectServerError, match=r"did not answer within 0\.01 s .*PREFECT_SERVER_EPHEMERAL_STARTUP"
    ):
        with TemporaryServer(tmp_path / "server.log", timeout_s=0.01) as server:
            server.wait()


def test_a_cluster_address_where_nothing_answers_fails_before_anything_starts(tmp_path):
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "home"
    out = trainflow("run", "--set", f"ray.address=127.0.0.1:{port}", home=home)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: no Ray cluster answers at 127.0.0.1:{port}")
    # Prefect's server, started beside the checks, went with the command, and its log too.
    assert not any(p.name.startswith("prefect-server.log") for p in home.iterdir())
    assert marked("TRAINFLOW_HOME", str(home)) == []


def test_a_server_started_beside_the_checks_leaves_at_once_where_a_profile_names_one(tmp_path, monkeypatch):
    """``trainflow run`` starts Prefect's temporary server before it has read Prefect's
    settings; where a profile names a server, the temporary one reads the same profile
    and leaves, and the command uses the profile's."""
    from trainflow import runtime

    (tmp_path / "profiles.toml").write_text(
        'active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://127.0.0.1:9/api"\n'
    )
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    server = TemporaryServer(tmp_path / "home" / "server.log").start_early()
    assert server.process.wait(timeout=120) == 0, (tmp_path / "home" / "server.log.early").read_text()
    server.stop()
    assert list((tmp_path / "home").iterdir()) == []  # no log of a server that never served
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert runtime.api_early() is None  # none at all where the environment names one


@pytest.mark.slow
def test_a_stop_of_the_whole_process_group_ends_a_run_at_once(tmp_path):
    """systemd's stop, `timeout`, `kill -- -PGID`: the signal reaches the run's local Ray
    cluster and its own Prefect server too. Ray's driver used to wait 60 s for the dead
    cluster and print a native error; the run now ends in one line, and nothing it started
    is left running (the server ends with the command, in a session of its own)."""
    import os
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
    env.update(TRAINFLOW_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect-home"))
    log = tmp_path / "run.log"
    run, code, took = _signal_at_epoch_2(["configs/digits.yaml", "--set", "train.epochs=50"], env, log,
                                         signal.SIGTERM)  # fmt: skip
    assert code == 128 + signal.SIGTERM, log.read_text()[-3000:]
    # Ray alone would wait 60 s for the dead cluster; a busy, slow host still ends well before.
    assert took < 40, log.read_text()[-3000:]
    lines = log.read_text().strip().splitlines()
    assert lines[-1] == "stopped (SIGTERM)", lines[-5:]
    assert not any("Traceback" in line or "GCS" in line for line in lines)
    # The default job's two Train workers, its controller and its helper actors were forks
    # of the command's worker forkserver, which imported PyTorch as the command started.
    forks = (tmp_path / "home" / "worker-forks.log").read_text()
    assert forks.count("default_worker.py") >= 3 and "refused" not in forks, forks
    deadline = time.monotonic() + 60  # what the run started ends with it, the forkserver too
    while left := _in_session(run.pid) + _forks_of(run.pid):
        assert time.monotonic() < deadline, left
        time.sleep(0.2)


def _forks_of(command: int) -> list[str]:
    """The live worker forkserver of the command ``command`` and its forks (which keep its
    command line), each in a session of the forkserver's."""
    import subprocess

    ps = subprocess.run(["ps", "-o", "stat=,args=", "-e"], capture_output=True, text=True).stdout
    return [
        line
        for line in ps.splitlines()
        if "trainflow.stack.worker_forks" in line
        and line.endswith(f" {command}")
        and not line.startswith("Z")
    ]


def _in_session(sid: int) -> list[str]:
    """The live processes of session ``sid`` (zombies are gone already)."""
    import subprocess

    ps = subprocess.run(["ps", "-o", "sid=,stat=,args=", "-e"], capture_output=True, text=True).stdout
    return [
        line
        for line in ps.splitlines()
        if line.split(None, 1)[0] == str(sid) and not line.split()[1].startswith("Z")
    ]


def test_the_temporary_server_ends_with_the_command_that_started_it(tmp_path):
    """In a session of its own (Ctrl-C in the terminal must not stop it before the flow
    run reports its end), yet gone when its command dies, even by SIGKILL."""
    import os
    import subprocess
    import sys
    import time

    server_log = str(tmp_path / "server.log")
    script = (
        "import os, pathlib\n"
        "from trainflow.prefect_server import TemporaryServer\n"
        f"server = TemporaryServer(pathlib.Path({server_log!r}), timeout_s=120)\n"
        "server.__enter__(); server.wait()\n"
        "print(server.process.pid, os.getsid(server.process.pid), flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == -9, out.stderr[-3000:]
    pid, sid = (int(v) for v in out.stdout.split())
    assert sid == pid != os.getsid(0)  # a session of its own
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]:
        assert time.monotonic() < deadline, "the temporary server outlived its command"
        time.sleep(0.1)


@pytest.mark.slow
def test_ctrl_c_stops_a_training_in_one_line_and_leaves_it_to_resume(ray_cluster, prefect_harness, tmp_path):
    """Ctrl-C, the usual way a user stops a run: Ray Train's own SIGINT handler aborts the
    run's workers and ends ``fit()`` as SystemExit(1), which Prefect logged as three
    "Crash detected!" ERROR lines and the command ended with exit code 1. Now: one line,
    the shell's code for SIGINT, the run's record left for ``--resume``, the flow run
    Crashed in Prefect. On the session's cluster and server (as a client of a shared
    cluster runs), so the signal reaches the command alone."""
    import json
    import os
    import signal
    import time

    import ray
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from tests.commands import session_services
    from trainflow.testing import small_config

    config = tmp_path / "stop.json"
    config.write_text(json.dumps(small_config(name="stop-test", train={"epochs": 50})))
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
    env.update(session_services(), TRAINFLOW_HOME=str(home))
    log = tmp_path / "run.log"
    free_before = ray.available_resources().get("CPU", 0)
    _, code, _ = _signal_at_epoch_2([str(config)], env, log, signal.SIGINT)  # what Ctrl-C sends
    assert code == 128 + signal.SIGINT, log.read_text()[-3000:]
    lines = log.read_text().strip().splitlines()
    assert lines[-1] == "stopped (SIGINT)", lines[-5:]
    assert not [line for line in lines if "ERROR" in line or "Traceback" in line or "Crash" in line], lines

    (record,) = home.glob("runs/stop-test-*/trainflow-run.json")
    assert json.loads(record.read_text())["status"] == "interrupted"  # `--resume` continues it
    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="stop-test-"))
        )
    assert flow_run.state.type.value == "CRASHED"
    # Ray's abort stopped the run's workers on the cluster it shares: their CPUs are free.
    deadline = time.monotonic() + 60
    while (free := ray.available_resources().get("CPU", 0)) < free_before:
        assert time.monotonic() < deadline, (free, free_before)
        time.sleep(0.2)


def _signal_at_epoch_2(args: list[str], env: dict[str, str], log, signum: int):
    """`trainflow run ARGS` in a process group of its own, its output in ``log``; once the
    log shows epoch 2 of 50, ``signum`` to the whole group (as a terminal or systemd
    sends it). The process, its exit code and the seconds from the signal to its exit."""
    import os
    import signal
    import subprocess
    import time

    from tests.commands import REPO, TRAINFLOW

    with log.open("w") as out:
        run = subprocess.Popen(
            [*TRAINFLOW, "run", *args],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while "epoch 2/50" not in log.read_text():
            assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(run.pid, signum)
        sent = time.monotonic()
        code = run.wait(timeout=60)
        return run, code, time.monotonic() - sent
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
