"""Batch inference over a Dataset with map_batches, and the test metrics: a classifier's
or a regression's.

The model loads once per actor of the pool (for a small split, once in the driver).
Two predictors: :class:`BatchPredictor` reads prepared splits (features already
transformed), :class:`RowPredictor` reads raw rows and applies the checkpoint's own
saved preprocessing (batch prediction, and a champion re-scored on another model's
test data). The metrics are scikit-learn's, and beside them the user's own
(``evaluation.metrics``, :mod:`trainflow.pipelines.metrics`), each scored in this
process on the whole split's targets and outputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from trainflow.pipelines.data.entry import read_split_batches, split_dataset
from trainflow.pipelines.data.preprocess import FEATURES, LABEL
from trainflow.pipelines.metrics import UserMetric, load_metrics, score_all
from trainflow.pipelines.models.checkpoint import load_checkpoint, model_actor_options

if TYPE_CHECKING:
    import ray.data

    from trainflow.config import EvaluationConfig, SplitConfig
    from trainflow.pipelines.data.schema import SourceInfo

PREDICTION = "prediction"
PROBABILITIES = "probabilities"
PROBA_PREFIX = "proba_"
MODEL_VERSION = "model_version"
# A regression's metrics keep this many (true, predicted) pairs of the test split, drawn
# evenly, for its scatter and residual plots.
PLOT_POINTS = 2_000


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class BatchPredictor:
    """A map_batches actor over a prepared split: class indices and probabilities per
    batch; for a regression the true and predicted numbers, in the label's units."""

    def __init__(self, checkpoint_dir: str):
        self.predictor = load_checkpoint(checkpoint_dir)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs = {name: values for name, values in batch.items() if name != LABEL}  # a transform's arrays too
        outputs = self.predictor.predict_logits(inputs[FEATURES] if list(inputs) == [FEATURES] else inputs)
        pre = self.predictor.preprocessor
        if pre.is_regression:
            return {LABEL: pre.unscale(batch[LABEL]), PREDICTION: pre.unscale(outputs.reshape(-1))}
        return {LABEL: batch[LABEL], PREDICTION: outputs.argmax(axis=1), PROBABILITIES: _softmax(outputs)}


class RowPredictor:
    """A map_batches actor over raw rows: the checkpoint's preprocessing, then the model.

    Returns the predicted class value, one ``proba_<class>`` column per class, the model
    version, and the columns named in ``keep`` (an id, the label) unchanged.
    """

    def __init__(self, checkpoint_dir: str, version: str | None = None, keep: tuple[str, ...] = ()):
        import torch

        self.predictor = load_checkpoint(checkpoint_dir)
        if torch.cuda.is_available():
            self.predictor.model.to("cuda")
        self.version = version or ""
        self.keep = list(keep)

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        out = batch[self.keep].reset_index(drop=True) if self.keep else pd.DataFrame(index=range(len(batch)))
        if self.predictor.objective == "regression":
            out[PREDICTION] = self.predictor.predict(batch)
        else:
            proba = self.predictor.predict_proba(batch)
            classes = self.predictor.classes
            out[PREDICTION] = np.asarray(classes)[proba.argmax(axis=1)]
            for i, c in enumerate(classes):
                out[f"{PROBA_PREFIX}{c}"] = proba[:, i]
        out[MODEL_VERSION] = self.version
        return out


def predict_dataset(
    ds: ray.data.Dataset, checkpoint_dir: str, batch_size: int, concurrency: int = 1
) -> ray.data.Dataset:
    """A prepared split -> label, predicted class index and probabilities, per row."""
    return _on_actor_pool(
        ds,
        BatchPredictor,
        checkpoint_dir,
        concurrency,
        fn_constructor_kwargs={"checkpoint_dir": checkpoint_dir},
        batch_size=batch_size,
        batch_format="numpy",
    )


def predict_rows(
    ds: ray.data.Dataset,
    checkpoint_dir: str,
    batch_size: int,
    *,
    concurrency: int = 1,
    num_gpus: float = 0,
    version: str | None = None,
    keep: tuple[str, ...] = (),
) -> ray.data.Dataset:
    """Raw rows -> predictions with the checkpoint's own preprocessing (see RowPredictor)."""
    return _on_actor_pool(
        ds,
        RowPredictor,
        checkpoint_dir,
        concurrency,
        fn_constructor_kwargs={"checkpoint_dir": checkpoint_dir, "version": version, "keep": tuple(keep)},
        batch_size=batch_size,
        batch_format="pandas",
        num_gpus=num_gpus,
    )


