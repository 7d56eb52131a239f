"""examples/custom_loss_metric as a user's project runs it (its module on sys.path, as the
current folder or PYTHONPATH puts it there): trained with its focal loss, checkpoints
kept and the version gated by its top-2 accuracy, shown in the run's summary, the
Prefect artifacts and the MLflow version; a regression gated on a metric of mode min; a
loss that fails on the model's outputs, refused in one line before any worker starts.
On the session's Ray cluster and Prefect server, MLflow on SQLite."""

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

import trainflow
from tests.commands import trainflow_in_process
from tests.flows.test_training_pipeline import flow_logs, raw_test_rows, read_artifacts
from trainflow.config import load_config
from trainflow.flows.training import training_pipeline
from trainflow.pipelines.data.prepare import raw_split
from trainflow.pipelines.data.schema import inspect_source
from trainflow.pipelines.registry import store
from trainflow.testing import small_config
from trainflow.workspace import workspace

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom_loss_metric"
CONFIG = EXAMPLE / "digits-focal-top2.yaml"
# The example on a small slice: an MLP, three epochs, one worker.
SMALL = [
    "model.kind=mlp",
    "model.hidden_sizes=[32]",
    "train.epochs=3",
    "train.batch_size=32",
    "train.lr=0.01",
    "scaling.num_workers=1",
    "registry.min_value=0.5",
]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A user's project folder holding the example's module, on sys.path for the module's
    tests (the session's Ray workers do not have it: the run ships it)."""
    folder = tmp_path_factory.mktemp("project")
    shutil.copy(EXAMPLE / "focal_top2.py", folder / "focal_top2.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        yield folder


def top2(targets: np.ndarray, probabilities: np.ndarray) -> float:
    return float(np.mean((np.argsort(-probabilities, axis=1)[:, :2] == targets[:, None]).any(axis=1)))


def test_the_example_trains_with_its_loss_and_is_gated_on_its_metric(
    ray_cluster, prefect_harness, module_trainflow_home, project
):
    sets = [arg for setting in SMALL for arg in ("--set", setting)]
    out = trainflow_in_process("run", CONFIG, *sets)
    assert out.returncode == 0, out.output
    # The summary shows the metric with the task's own, and the gate's decision by it.
    summary = out.output.splitlines()
    test_line = next(line for line in summary if line.startswith("test "))
    assert ", top2 0." in test_line and test_line.split()[1] == "accuracy"
    assert any(line.startswith("gate        no champion yet; top2 0.") for line in summary), out.output

    # The version's MLflow run holds the test metric and its per-epoch val_top2.
    c = store.client(workspace())
    version = c.get_model_version("digits-focal", "1")
    run = c.get_run(version.run_id)
    assert run.data.params["train.loss"] == "focal_top2:FocalLoss"
    tested = run.data.metrics["test_top2"]
    assert tested >= run.data.metrics["test_accuracy"] and f"top2 {tested:.4f}" in test_line
    history = sorted(c.get_metric_history(version.run_id, "val_top2"), key=lambda m: m.step)
    assert len(history) == 3
    # The registered checkpoint is the epoch of the best val_top2.
    best_epoch = int(version.tags["trainflow.best_epoch"])
    assert history[best_epoch - 1].value == max(m.value for m in history)
    # The registered model scores the raw test rows with the top2 the run reported.
    config = load_config(CONFIG, SMALL)
    rows = raw_test_rows(config)
    model = trainflow.load_model("digits-focal/1")
    targets = np.searchsorted(model.classes, rows["label"].to_numpy())
    assert top2(targets, model.predict_proba(rows)) == pytest.approx(tested)

    # The Prefect artifacts and the train task's log show it too.
    evaluation = next(a.data for a in read_artifacts() if a.key == "digits-focal-evaluation")
    assert f"| top2 | {tested:.4f} |" in evaluation
    gate = next(a.data for a in read_artifacts() if a.key == "digits-focal-gate")
    assert "| top2 |" in gate

    # A second run on the same test rows must beat the champion's top2 by 0.5: it cannot.
    second = training_pipeline(config=load_config(CONFIG, [*SMALL, "registry.min_improvement=0.5"]))
    d = second.registered.decision
    assert (second.registered.version, second.registered.champion, d["metric"]) == ("2", False, "top2")
    assert d["same_test_data"] is True and d["champion"] == pytest.approx(tested)
    assert f"vs champion v1 {tested:.4f}" in d["reason"] and d["reason"].endswith("< 0.5")
    epoch_lines = [line for line in flow_logs(second_flow_run(second)) if line.startswith("epoch ")]
    assert epoch_lines and all("  val_top2 " in line for line in epoch_lines)


def second_flow_run(result) -> str:
    """The flow run id that registered ``result``'s version (its lineage tag)."""
    c = store.client(workspace())
    return c.get_run(result.registered.run_id).data.tags["prefect.flow_run_id"]


MAX_ERROR = """
    import numpy as np


    def max_error(targets, outputs):
        return float(np.max(np.abs(targets - outputs)))
"""


def test_a_regression_is_gated_on_a_metric_of_mode_min_in_the_labels_units(
    ray_cluster, prefect_harness, module_trainflow_home, project
):
    (project / "reg_metrics.py").write_text(textwrap.dedent(MAX_ERROR))
    config = load_config(
        small_config(
            name="diabetes-max-error",
            objective="regression",
            data={"source": "builtin:diabetes", "label_column": "target"},
            train={"epochs": 3, "lr": 0.01},
            evaluation={"metrics": {"max_error": {"fn": "reg_metrics:max_error", "mode": "min"}}},
            checkpoint={"metric": "val_max_error", "mode": "min"},
            # A ceiling: the version passes with a largest error under 400.
            registry={"gate_metric": "max_error", "min_value": 400.0},
        )
    )
    result = training_pipeline(config=config)
    reg = result.registered
    assert reg.champion and reg.decision["metric"] == "max_error"
    assert reg.decision["reason"].endswith("clears min_value 400.0")
    # In the label's units: the registered model's largest error on the raw test rows.
    source = inspect_source(config.data, objective="regression")
    rows = raw_split(source, config.data.split, "test", kept_rows=442).to_pandas()
    predicted = trainflow.load_model(f"{reg.name}/1").predict(rows)
    largest = np.max(np.abs(rows["target"].to_numpy() - predicted))
    assert result.test_metrics["max_error"] == pytest.approx(largest, rel=1e-4)
    assert result.test_metrics["max_error"] > result.test_metrics["rmse"]


PER_ROW_LOSS = """
    import torch.nn.functional as F


    def per_row(outputs, targets):
        return F.cross_entropy(outputs, targets, reduction="none")
"""


def test_a_loss_that_gives_no_scalar_fails_the_run_in_one_line_before_any_worker_starts(
    ray_cluster, prefect_harness, module_trainflow_home, project
):
    (project / "bad_losses.py").write_text(textwrap.dedent(PER_ROW_LOSS))
    state = training_pipeline(
        config=load_config(small_config(name="per-row-loss", train={"loss": "bad_losses:per_row"})),
        return_state=True,
    )
    assert state.is_failed()
    assert state.message.count("\n") == 0, state.message
    assert (
        "train.loss bad_losses:per_row: returned a Tensor of shape [4] for outputs of shape [4, 10], "
        "not a scalar tensor" in state.message
    )
    # The train task never got to start its workers: no plan, no epoch.
    logs = flow_logs(state.state_details.flow_run_id)
    assert not any(line.startswith(("training ", "epoch ")) for line in logs)
