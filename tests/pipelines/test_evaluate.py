import numpy as np
import pytest
from sklearn import metrics as skm

from trainflow.pipelines.evaluation.evaluate import classification_metrics

Y_TRUE = np.array([0, 0, 1, 1, 2, 2, 2, 0])
Y_PRED = np.array([0, 1, 1, 1, 2, 0, 2, 0])


def test_classification_metrics_equal_scikit_learns_on_fixed_predictions():
    m = classification_metrics(Y_TRUE, Y_PRED, ["a", "b", "c"])
    assert m["accuracy"] == pytest.approx(6 / 8) == skm.accuracy_score(Y_TRUE, Y_PRED)
    assert m["macro_f1"] == pytest.approx(skm.f1_score(Y_TRUE, Y_PRED, average="macro"))
    assert m["weighted_f1"] == pytest.approx(skm.f1_score(Y_TRUE, Y_PRED, average="weighted"))
    assert m["macro_f1"] != pytest.approx(m["weighted_f1"])  # the two averages differ here
    precision = skm.precision_score(Y_TRUE, Y_PRED, average=None)
    recall = skm.recall_score(Y_TRUE, Y_PRED, average=None)
    for i, c in enumerate("abc"):
        assert m["per_class"][c]["precision"] == pytest.approx(precision[i])
        assert m["per_class"][c]["recall"] == pytest.approx(recall[i])
    assert [m["per_class"][c]["support"] for c in "abc"] == [3, 2, 3]
    assert (
        m["confusion_matrix"]
        == skm.confusion_matrix(Y_TRUE, Y_PRED).tolist()
        == [
            [2, 1, 0],
            [0, 2, 0],
            [1, 0, 2],
        ]
    )
    assert "roc_auc" not in m  # three classes


def test_roc_auc_for_two_classes_equals_scikit_learns():
    y_true = np.array([0, 0, 1, 1, 1, 0])
    p1 = np.array([0.1, 0.6, 0.35, 0.8, 0.7, 0.2])
    proba = np.stack([1 - p1, p1], axis=1)
    m = classification_metrics(y_true, proba.argmax(axis=1), ["no", "yes"], proba)
    assert m["roc_auc"] == pytest.approx(skm.roc_auc_score(y_true, p1)) == pytest.approx(8 / 9)
    # With a single class among the true labels, ROC AUC is undefined and left out.
    assert "roc_auc" not in classification_metrics(np.array([1, 1]), np.array([1, 0]), [0, 1], proba[:2])


def test_a_class_never_predicted_scores_zero_not_nan():
    m = classification_metrics(np.array([0, 1]), np.array([0, 0]), [0, 1, 2])
    assert m["per_class"]["1"]["precision"] == 0.0
    assert m["per_class"]["2"]["support"] == 0


def test_a_checkpoint_scored_on_raw_rows_uses_its_own_preprocessing(ray_cluster, tmp_path):
    """How the gate re-scores a champion on a challenger's raw test rows, on Ray Data."""
    import ray.data

    from tests.flows.test_batch_predict import PIXELS, digits_checkpoint
    from trainflow.pipelines.data.sources import digits_frame
    from trainflow.pipelines.evaluation.evaluate import evaluate_rows
    from trainflow.pipelines.models.checkpoint import load_checkpoint

    folder = digits_checkpoint(tmp_path / "ckpt")
    rows = digits_frame().sample(300, random_state=0)
    m = evaluate_rows(str(folder), ray.data.from_pandas(rows), "label", batch_size=64)
    model = load_checkpoint(folder)
    expected = model.predict(rows[PIXELS])
    assert m["num_examples"] == 300
    assert m["accuracy"] == pytest.approx(np.mean(expected == rows["label"].to_numpy()))
    assert m["confusion_matrix"] == skm.confusion_matrix(rows["label"], expected, labels=range(10)).tolist()


def test_a_small_split_scored_in_the_driver_equals_the_actor_pool(ray_cluster, tmp_path):
    """Two ways to run the same BatchPredictor over a prepared split, as written to the
    cache: in the driver (small splits) and in a map_batches actor pool (large ones)."""
    import ray.data

    from tests.flows.test_batch_predict import PIXELS, digits_checkpoint
    from trainflow.pipelines.data.preprocess import transform_batch
    from trainflow.pipelines.data.sources import digits_frame
    from trainflow.pipelines.evaluation.evaluate import evaluate_checkpoint, evaluate_checkpoint_in_driver
    from trainflow.pipelines.models.checkpoint import load_checkpoint

    folder = digits_checkpoint(tmp_path / "ckpt")
    model = load_checkpoint(folder)
    rows = digits_frame().sample(200, random_state=1)
    split = tmp_path / "test"
    # Several files, so that the driver reads more than one batch.
    transformed = ray.data.from_pandas(rows).map_batches(
        transform_batch, fn_kwargs={"state": model.preprocessor.to_dict()}, batch_format="pandas"
    )
    transformed.repartition(3).write_parquet(split)
    in_driver = evaluate_checkpoint_in_driver(str(folder), str(split), batch_size=64)
    by_actors = evaluate_checkpoint(str(folder), ray.data.read_parquet(str(split)), batch_size=64)
    assert in_driver == by_actors
    assert in_driver["num_examples"] == 200
    expected = model.predict(rows[PIXELS])
    assert in_driver["accuracy"] == pytest.approx(np.mean(expected == rows["label"].to_numpy()))
