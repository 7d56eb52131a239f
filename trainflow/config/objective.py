"""What each objective (the config's ``objective``: a class or a number to predict)
measures, trains with and starts from: the tables the schema checks a config against and
the gate reads; and the key's old name, ``task``, still read for a release."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

# What a run learns to predict: a class (its label holds categories) or a number.
OBJECTIVES = ("classification", "regression")
# The test metrics of each objective, which the gate compares; and which are better lower.
OBJECTIVE_METRICS = {
    "classification": ("accuracy", "macro_f1", "weighted_f1"),
    "regression": ("rmse", "mae", "r2"),
}
LOWER_IS_BETTER = ("rmse", "mae")
# Names a metric of the user's own (evaluation.metrics) may not take: trainflow's own test
# metrics and the keys beside them, and what would make val_<name> one of its epoch metrics.
BUILTIN_METRIC_NAMES = (
    *OBJECTIVE_METRICS["classification"],
    *OBJECTIVE_METRICS["regression"],
    "roc_auc",
    "loss",
    "num_examples",
    "per_class",
    "confusion_matrix",
    "points",
)
# The losses each objective trains with; the first is its default.
OBJECTIVE_LOSSES = {"classification": ("cross_entropy",), "regression": ("mse", "l1", "huber")}
# Every built-in loss; train.loss may also name a loss of the user's own (package.module:name).
BUILTIN_LOSSES = (*OBJECTIVE_LOSSES["classification"], *OBJECTIVE_LOSSES["regression"])
# The per-epoch metrics each objective reports, by which checkpoints are ranked and training stops early.
EPOCH_METRICS = {
    "classification": ("val_accuracy", "val_loss", "train_loss"),
    "regression": ("val_loss", "train_loss"),
}
# A regression's defaults where they differ from a classification's: checkpoints and sweeps
# ranked by the validation loss, gated on RMSE with no bound unless one is set.
REGRESSION_DEFAULTS = {
    "checkpoint": {"metric": "val_loss", "mode": "min"},
    "registry": {"gate_metric": "rmse", "min_value": None},
    "sweep": {"metric": "val_loss", "mode": "min"},
}

# The config key's name before `objective`, still read for a release: a config or a
# `--set` override that spells it so is read as `objective`, with one warning.
OLD_KEY = "task"


def headline_metrics(metrics: Mapping[str, Any], prefix: str = "") -> tuple[str, ...]:
    """The headline metrics of the objective that ``metrics`` come from: accuracy, macro_f1
    and weighted_f1, or rmse, mae and r2 (``prefix``: as they are named there, test_)."""
    regression = f"{prefix}rmse" in metrics
    return OBJECTIVE_METRICS["regression" if regression else "classification"]


class RenamedKey(FutureWarning):
    """A config spells a key by its old name; the message names the old and the new."""


def renamed_key(raw: Any) -> Any:
    """``raw`` (a raw config: a mapping, or anything else left as it is) with the old key
    ``task`` read as ``objective``, and a :class:`RenamedKey` warning; a ValueError naming
    both when both are given and differ."""
    if not isinstance(raw, Mapping) or OLD_KEY not in raw:
        return raw
    out = dict(raw)
    old = out.pop(OLD_KEY)
    if "objective" in out and out["objective"] != old:
        raise ValueError(
            f"objective: {out['objective']!r} and task: {old!r} disagree; 'task' is the old name "
            "of 'objective': give objective alone"
        )
    out["objective"] = old
    warnings.warn(
        "config key 'task' is now 'objective'; 'task' is still read in this release",
        RenamedKey,
        stacklevel=2,
    )
    return out
