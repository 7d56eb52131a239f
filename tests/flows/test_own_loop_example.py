"""examples/own_loop as a user's project runs it (its module on sys.path, as the current
folder puts it there, through `trainflow run`): Ray Train's getting-started train_func
trains on two workers, its epochs show in the train task's log, its best checkpoint is
registered, and `load_model` predicts with it. On the session's Ray cluster and Prefect
server, MLflow on SQLite."""

import shutil
from pathlib import Path

import pytest

import trainflow
from tests.commands import trainflow_in_process
from tests.flows.test_training_pipeline import flow_logs, raw_test_rows
from trainflow.config import load_config
from trainflow.pipelines.registry import store
from trainflow.workspace import workspace

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own_loop"
CONFIG = EXAMPLE / "digits-own-loop.yaml"
# The example on a small slice of the digits, two epochs, on its two workers.
SMALL = ["data.limit=400", "train.epochs=2", "train.batch_size=32", "registry.min_value=null"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A user's project folder holding the example's module, on sys.path for the module's
    tests (the session's Ray workers do not have it: the run ships it)."""
    folder = tmp_path_factory.mktemp("project")
    shutil.copy(EXAMPLE / "getting_started.py", folder / "getting_started.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        yield folder


def test_rays_getting_started_train_func_trains_registers_and_predicts(
    ray_cluster, prefect_harness, module_trainflow_home, project
):
    sets = [arg for setting in SMALL for arg in ("--set", setting)]
    out = trainflow_in_process("run", CONFIG, *sets)
    assert out.returncode == 0, out.output

    # Registered, with the loop's epochs as its history (counted from 1: the guide
    # reports its epochs from 0) and the best checkpoint by the loop's loss.
    c = store.client(workspace())
    version = c.get_model_version("digits-own-loop", "1")
    run = c.get_run(version.run_id)
    assert run.data.params["train.loop"] == "getting_started:train_func"
    losses = sorted(c.get_metric_history(version.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in losses] == [1, 2]
    best_epoch = int(version.tags["trainflow.best_epoch"])
    assert losses[best_epoch - 1].value == min(m.value for m in losses)

    # Each epoch showed in the train task's log as it ended.
    logs = flow_logs(run.data.tags["prefect.flow_run_id"])
    planned = "with train.loop getting_started:train_func for 2 epochs on 2 workers"
    assert any(planned in line for line in logs)
    epoch_lines = [line for line in logs if line.startswith("epoch ")]
    assert [line.split()[1] for line in epoch_lines] == ["1/2", "2/2"]
    assert all("  loss " in line for line in epoch_lines)

    # The registered model is the guide's resnet18, and answers raw rows with classes.
    model = trainflow.load_model("digits-own-loop@champion")
    assert model.spec["kind"] == "torchvision:resnet18" and model.metrics["epoch"] == best_epoch
    rows = raw_test_rows(load_config(CONFIG, SMALL))
    answers = model.predict(rows.drop(columns=["label"]))
    assert len(answers) == len(rows) and set(answers) <= set(model.classes)
