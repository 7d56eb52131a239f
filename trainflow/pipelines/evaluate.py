"""Batch inference over a Dataset with map_batches, and the classification metrics.

The model loads once per actor of the pool (for a small split, once in the driver).
Two predictors: :class:`BatchPredictor` reads prepared splits (features already
transformed), :class:`RowPredictor` reads raw rows and applies the checkpoint's own
saved preprocessing (batch prediction, and a champion re-scored on another model's
test data). The metrics are scikit-learn's.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from trainflow.pipelines.checkpoint import load_checkpoint
from trainflow.pipelines.entry import read_split_batches
from trainflow.pipelines.preprocess import FEATURES, LABEL

if TYPE_CHECKING:
    import ray.data

    from trainflow.config import EvaluationConfig, SplitConfig
    from trainflow.pipelines.data import SourceInfo

PREDICTION = "prediction"
PROBABILITIES = "probabilities"
PROBA_PREFIX = "proba_"
MODEL_VERSION = "model_version"


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class BatchPredictor:
    """A map_batches actor over a prepared split: class indices and probabilities per batch."""

    def __init__(self, checkpoint_dir: str):
        self.predictor = load_checkpoint(checkpoint_dir)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        logits = self.predictor.predict_logits(np.stack(batch[FEATURES]))
        return {LABEL: batch[LABEL], PREDICTION: logits.argmax(axis=1), PROBABILITIES: _softmax(logits)}


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
        proba = self.predictor.predict_proba(batch)
        classes = self.predictor.classes
        out = batch[self.keep].reset_index(drop=True) if self.keep else pd.DataFrame(index=range(len(batch)))
        out[PREDICTION] = np.asarray(classes)[proba.argmax(axis=1)]
        for i, c in enumerate(classes):
            out[f"{PROBA_PREFIX}{c}"] = proba[:, i]
        out[MODEL_VERSION] = self.version
        return out


def predict_dataset(
    ds: ray.data.Dataset, checkpoint_dir: str, batch_size: int, concurrency: int = 1
) -> ray.data.Dataset:
    """A prepared split -> label, predicted class index and probabilities, per row."""
    from ray.data import ActorPoolStrategy

    return ds.map_batches(
        BatchPredictor,
        fn_constructor_kwargs={"checkpoint_dir": checkpoint_dir},
        batch_size=batch_size,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=concurrency),  # the model loads once per actor
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
    from ray.data import ActorPoolStrategy

    return ds.map_batches(
        RowPredictor,
        fn_constructor_kwargs={"checkpoint_dir": checkpoint_dir, "version": version, "keep": tuple(keep)},
        batch_size=batch_size,
        batch_format="pandas",
        num_gpus=num_gpus,
        compute=ActorPoolStrategy(size=concurrency),
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


def evaluate_checkpoint(
    checkpoint_dir: str, test: ray.data.Dataset, batch_size: int, concurrency: int = 1
) -> dict[str, Any]:
    """Predict the prepared test split with the checkpoint, on a Ray Data actor pool, and score it."""
    classes = load_checkpoint(checkpoint_dir).classes
    batches = predict_dataset(test, checkpoint_dir, batch_size, concurrency).iter_batches(
        batch_size=None, batch_format="numpy"
    )
    return _score(batches, classes)


def evaluate_checkpoint_in_driver(checkpoint_dir: str, split_path: str, batch_size: int) -> dict[str, Any]:
    """Predict a small prepared split in this process, with the same :class:`BatchPredictor`
    the actor pool holds: starting actors (each loading the model) and a Ray Data
    execution cost seconds that a split of a few thousand rows does not repay."""
    predictor = BatchPredictor(checkpoint_dir)
    batches = (predictor(batch) for batch in read_split_batches(split_path, batch_size))
    return _score(batches, predictor.predictor.classes)


def _score(batches: Iterable[dict[str, np.ndarray]], classes: list[Any]) -> dict[str, Any]:
    y_true, y_pred, proba = [], [], []
    for batch in batches:
        y_true.append(batch[LABEL])
        y_pred.append(batch[PREDICTION])
        proba.append(batch[PROBABILITIES])
    return classification_metrics(
        np.concatenate(y_true), np.concatenate(y_pred), classes, np.concatenate(proba)
    )


def evaluate_rows(
    checkpoint_dir: str, rows: ray.data.Dataset, label_column: str, batch_size: int, concurrency: int = 1
) -> dict[str, Any]:
    """Score a checkpoint on raw rows with its own preprocessing: how a champion trained
    on other data is measured on a challenger's test split."""
    pre = load_checkpoint(checkpoint_dir).preprocessor
    frame = predict_rows(
        rows, checkpoint_dir, batch_size, concurrency=concurrency, keep=(label_column,)
    ).to_pandas()
    proba = frame[[f"{PROBA_PREFIX}{c}" for c in pre.classes]].to_numpy()
    return classification_metrics(pre.labels(frame[label_column]), proba.argmax(axis=1), pre.classes, proba)


def evaluate_split(
    checkpoint_dir: str, split_path: str, rows: int, cfg: EvaluationConfig
) -> tuple[dict[str, Any], str]:
    """Score a checkpoint on a prepared split: in this process when the split has at most
    ``cfg.in_driver_max_rows`` rows, else on a pool of ``cfg.concurrency`` Ray Data actors.
    Returns the metrics and where the prediction ran, in words."""
    if rows <= cfg.in_driver_max_rows:
        return evaluate_checkpoint_in_driver(checkpoint_dir, split_path, cfg.batch_size), "in the driver"
    import ray.data

    split = ray.data.read_parquet(split_path)
    metrics = evaluate_checkpoint(checkpoint_dir, split, cfg.batch_size, cfg.concurrency)
    return metrics, f"by {cfg.concurrency} Ray Data actor(s)"


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
    from trainflow.pipelines.prepare import raw_split

    test = raw_split(source, split, "test", kept_rows=kept_rows)
    return evaluate_rows(str(checkpoint_dir), test, source.label_column, cfg.batch_size, cfg.concurrency)


def evaluation_plots(history: list[dict[str, float]], metrics: dict[str, Any], folder: Path) -> list[Path]:
    """The learning curve and the confusion matrix as PNGs in ``folder``."""
    from trainflow.pipelines import reports

    return [
        reports.learning_curve_png(history, folder / reports.LEARNING_CURVE),
        reports.confusion_matrix_png(
            metrics["confusion_matrix"], list(metrics["per_class"]), folder / reports.CONFUSION_MATRIX
        ),
    ]
