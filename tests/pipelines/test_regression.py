"""A regression through the engine: a numeric label checked before any row is read,
scaled by the train split's statistics, split without strata, trained with its own loss
and scored with scikit-learn's metrics."""

import numpy as np
import pandas as pd
import pytest
import torch

from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
from trainflow.pipelines.data.prepare import prepare
from trainflow.pipelines.data.preprocess import FEATURES, LABEL, Preprocessor
from trainflow.pipelines.data.schema import DataError, inspect_source
from trainflow.pipelines.data.sources import diabetes_frame
from trainflow.pipelines.evaluation.evaluate import regression_metrics
from trainflow.pipelines.training.loop import make_loss


def test_a_regression_label_must_be_numeric_and_says_so_before_reading_rows(tmp_path):
    pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": ["low", "high", "low"]}).to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(
        DataError, match=r"data.label_column 'y' in .*d.csv is string; a regression label must hold numbers"
    ):
        inspect_source(DataConfig(source=str(tmp_path / "d.csv"), label_column="y"), objective="regression")
    for name in ("a", "b"):
        (tmp_path / "images" / name).mkdir(parents=True)
        (tmp_path / "images" / name / "0.png").write_bytes(b"")
    with pytest.raises(
        DataError, match=r"objective: regression needs a numeric label column; the image folders"
    ):
        inspect_source(DataConfig(source=str(tmp_path / "images")), objective="regression")


def test_diabetes_prepares_with_its_label_standardized_on_the_train_split(tmp_path):
    info = inspect_source(
        DataConfig(source="builtin:diabetes", label_column="target"), objective="regression"
    )
    assert info.format == "builtin" and len(info.input_columns) == 10
    entry = prepare(info, SplitConfig(), PreprocessConfig(), tmp_path)
    pre = entry.preprocessor
    assert pre.is_regression and pre.classes == [] and pre.num_outputs == 1
    assert sum(entry.counts.values()) == 442
    train = entry.dataset("train").take_batch(entry.counts["train"])
    y = train[LABEL]
    assert y.dtype == np.float32
    assert abs(y.mean()) < 1e-5 and abs(y.std() - 1.0) < 1e-4  # scaled by the train split's own mean and std
    raw = diabetes_frame()["target"]
    assert raw.min() <= pre.unscale(y).min() + 1e-3 and pre.unscale(y).max() <= raw.max() + 1e-3
    # Saved as plain JSON and read back, the label's scaling holds.
    again = Preprocessor.from_dict(pre.to_dict())
    assert (again.label_offset, again.label_scale) == (pre.label_offset, pre.label_scale)
    assert train[FEATURES].shape[1] == 10


def test_an_old_preprocessor_state_is_a_classifier():
    state = {"feature_columns": ["x"], "label_column": "y", "classes": [0, 1], "mean": [0.0], "std": [1.0]}
    pre = Preprocessor.from_dict(state)
    assert pre.objective == "classification" and pre.num_outputs == 2


def test_regression_losses_take_one_output_per_row():
    outputs, y = torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([1.0, 1.0, 1.0])
    assert make_loss("mse")(outputs, y).item() == pytest.approx((0 + 1 + 9) / 3)
    assert make_loss("l1")(outputs, y).item() == pytest.approx((0 + 1 + 3) / 3)
    assert make_loss("huber")(outputs, y).item() == pytest.approx((0 + 0.5 + 2.5) / 3)
    # Classification: weights and label smoothing reach PyTorch's cross entropy.
    logits, labels = torch.tensor([[2.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 0])
    weighted = make_loss("cross_entropy", class_weights=[1.0, 3.0], label_smoothing=0.1)
    expected = torch.nn.functional.cross_entropy(
        logits, labels, weight=torch.tensor([1.0, 3.0]), label_smoothing=0.1
    )
    assert weighted(logits, labels).item() == pytest.approx(expected.item())


def test_regression_metrics_equal_scikit_learns():
    from sklearn.metrics import mean_absolute_error, r2_score, root_mean_squared_error

    rng = np.random.default_rng(0)
    y = rng.normal(150, 70, 300)
    pred = y + rng.normal(0, 40, 300)
    m = regression_metrics(y, pred)
    assert m["rmse"] == pytest.approx(root_mean_squared_error(y, pred), rel=1e-12)
    assert m["mae"] == pytest.approx(mean_absolute_error(y, pred), rel=1e-12)
    assert m["r2"] == pytest.approx(r2_score(y, pred), rel=1e-12)
    assert m["num_examples"] == 300 and len(m["points"]["true"]) == 300
