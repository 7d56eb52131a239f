"""An elastic run (``scaling.num_workers: [1, 2]``) on a local multi-node Ray cluster
(tests/e2e/multinode.py): a head and a second node that joins with `ray start` and leaves
by SIGTERM, as a spot node is reclaimed.
`trainflow run` starts on the head's one training slot, grows to two workers when the
second node joins, and keeps training on one when that node is preempted: Ray drains a
node that gets SIGTERM for preemption, which Ray Train counts apart from failures, so the
run goes on within the same fit. Ray's drain on SIGTERM is best effort (bounded, and missed when
its call to the GCS is slow): on a loaded machine Ray Train may count the loss as a failure, so
the run allows one (``failure.max_failures: 1``); tests/e2e/test_preemption.py holds that a
preemption with notice is no failure. Its model is as good as a fixed run's.

Each node has one ``trainer`` resource, which every worker asks for, so a node holds one
worker. Training is paced by a loss of the user's own (``train.loss``) that sleeps a
little each step while a file exists, so the run cannot end before the test has moved
its nodes on any host; the test deletes the file once the run has shrunk.
"""

import re

import pytest

from tests.e2e.multinode import local_cluster, trainflow_command, wait_for_line
from tests.e2e.test_cluster import ray_node
from trainflow.ray_internals import switches

pytestmark = pytest.mark.slow

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


def test_an_elastic_run_grows_when_a_node_joins_and_trains_on_when_it_is_preempted(prefect_harness, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "paced_loss.py").write_text(PACED_LOSS)
    hold = tmp_path / "hold"
    hold.touch()
    # The head: 2 CPUs (a worker's half CPU and Ray Data's one) and one "trainer". When a
    # node is lost, Ray Train may first try to start the group at its old size; the
    # variable ends that try sooner than Ray's 60 s (read by the controller, on the cluster).
    head = local_cluster(2, {"trainer": 1}, **{switches.TRAIN_WORKER_GROUP_START_TIMEOUT: "10"})
    with head as cluster:
        epochs = 100
        log = tmp_path / "elastic.log"
        paced = {"loss": "paced_loss:PacedLoss", "loss_args": {"hold": str(hold)}}
        elastic = trainflow_command(
            cluster, tmp_path, "run", "elastic", log, code=code,
            train={"epochs": epochs, "batch_size": 16, **paced},
            scaling={"num_workers": [1, 2], "resources_per_worker": {"CPU": 0.5, "trainer": 1},
                     "resize_check_s": 1},
            failure={"max_failures": 1},  # the node's loss, should Ray not see it as a preemption
        )  # fmt: skip
        try:
            wait_for_line(log, r"epoch 1/", elastic)
            with ray_node(cluster.node_args(1, {"trainer": 1}), cluster.env, tmp_path / "node.log") as node:
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
        fixed = trainflow_command(
            cluster,
            tmp_path,
            "run",
            "fixed",
            fixed_log,
            train={"epochs": epochs, "batch_size": 32},
            scaling=one,
        )
        fixed.wait(timeout=600)
        fixed_output = fixed_log.read_text(errors="replace")
        assert fixed.returncode == 0, fixed_output[-5000:]
    accuracy = [
        float(re.search(r"test accuracy ([0-9.]+)", text).group(1)) for text in (output, fixed_output)
    ]
    assert accuracy[0] >= accuracy[1] - 0.05, accuracy