def _on_actor_pool(
    ds: ray.data.Dataset, predictor: type, checkpoint_dir: str, concurrency: int, **map_batches
) -> ray.data.Dataset:
    """``ds.map_batches(predictor)`` on a pool of ``concurrency`` actors, each loading the
    checkpoint's model once.

    The actors do not restart (``max_restarts=0``): for a restartable pool Ray core logs an
    ERROR line on every run (ray issue 53727), and a lost actor fails the call instead, which
    writes nothing and can run again. Ray 2.60 takes ``max_restarts`` only as a deprecated
    remote argument (its warning filtered here); a Ray that refuses it fails loudly."""
    from ray.data import ActorPoolStrategy

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`ray_remote_args` is deprecated", DeprecationWarning)
        return ds.map_batches(
            predictor,
            compute=ActorPoolStrategy(size=concurrency),
            max_restarts=0,
            **map_batches,
            **model_actor_options(checkpoint_dir),
        )


def classification_metrics(
    y_true: np.ndarray, y_pred: np.ndarray, classes: list[Any], proba: np.ndarray | None = None
) -> dict[str, Any]:
    """Accuracy, macro and weighted F1, per-class precision/recall/F1/support, confusion
    matrix, and ROC AUC for two classes when probabilities are given.

    ``y_true`` and ``y_pred`` hold class indices into ``classes``.
    """
    from sklearn.metrics import (
        accuracy_score,
        confusion_matrix,
        f1_score,
        precision_recall_fscore_support,
        roc_auc_score,
    )

    labels = list(range(len(classes)))
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, zero_division=0
    )
    out: dict[str, Any] = {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "weighted_f1": float(f1_score(y_true, y_pred, labels=labels, average="weighted", zero_division=0)),
    }
    # ROC AUC needs both classes among the true labels; with one it is undefined.
    if proba is not None and len(classes) == 2 and len(np.unique(y_true)) == 2:
        out["roc_auc"] = float(roc_auc_score(y_true, proba[:, 1]))
    out.update(
        num_examples=int(len(y_true)),
        per_class={
            str(c): {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(support[i]),
            }
            for i, c in enumerate(classes)
        },
        confusion_matrix=confusion_matrix(y_true, y_pred, labels=labels).tolist(),
    )
    return out


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, Any]:
    """RMSE, MAE and R² (scikit-learn's), and up to PLOT_POINTS (true, predicted) pairs
    for the plots, in the label's units."""
    from sklearn.metrics import mean_absolute_error, r2_score, root_mean_squared_error

    keep = np.linspace(0, len(y_true) - 1, min(len(y_true), PLOT_POINTS)).astype(int)
    return {
        "rmse": float(root_mean_squared_error(y_true, y_pred)),
        "mae": float(mean_absolute_error(y_true, y_pred)),
        "r2": float(r2_score(y_true, y_pred)) if len(y_true) > 1 else float("nan"),
        "num_examples": int(len(y_true)),
        "points": {"true": y_true[keep].tolist(), "predicted": y_pred[keep].tolist()},
    }


def evaluate_checkpoint(
    checkpoint_dir: str,
    test: ray.data.Dataset,
    batch_size: int,
    concurrency: int = 1,
    metrics: Sequence[UserMetric] = (),
) -> dict[str, Any]:
    """Predict the prepared test split with the checkpoint, on a Ray Data actor pool, and
    score it, with the user's ``metrics`` too (scored here, on the predictions gathered)."""
    pre = load_checkpoint(checkpoint_dir).preprocessor
    batches = predict_dataset(test, checkpoint_dir, batch_size, concurrency).iter_batches(
        batch_size=None, batch_format="numpy"
    )
    return _score(batches, pre.classes, pre.is_regression, metrics)


def evaluate_checkpoint_in_driver(
    checkpoint_dir: str, split_path: str, batch_size: int, metrics: Sequence[UserMetric] = ()
) -> dict[str, Any]:
    """Predict a small prepared split in this process, with the same :class:`BatchPredictor`
    the actor pool holds: starting actors (each a process that imports torch and loads
    the model) and a Ray Data execution cost more than predicting a small split does."""
    predictor = BatchPredictor(checkpoint_dir)
    batches = (predictor(batch) for batch in read_split_batches(split_path, batch_size))
    pre = predictor.predictor.preprocessor
    return _score(batches, pre.classes, pre.is_regression, metrics)


def _score(
    batches: Iterable[dict[str, np.ndarray]],
    classes: list[Any],
    regression: bool,
    metrics: Sequence[UserMetric],
) -> dict[str, Any]:
    y_true = []
    y_pred = []
    proba = []
    for batch in batches:
        y_true.append(batch[LABEL])
        y_pred.append(batch[PREDICTION])
        if not regression:
            proba.append(batch[PROBABILITIES])
    if regression:
        targets = np.concatenate(y_true)
        predicted = np.concatenate(y_pred)
        return {**regression_metrics(targets, predicted), **score_all(metrics, targets, predicted)}
    targets = np.concatenate(y_true).astype(np.int64)
    scores = np.concatenate(proba)
    own = score_all(metrics, targets, scores)
    return {**classification_metrics(targets, np.concatenate(y_pred), classes, scores), **own}


