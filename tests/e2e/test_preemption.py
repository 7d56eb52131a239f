"""A node preempted with notice, on a local multi-node Ray cluster (tests/e2e/multinode.py):
`trainflow run` trains its one worker on node A; the test drains A as a cloud drains a
spot node it reclaims (`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION` with a
deadline), and a node B joins. Ray Train's preemption watcher tells the workers; at its
next check (``checkpoint.preemption_check_steps``) trainflow's loop saves the state with
the step it reached and says so; when the deadline passes, Ray Train restarts the worker
group on B (a preemption, not a failure: ``failure.max_failures: 0``) and the run goes on
from that step, not from the epoch's start.

Training is paced by a loss of the user's own that sleeps each step while a file exists
and leaves a file named after the node of each training worker that calls it, so the test
knows which node to drain.
"""

import re
import subprocess
import sys

import pytest

from tests.e2e.multinode import local_cluster, trainflow_command, wait_for_line, wait_for_node
from tests.e2e.test_cluster import ray_node
from trainflow.ray_internals import switches

pytestmark = pytest.mark.slow

PACED_NODE_LOSS = """
import os
import time
from pathlib import Path

import ray
import ray.train
import torch


class PacedNodeLoss(torch.nn.CrossEntropyLoss):
    def __init__(self, hold: str, nodes: str):
        super().__init__()
        self.hold, self.nodes = hold, nodes

    def forward(self, outputs, targets):
        try:
            ray.train.get_context()
        except (RuntimeError, DeprecationWarning):  # trainflow's check, outside a worker
            pass
        else:
            (Path(self.nodes) / ray.get_runtime_context().get_node_id()).touch()
            if os.path.exists(self.hold):
                time.sleep(0.2)
        return super().forward(outputs, targets)
"""


def test_a_node_preempted_with_notice_is_saved_from_mid_epoch_and_the_run_goes_on_from_that_step(
    prefect_harness, tmp_path
):
    code, nodes, hold = tmp_path / "code", tmp_path / "nodes", tmp_path / "hold"
    code.mkdir()
    nodes.mkdir()
    (code / "paced_node_loss.py").write_text(PACED_NODE_LOSS)
    hold.touch()
    # The head: 2 CPUs (the controller, Ray Data) and no training slot. Ray Train's
    # preemption watcher polls each second instead of every 5.
    with local_cluster(2, {}, **{switches.TRAIN_PREEMPTION_POLL_INTERVAL: "1"}) as cluster:
        slot = cluster.node_args(1, {"trainer": 1})
        with ray_node(slot, cluster.env, tmp_path / "a.log") as node:
            wait_for_node(tmp_path / "a.log", node)  # the run's preflight finds its slot
            log = tmp_path / "run.log"
            run = trainflow_command(
                cluster, tmp_path, "run", "preempted", log, code=code,
                train={"epochs": 3, "batch_size": 4, "loss": "paced_node_loss:PacedNodeLoss",
                       "loss_args": {"hold": str(hold), "nodes": str(nodes)}},
                scaling={"num_workers": 1, "resources_per_worker": {"CPU": 0.5, "trainer": 1}},
                checkpoint={"preemption_check_steps": 5},
                failure={"max_failures": 0},  # a preemption is not a failure
            )  # fmt: skip
            try:
                wait_for_line(log, r"epoch 1/3", run)
                (node_a,) = [p.name for p in nodes.iterdir()]
                drain = [
                    sys.executable, "-m", "ray.scripts.scripts", "drain-node", f"--address={cluster.address}",
                    f"--node-id={node_a}", "--reason=DRAIN_NODE_REASON_PREEMPTION",
                    "--reason-message=spot instance reclaimed", "--deadline-remaining-seconds=6",
                ]  # fmt: skip
                subprocess.run(drain, env=cluster.env, check=True, capture_output=True, timeout=120)
                with ray_node(slot, cluster.env, tmp_path / "b.log") as node_b:
                    wait_for_node(tmp_path / "b.log", node_b)
                    wait_for_line(log, r"being preempted.*saved the state at step \d+ of epoch 2", run)
                    wait_for_line(log, r"resuming from the save at step \d+ of epoch 2", run)
                    hold.unlink()  # the rest at full speed
                    run.wait(timeout=600)
            finally:
                if run.poll() is None:
                    run.kill()
    output = log.read_text(errors="replace")
    assert run.returncode == 0, output[-5000:]
    saved = re.search(rf"Ray node {node_a[:12]} is being preempted \(gone in \d+ s\): saved the state at "
                      r"step (\d+) of epoch 2", output)  # fmt: skip
    assert saved, output[-5000:]
    # The save's step is the one the run went on from, on the other node.
    assert f"resuming from the save at step {saved.group(1)} of epoch 2" in output
    assert len(list(nodes.iterdir())) == 2, "the run did not go on on node B"
    assert [int(e) for e in re.findall(r"epoch (\d+)/3", output)] == [1, 2, 3]
    assert "Traceback" not in output and "core_worker" not in output
    assert "preempted version 1 -> champion" in output
