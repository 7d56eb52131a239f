import numpy as np
import pytest
from sklearn.metrics import f1_score, precision_score, recall_score

from trainflow.pipelines.evaluate import classification_metrics


def test_metrics_match_scikit_learn_on_fixed_predictions():
    y_true = np.array([0, 0, 1, 1, 2, 2, 2, 0])
    y_pred = np.array([0, 1, 1, 1, 2, 0, 2, 0])
    m = classification_metrics(y_true, y_pred, ["a", "b", "c"])
    assert m["accuracy"] == pytest.approx(6 / 8)
    assert m["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro"))
    assert m["per_class"]["b"]["precision"] == pytest.approx(precision_score(y_true, y_pred, average=None)[1])
    assert m["per_class"]["c"]["recall"] == pytest.approx(recall_score(y_true, y_pred, average=None)[2])
    assert m["per_class"]["a"]["support"] == 3
    assert m["confusion_matrix"] == [[2, 1, 0], [0, 2, 0], [1, 0, 2]]


def test_a_class_never_predicted_scores_zero_not_nan():
    m = classification_metrics(np.array([0, 1]), np.array([0, 0]), [0, 1, 2])
    assert m["per_class"]["1"]["precision"] == 0.0
    assert m["per_class"]["2"]["support"] == 0
