"""Metrics of the user's own (``evaluation.metrics``): each ``fn(targets, outputs) -> float``
on NumPy arrays, with the direction that is better (``mode``), as scikit-learn's scorers.

What a metric is given, on the test split (evaluation) and on the whole validation split
each epoch (training, as ``val_<name>``) alike:

- classification: ``targets`` the class indices ``[N]`` (int64, into the run's classes),
  ``outputs`` the model's softmax probabilities ``[N, classes]``: what ``predict_proba``
  answers, so that a metric written for scikit-learn's ``y_score`` (top-k accuracy, log
  loss, ROC AUC) takes them as they are;
- regression: ``targets`` and ``outputs`` the true and predicted numbers ``[N]``
  (float64), in the label's units.

Each is imported and called on a small sample of that kind before any worker starts
(:func:`check_metrics`); every failure is one line naming ``evaluation.metrics.<name>.fn``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trainflow.config import ConfigError
from trainflow.pipelines.hooks import call_hook, describe, load_hook

if TYPE_CHECKING:
    from trainflow.config import EvaluationConfig

# Rows of the sample each metric is called on before a run: every class at least twice.
SAMPLE_ROWS = 16


def field_of(name: str) -> str:
    """The config field that names metric ``name``'s callable."""
    return f"evaluation.metrics.{name}.fn"


@dataclass(frozen=True)
class UserMetric:
    name: str
    path: str  # package.module:name
    fn: Callable[[np.ndarray, np.ndarray], Any]

    def score(self, targets: np.ndarray, outputs: np.ndarray) -> float:
        """``fn(targets, outputs)`` as a float; ConfigError in one line, naming the field,
        when it raises or returns anything but one number."""
        field = field_of(self.name)
        value = call_hook(field, self.path, self.fn, targets, outputs)
        if isinstance(value, np.ndarray) and value.shape == ():
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.number)):
            raise ConfigError(f"{field} {self.path}: returned {describe(value)}, not a float")
        return float(value)


def load_metrics(cfg: EvaluationConfig) -> list[UserMetric]:
    """Every metric of ``cfg.metrics``, imported here (ConfigError naming the field of one
    that does not import)."""
    return [UserMetric(name, m.fn, load_hook(field_of(name), m.fn)) for name, m in cfg.metrics.items()]


def score_all(
    metrics: Sequence[UserMetric], targets: np.ndarray, outputs: np.ndarray, prefix: str = ""
) -> dict[str, float]:
    """Each metric on the same ``targets`` and ``outputs``, by ``prefix`` + its name."""
    return {f"{prefix}{m.name}": m.score(targets, outputs) for m in metrics}


def sample(objective: str, num_outputs: int) -> tuple[np.ndarray, np.ndarray]:
    """``targets`` and ``outputs`` of the kind a metric of ``objective`` gets (see the module's
    docstring), drawn from a fixed seed: every class among the targets at least twice."""
    rng = np.random.default_rng(0)
    if objective == "regression":
        targets = rng.normal(size=SAMPLE_ROWS)
        return targets, targets + rng.normal(scale=0.5, size=SAMPLE_ROWS)
    rows = max(SAMPLE_ROWS, 2 * num_outputs)
    targets = np.arange(rows, dtype=np.int64) % num_outputs
    scores = rng.random((rows, num_outputs)).astype(np.float32)
    return targets, scores / scores.sum(axis=1, keepdims=True)


def check_metrics(cfg: EvaluationConfig, objective: str, num_outputs: int) -> None:
    """Each of ``cfg.metrics`` imported and called on a :func:`sample` of ``objective`` with
    ``num_outputs`` outputs; ConfigError in one line naming the field of the first that
    does not import, raises, or returns anything but a finite float."""
    targets, outputs = sample(objective, num_outputs)
    for metric in load_metrics(cfg):
        value = metric.score(targets, outputs)
        if not math.isfinite(value):
            raise ConfigError(
                f"{field_of(metric.name)} {metric.path}: returned {value} on a sample of "
                f"{len(targets)} rows, not a finite float"
            )
