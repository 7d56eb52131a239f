"""Batch inference over a Dataset with map_batches, and classification metrics.

The model loads once per actor of the pool; the metrics come from scikit-learn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from trainflow.pipelines.checkpoint import load_checkpoint
from trainflow.pipelines.preprocess import FEATURES, LABEL

if TYPE_CHECKING:
    import ray.data

PREDICTION = "prediction"


class BatchPredictor:
    """A map_batches actor: loads the checkpoint once, predicts class indices per batch."""

    def __init__(self, checkpoint_dir: str):
        self.predictor = load_checkpoint(checkpoint_dir)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        logits = self.predictor.predict_logits(np.stack(batch[FEATURES]))
        return {LABEL: batch[LABEL], PREDICTION: logits.argmax(axis=1)}


def predict_dataset(ds: ray.data.Dataset, checkpoint_dir: str, batch_size: int) -> ray.data.Dataset:
    from ray.data import ActorPoolStrategy

    return ds.map_batches(
        BatchPredictor,
        fn_constructor_kwargs={"checkpoint_dir": checkpoint_dir},
        batch_size=batch_size,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=1),  # the model loads once per actor
    )


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, classes: list[Any]) -> dict[str, Any]:
    """Accuracy, macro F1, per-class precision/recall/F1/support, confusion matrix."""
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

    labels = list(range(len(classes)))
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, zero_division=0
    )
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "num_examples": int(len(y_true)),
        "per_class": {
            str(c): {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(support[i]),
            }
            for i, c in enumerate(classes)
        },
        "confusion_matrix": confusion_matrix(y_true, y_pred, labels=labels).tolist(),
    }


def evaluate_checkpoint(checkpoint_dir: str, test: ray.data.Dataset, batch_size: int) -> dict[str, Any]:
    """Predict the test split with the checkpoint and score it."""
    classes = load_checkpoint(checkpoint_dir).classes
    y_true, y_pred = [], []
    for batch in predict_dataset(test, checkpoint_dir, batch_size).iter_batches(
        batch_size=None, batch_format="numpy"
    ):
        y_true.append(batch[LABEL])
        y_pred.append(batch[PREDICTION])
    return classification_metrics(np.concatenate(y_true), np.concatenate(y_pred), classes)
