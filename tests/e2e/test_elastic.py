"""An elastic run (``scaling.num_workers: [1, 2]``) on a local multi-node Ray cluster: a
head started by ``ray.cluster_utils.Cluster`` (in a process of its own) and a second node
that joins with `ray start` and leaves by SIGTERM, as a spot node is reclaimed.
`trainflow run` starts on the head's one training slot, grows to two workers when the
second node joins, and keeps training on one when that node is preempted: Ray drains a
node that gets SIGTERM for preemption, which Ray Train counts apart from failures, so the
run survives it with ``failure.max_failures: 0``. Its model is as good as a fixed run's.

Each node has one ``trainer`` resource, which every worker asks for, so a node holds one
worker. Training is paced by a loss of the user's own (``train.loss``) that sleeps a
little each step while a file exists, so the run cannot end before the test has moved
its nodes on any host; the test deletes the file once the run has shrunk.
"""

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import session_services
from tests.e2e.test_cluster import ray_node
from trainflow.testing import small_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

# The head of the cluster: 2 CPUs (a worker's half CPU and Ray Data's one) and one
# "trainer". Prints its address, then runs until its stdin closes.
HEAD = """
import sys
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"trainer": 1}})
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""

# A cross-entropy loss that sleeps 100 ms a step while the file ``hold`` exists.
PACED_LOSS = """
import os
import time

import torch


class PacedLoss(torch.nn.Module):
    def __init__(self, hold: str):
        super().__init__()
        self.hold = hold

    def forward(self, outputs, targets):
        if os.path.exists(self.hold):
            time.sleep(0.1)
        return torch.nn.functional.cross_entropy(outputs, targets)
"""


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, log.read_text(errors="replace")):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not in the run's log:\n{log.read_text(errors='replace')[-5000:]}")


def test_an_elastic_run_grows_when_a_node_joins_and_trains_on_when_it_is_preempted(prefect_harness, tmp_path):
    token = secrets.token_hex(32)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    cluster_env = {
        **{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")},
        **auth,
        # When a node is lost, Ray Train may first try to start the group at its old size;
        # this ends that try sooner than Ray's 60 s (read by the controller, on the cluster).
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10",
    }
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD],
        env=cluster_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    code = tmp_path / "code"
    code.mkdir()
    (code / "paced_loss.py").write_text(PACED_LOSS)
    hold = tmp_path / "hold"
    hold.touch()
    try:
        address = head.stdout.readline().strip()
        assert address, "the cluster's head did not start"
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")},
            **session_services(ray_address=False),
            **auth,
            "RAY_ADDRESS": address,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")])),
            "TRAINFLOW_HOME": str(tmp_path / "home"),
        }

        def run(name: str, log: Path, **sections) -> subprocess.Popen:
            config = small_config(name=name, data={"limit": 400}, **sections)
            (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
            with log.open("w") as out:
                return subprocess.Popen(
                    [sys.executable, "-m", "trainflow.cli", "run", str(tmp_path / f"{name}.yaml")],
                    cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip

        epochs = 100
        log = tmp_path / "elastic.log"
        elastic = run(
            "elastic",
            log,
            train={
                "epochs": epochs,
                "batch_size": 16,
                "loss": "paced_loss:PacedLoss",
                "loss_args": {"hold": str(hold)},
            },  # fmt: skip
            scaling={
                "num_workers": [1, 2],
                "resources_per_worker": {"CPU": 0.5, "trainer": 1},
                "resize_check_s": 1,
            },  # fmt: skip
            failure={"max_failures": 0},  # a preemption is not a failure
        )
        node_args = [f"--address={address}", "--num-cpus=1", '--resources={"trainer": 1}']
        try:
            wait_for_line(log, r"epoch 1/", elastic)
            with ray_node(node_args, cluster_env, tmp_path / "node.log") as node:
                wait_for_line(log, r"resized from 1 to 2 workers", elastic)
                wait_for_line(log, r"resized from 1 to 2 workers.*\n(.*\n)*.*epoch \d+/", elastic)
                node.terminate()  # SIGTERM, mid-epoch
                wait_for_line(log, r"resized from 2 to 1 workers", elastic)
            hold.unlink()  # the rest at full speed
            elastic.wait(timeout=600)
        finally:
            if elastic.poll() is None:
                elastic.kill()
        output = log.read_text(errors="replace")
        assert elastic.returncode == 0, output[-5000:]
        assert "Traceback" not in output
        assert "started with 1 of 1 to 2 workers" in output
        assert re.search(
            r"resized from 1 to 2 workers \(the cluster has room for more\); resuming after epoch \d+", output
        )
        assert re.search(
            r"resized from 2 to 1 workers \(a worker or its node was lost\); resuming after epoch \d+", output
        )
        assert "1 to 2 workers trained on 2 Ray node(s)" in output
        # Every epoch trained, in order: a resize resumes after the last checkpoint.
        trained = [int(e) for e in re.findall(rf"epoch (\d+)/{epochs}", output)]
        assert sorted(set(trained)) == list(range(1, epochs + 1)), trained
        assert "elastic version 1 -> champion" in output

        # The same global batch on one fixed worker: the elastic model is as good.
        fixed_log = tmp_path / "fixed.log"
        one = {"num_workers": 1, "resources_per_worker": {"CPU": 0.5, "trainer": 1}}
        fixed = run("fixed", fixed_log, train={"epochs": epochs, "batch_size": 32}, scaling=one)
        fixed.wait(timeout=600)
        fixed_output = fixed_log.read_text(errors="replace")
        assert fixed.returncode == 0, fixed_output[-5000:]
    finally:
        head.stdin.close()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
    accuracy = [
        float(re.search(r"test accuracy ([0-9.]+)", text).group(1)) for text in (output, fixed_output)
    ]
    assert accuracy[0] >= accuracy[1] - 0.05, accuracy
