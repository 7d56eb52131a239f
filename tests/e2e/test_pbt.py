"""Population Based Training from the command line on a local multi-node Ray cluster
(tests/e2e/multinode.py): `trainflow sweep` with ``sweep.scheduler.kind: pbt`` and two
trials, one per node (each node has one ``trainer`` resource, which each trial's worker
asks for). Both trials are ranked at epoch 2 (``synch``); the one whose lr barely moves
its weights is the bottom half and goes on from the top trial's epoch-2 checkpoint,
written by a worker on the other node, with that trial's lr perturbed. Its epoch 3 then
scores as the top trial's weights do, not as its own.

The workers say which node they trained on through a loss of the user's own
(``train.loss``) that records the node it is called on.
"""

import re

import pytest

from tests.e2e.multinode import local_cluster, trainflow_command, wait_for_node
from tests.e2e.test_cluster import ray_node

pytestmark = pytest.mark.slow

# A cross-entropy loss that leaves a file named after the Ray node of each training
# worker that calls it (not of trainflow's checks of it in the driver and the trial).
NODE_LOSS = """
from pathlib import Path

import ray
import ray.train
import torch


class NodeLoss(torch.nn.CrossEntropyLoss):
    def __init__(self, nodes: str):
        super().__init__()
        self.nodes = nodes

    def forward(self, outputs, targets):
        try:
            ray.train.get_context()
        except (RuntimeError, DeprecationWarning):  # outside a Ray Train worker
            pass
        else:
            (Path(self.nodes) / ray.get_runtime_context().get_node_id()).touch()
        return super().forward(outputs, targets)
"""


def test_pbt_across_nodes_hands_the_weak_trial_the_strong_ones_checkpoint(prefect_harness, tmp_path):
    code, nodes = tmp_path / "code", tmp_path / "nodes"
    code.mkdir()
    nodes.mkdir()
    (code / "node_loss.py").write_text(NODE_LOSS)
    with local_cluster(2, {"trainer": 1}) as cluster:
        with ray_node(cluster.node_args(1, {"trainer": 1}), cluster.env, tmp_path / "node.log") as node:
            wait_for_node(tmp_path / "node.log", node)  # both trials fit before the sweep starts
            log = tmp_path / "pbt.log"
            pbt = trainflow_command(
                cluster, tmp_path, "sweep", "pbt", log, code=code,
                data={"limit": 600},
                # Asked of Ray Train on a cluster that warns of preemptions (none comes).
                checkpoint={"preemption_check_steps": 5},
                train={"epochs": 4, "optimizer": "sgd", "loss": "node_loss:NodeLoss",
                       "loss_args": {"nodes": str(nodes)}},
                sweep={
                    "space": {"train.lr": {"grid": [0.05, 1e-5]}},
                    "trials": 1,
                    "scaling": {"num_workers": 1, "resources_per_worker": {"CPU": 0.5, "trainer": 1}},
                    "scheduler": {"kind": "pbt", "perturbation_interval": 2, "quantile_fraction": 0.5,
                                  "synch": True},
                },
            )  # fmt: skip
            try:
                pbt.wait(timeout=600)
            finally:
                if pbt.poll() is None:
                    pbt.kill()
    output = log.read_text(errors="replace")
    assert pbt.returncode == 0, output[-5000:]
    assert ", 2 at a time (1 workers x {'CPU': 0.5, 'trainer': 1.0} each), PBT every 2 epochs" in output
    assert len(list(nodes.iterdir())) == 2, "the trials did not train on both nodes"

    # Each trial's epochs as the flow logs them: "trial T epoch N  val_accuracy A ...".
    rows: dict[str, dict[int, float]] = {}
    for trial, epoch, accuracy in re.findall(r"trial (\S+) epoch (\d+) .*val_accuracy ([0-9.]+)", output):
        rows.setdefault(trial, {})[int(epoch)] = float(accuracy)
    assert len(rows) == 2, output[-5000:]
    weak, strong = sorted(rows, key=lambda t: rows[t][2])
    assert rows[strong][2] > rows[weak][2] + 0.3, rows

    # Exploited: epochs 1-2 its own, then 3-4 from the strong trial's weights.
    assert sorted(rows[weak]) == [1, 2, 3, 4], rows
    assert rows[weak][3] > rows[weak][2] + 0.3, rows
    assert rows[weak][3] >= rows[strong][2] - 0.05, rows
    exploit = re.search(
        rf"trial {weak} goes on from trial {strong}'s checkpoint after epoch 2: train.lr=(\S+)", output
    )
    assert exploit, output[-5000:]
    # Its lr is the strong trial's times 0.8 or 1.2, or drawn again from the space.
    assert min(abs(float(exploit.group(1)) - lr) for lr in (0.04, 0.06, 0.05, 1e-5)) < 1e-9
    assert f"trial {strong} resumes after epoch 2" in output
    assert "2 trials: 2 completed, 0 stopped early, 0 failed" in output
    assert re.search(rf"^{weak}\s+completed\s+4/4\s", output, re.M), output[-2000:]
    # Nothing of Tune's own, nor Ray core's ERROR line at each run's preemption watcher.
    for noise in (
        "Traceback",
        "Checkpoint successfully created",
        "Restored on",
        "Consider boosting PBT",
        "core_worker",
    ):
        assert noise not in output, output[-3000:]
    assert "pbt version 1 -> champion" in output