def evaluate_rows(
    checkpoint_dir: str,
    rows: ray.data.Dataset,
    label_column: str,
    batch_size: int,
    concurrency: int = 1,
    metrics: Sequence[UserMetric] = (),
) -> dict[str, Any]:
    """Score a checkpoint on raw rows with its own preprocessing, and by the user's
    ``metrics``: how a champion trained on other data is measured on a challenger's test split."""
    pre = load_checkpoint(checkpoint_dir).preprocessor
    frame = predict_rows(
        rows, checkpoint_dir, batch_size, concurrency=concurrency, keep=(label_column,)
    ).to_pandas()
    if pre.is_regression:
        y_true = pd.to_numeric(frame[label_column], errors="coerce").to_numpy(dtype=np.float64)
        y_pred = frame[PREDICTION].to_numpy(dtype=np.float64)
        return {**regression_metrics(y_true, y_pred), **score_all(metrics, y_true, y_pred)}
    proba = frame[[f"{PROBA_PREFIX}{c}" for c in pre.classes]].to_numpy()
    targets = np.asarray(pre.labels(frame[label_column]), dtype=np.int64)
    own = score_all(metrics, targets, proba)
    return {**classification_metrics(targets, proba.argmax(axis=1), pre.classes, proba), **own}


def evaluate_split(
    checkpoint_dir: str, split_path: str, rows: int, cfg: EvaluationConfig
) -> tuple[dict[str, Any], str]:
    """Score a checkpoint on a prepared split: in this process when the split has at most
    ``cfg.in_driver_max_rows`` rows, else on a pool of ``cfg.concurrency`` Ray Data actors.
    Returns the metrics, the user's ``cfg.metrics`` among them, and where the prediction
    ran, in words."""
    own = load_metrics(cfg)
    if rows <= cfg.in_driver_max_rows:
        return evaluate_checkpoint_in_driver(checkpoint_dir, split_path, cfg.batch_size, own), "in the driver"
    from trainflow.cluster.session import on_the_cluster

    metrics = on_the_cluster(
        _evaluate_split_on_actors, checkpoint_dir, split_path, cfg.batch_size, cfg.concurrency, own
    )
    return metrics, f"by {cfg.concurrency} Ray Data actor(s)"


def _evaluate_split_on_actors(
    checkpoint_dir: str, split_path: str, batch_size: int, concurrency: int, own: Sequence[UserMetric]
) -> dict[str, Any]:
    return evaluate_checkpoint(checkpoint_dir, split_dataset(split_path), batch_size, concurrency, own)


def score_on_raw_test_split(
    checkpoint_dir: str | Path,
    source: SourceInfo,
    split: SplitConfig,
    kept_rows: int,
    cfg: EvaluationConfig,
) -> dict[str, Any]:
    """Score a checkpoint (a champion measured on other test data) on the raw rows of
    this run's test split, with its own saved preprocessing, so that a gate compares two
    models on the same rows. ``kept_rows``: the rows that prepare kept in all splits."""
    from trainflow.cluster.session import on_the_cluster

    return on_the_cluster(_score_on_raw_test_split, str(checkpoint_dir), source, split, kept_rows, cfg)


def _score_on_raw_test_split(
    checkpoint_dir: str, source: SourceInfo, split: SplitConfig, kept_rows: int, cfg: EvaluationConfig
) -> dict[str, Any]:
    from trainflow.pipelines.data.prepare import raw_split

    test = raw_split(source, split, "test", kept_rows=kept_rows)
    return evaluate_rows(
        checkpoint_dir, test, source.label_column, cfg.batch_size, cfg.concurrency, load_metrics(cfg)
    )


def evaluation_plots(history: list[dict[str, float]], metrics: dict[str, Any], folder: Path) -> list[Path]:
    """As PNGs in ``folder``: the learning curve, then a classifier's confusion matrix, or
    a regression's predicted-against-true scatter and residual histogram."""
    from trainflow.pipelines.evaluation import reports

    curve = reports.learning_curve_png(history, folder / reports.LEARNING_CURVE)
    if "points" in metrics:
        y_true = metrics["points"]["true"]
        y_pred = metrics["points"]["predicted"]
        return [
            curve,
            reports.predicted_vs_true_png(y_true, y_pred, folder / reports.PREDICTED_VS_TRUE),
            reports.residuals_png(y_true, y_pred, folder / reports.RESIDUALS),
        ]
    return [
        curve,
        reports.confusion_matrix_png(
            metrics["confusion_matrix"], list(metrics["per_class"]), folder / reports.CONFUSION_MATRIX
        ),
    ]
