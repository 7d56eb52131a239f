"""A driver killed mid-training, and `trainflow run --resume` continuing its Ray run.

The driver is a real `trainflow run` process, reporting to the session's Prefect server
and training on the session's Ray cluster (as a Prefect worker's flow run does on a
cluster of its own), killed with SIGKILL: nothing of it runs its exit hooks, its Ray job's
workers die with it, and its Prefect concurrency slot stays taken.
"""

import json
import os
import re
import signal
import subprocess
import time

import pytest
import yaml

from tests.commands import REPO, TRAINFLOW, session_services, trainflow
from trainflow.pipelines.models.checkpoint import METRICS
from trainflow.testing import small_config

pytestmark = pytest.mark.slow

EPOCHS = 30
EPOCH_ROW = re.compile(rf"epoch (\d+)/{EPOCHS}\b")


def start_and_kill_after_epoch(args: list[str], env: dict[str, str], epoch: int) -> tuple[str, int]:
    """`trainflow ARGS` until its log shows ``epoch``, then SIGKILL; its output and the last
    epoch its log showed before the kill."""
    proc = subprocess.Popen(
        [*TRAINFLOW, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines, seen = [], 0
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        lines.append(line)
        match = EPOCH_ROW.search(line)
        if match:
            seen = int(match.group(1))
            if seen >= epoch:
                proc.send_signal(signal.SIGKILL)
                break
        if time.monotonic() > deadline:
            break
    proc.kill()
    proc.wait()
    lines.append(proc.stdout.read())
    assert seen >= epoch, "".join(lines)[-3000:]
    return "".join(lines), seen


def test_a_killed_driver_is_resumed_from_its_last_checkpoint(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    cfg = small_config(name="resume-test", train={"epochs": EPOCHS, "batch_size": 64, "lr": 0.01})
    config_file = tmp_path / "resume.yaml"
    config_file.write_text(yaml.safe_dump(cfg))

    env = {
        **{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")},
        **session_services(),
        "TRAINFLOW_HOME": str(trainflow_home),
    }
    killed_out, seen = start_and_kill_after_epoch(["run", str(config_file)], env, epoch=3)
    [run] = [
        p
        for p in (trainflow_home / "runs").iterdir()
        if p.name.startswith("resume-test-")
        and json.loads((p / "trainflow-run.json").read_text())["status"] == "running"
    ]

    # The epochs the killed run got to checkpoint, before anything resumes it.
    persisted = max(
        json.loads((c / METRICS).read_text())["epoch"]
        for c in run.glob("checkpoint_*")
        if (c / METRICS).is_file()
    )

    # Another config is refused, in one line, naming what changed.
    changed = trainflow(
        "run", config_file, "--resume", "--set", "train.lr=0.02", home=trainflow_home, env=env
    )
    assert changed.returncode == 2, changed.stderr
    assert changed.stderr.count("\n") == 1 and "train.lr 0.01 (now 0.02)" in changed.stderr
    assert run.name in changed.stderr

    resumed = trainflow("run", config_file, "--resume", home=trainflow_home, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert f"resuming Ray run {run.name}" in log
    assert "concurrency slot is free again" in log  # the killed driver's slot was given back
    start = int(re.search(r"resuming from the checkpoint of epoch (\d+)", log).group(1))
    # At most one epoch trained again: the one under way at the kill. The workers may have
    # finished more epochs than the killed driver's log showed before they died with it.
    assert start >= max(seen, persisted) - 1, killed_out[-2000:]
    assert not re.search(rf"epoch {start}/{EPOCHS}\b", log)  # it did not start over
    record = json.loads((run / "trainflow-run.json").read_text())
    assert record["status"] == "completed"
    # The killed driver's progress rows, which it could not delete, are gone from the cluster.
    from trainflow import ray_internals
    from trainflow.pipelines.training.progress import PROGRESS_NAMESPACE, PROGRESS_PREFIX

    prefix = f"{PROGRESS_PREFIX}trainflow-progress-{run.name}-"
    assert ray_internals.kv_list(prefix, PROGRESS_NAMESPACE) == []

    # One history, the killed driver's epochs and the resumed ones: the same Ray run went
    # on. That a resumed training equals an uninterrupted one, epoch by epoch, is
    # tests/pipelines/test_train.py's (a worker lost mid-run, the same resume).
    latest = max(
        (json.loads((c / METRICS).read_text()) for c in run.glob("checkpoint_*") if (c / METRICS).is_file()),
        key=lambda metrics: metrics["epoch"],
    )
    assert latest["epoch"] > start
    assert [h["epoch"] for h in latest["history"]] == list(range(1, latest["epoch"] + 1))
