"""A regression for real: scikit-learn's diabetes data through the training flow and a
sweep of two trials (`trainflow sweep`), on the session's Ray cluster, the Prefect test
server and MLflow."""

import numpy as np
import pytest

from tests.commands import trainflow_in_process
from trainflow.config import load_config
from trainflow.flows.training import training_pipeline
from trainflow.pipelines.data.entry import read_split
from trainflow.pipelines.data.preprocess import FEATURES, LABEL
from trainflow.pipelines.data.sources import diabetes_frame
from trainflow.pipelines.evaluation.evaluate import MODEL_VERSION, PREDICTION, RowPredictor
from trainflow.pipelines.registry import store, versions
from trainflow.tasks import render
from trainflow.workspace import workspace

pytestmark = pytest.mark.slow

CONFIG = "configs/diabetes-regression.yaml"


def test_a_regression_trains_is_gated_on_rmse_and_predicts_numbers(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    # A model that has barely trained becomes the first champion: no bound by default.
    weak = training_pipeline(
        config=load_config(CONFIG, ["name=diabetes-test", "train.epochs=1", "train.lr=0.0001"])
    )
    assert weak.registered.champion and weak.registered.version == "1"
    assert set(weak.test_metrics) == {"rmse", "mae", "r2"}
    # The summary's test line names a regression's metrics.
    test_line = next(line for line in render.summary_lines(weak) if line.startswith("test"))
    assert "rmse" in test_line and "mae" in test_line and "r2" in test_line and "accuracy" not in test_line

    # A sweep of two trials (ranked by val_loss, the regression's default) as a user
    # starts one, `trainflow sweep` (in this process, on the session's cluster and
    # server): it registers its best, which the gate promotes for its lower rmse.
    overrides = [
        "name=diabetes-test",
        "train.epochs=20",
        "sweep.space={train.lr: {grid: [0.01, 0.003]}}",
        "sweep.trials=1",
        "sweep.max_concurrent=2",
        "sweep.scheduler.kind=fifo",
    ]
    sweep = load_config(CONFIG, overrides)
    assert (sweep.sweep.metric, sweep.sweep.mode) == ("val_loss", "min")
    best_yaml = tmp_path / "best.yaml"
    out = trainflow_in_process(
        "sweep", CONFIG, *[arg for o in overrides for arg in ("--set", o)], "--best-config", best_yaml
    )
    assert out.returncode == 0, out.output[-3000:]
    printed = out.stdout.splitlines()
    header = next(i for i, line in enumerate(printed) if line.startswith("trial "))
    assert printed[header].split() == ["trial", "status", "epochs", "val_loss", "params"]
    trials = printed[header + 1 : header + 3]
    # Every epoch's row reached the sweep, though under FIFO they go to Tune together.
    assert all(" completed  20/20 " in row for row in trials), printed
    assert {row.split()[-1] for row in trials} == {"train.lr=0.01", "train.lr=0.003"}
    assert "model       diabetes-test version 2 -> champion" in printed, printed
    (gate,) = [line for line in printed if line.startswith("gate")]
    assert "(lower is better)" in gate
    (test_line,) = [line for line in printed if line.startswith("test")]
    assert "rmse" in test_line and "accuracy" not in test_line
    assert "concurrency 2 trials at a time" in printed
    # --best-config: the best trial's config, as `trainflow run` takes it.
    best = load_config(best_yaml)
    assert best.train.lr in (0.01, 0.003) and best.sweep is None and best.train.epochs == 20
    assert f"(and {best_yaml})" in out.stdout

    c = store.client(workspace())
    run = c.get_run(c.get_model_version("diabetes-test", "2").run_id)
    test_metrics = {k.removeprefix("test_"): v for k, v in run.data.metrics.items() if k.startswith("test_")}
    assert run.data.params["train.lr"] == str(best.train.lr)
    assert test_metrics["rmse"] < weak.test_metrics["rmse"]
    assert test_metrics["r2"] >= 0.35

    # The test metrics are scikit-learn's, on the champion's predictions of the test split.
    from sklearn.metrics import mean_absolute_error, r2_score, root_mean_squared_error

    model = versions.load_model("diabetes-test@champion", workspace())
    assert model.objective == "regression" and model.version == "2"
    entry = model.preprocessor
    prepared = next(p for p in workspace().cache.glob("*/test") if (p.parent / "preprocessor.json").is_file())
    test = read_split(prepared)
    y_true = entry.unscale(test[LABEL])
    y_pred = entry.unscale(model.predict_logits(test[FEATURES]).reshape(-1))
    assert test_metrics["rmse"] == pytest.approx(root_mean_squared_error(y_true, y_pred), rel=1e-5)
    assert test_metrics["mae"] == pytest.approx(mean_absolute_error(y_true, y_pred), rel=1e-5)
    assert test_metrics["r2"] == pytest.approx(r2_score(y_true, y_pred), rel=1e-5)

    # Raw rows in, numbers in the label's units out; batch prediction writes the
    # prediction and the version, no class probabilities.
    rows = diabetes_frame().head(5)
    predicted = model.predict(rows)
    assert predicted.dtype == np.float64 and np.all((predicted > 0) & (predicted < 400))
    out = RowPredictor(str(model.path), version="2")(rows)
    assert list(out.columns) == [PREDICTION, MODEL_VERSION]
    np.testing.assert_allclose(out[PREDICTION], predicted, rtol=1e-6)
