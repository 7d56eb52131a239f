"""What each task (the config's ``task``: a class or a number to predict) measures, trains
with and starts from: the tables the schema checks a config against and the gate reads."""

# What a run learns to predict: a class (its label holds categories) or a number.
TASKS = ("classification", "regression")
# The test metrics each task is measured and gated on, and the direction that is better.
TASK_METRICS = {
    "classification": ("accuracy", "macro_f1", "weighted_f1"),
    "regression": ("rmse", "mae", "r2"),
}
LOWER_IS_BETTER = ("rmse", "mae")
# Names a metric of the user's own (evaluation.metrics) may not take: trainflow's own test
# metrics and the keys beside them, and what would make val_<name> one of its epoch metrics.
BUILTIN_METRIC_NAMES = (
    *TASK_METRICS["classification"],
    *TASK_METRICS["regression"],
    "roc_auc",
    "loss",
    "num_examples",
    "per_class",
    "confusion_matrix",
    "points",
)
# The losses each task trains with; the first is its default.
TASK_LOSSES = {"classification": ("cross_entropy",), "regression": ("mse", "l1", "huber")}
# Every built-in loss; train.loss may also name a loss of the user's own (package.module:name).
BUILTIN_LOSSES = (*TASK_LOSSES["classification"], *TASK_LOSSES["regression"])
# The per-epoch metrics each task reports, by which checkpoints are ranked and training stops early.
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
