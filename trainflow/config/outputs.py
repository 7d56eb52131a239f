"""The outputs sections: the checkpoints a run keeps, how the best is scored, and the gate it
must clear in the registry."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from trainflow.config.objective import BUILTIN_METRIC_NAMES, LOWER_IS_BETTER
from trainflow.config.sections import Section, hook_path


class CheckpointSection(Section):
    """The checkpoints Ray Train keeps, and the epoch metric that picks the best: the one
    evaluated and registered."""

    keep: int = Field(
        2,
        ge=1,
        description="How many checkpoints Ray Train keeps in storage, the best by metric; the "
        "others are deleted as training goes.",
    )
    metric: str = Field(
        "val_accuracy",
        description="The epoch metric that ranks checkpoints (the best is evaluated and "
        "registered): val_accuracy, val_loss, train_loss, or val_<name> of a metric in "
        "evaluation.metrics.",
    )
    mode: Literal["max", "min"] = Field(
        "max",
        description="The metric's better direction: max for an accuracy, min for a loss (a metric "
        "of your own: its mode).",
    )
    every_n_steps: int | None = Field(
        None,
        ge=1,
        description="Within an epoch, every N steps, the model and the train state with the step "
        "reached are saved to the run's folder (the last save only), so that a run that resumes "
        "(a lost worker or node, a retry, --resume) goes on from that step, not the epoch's "
        "start; for long epochs. Not ranked or registered: only the epochs' checkpoints are. "
        "null: at the end of each epoch only.",
    )
    preemption_check_steps: int = Field(
        20,
        ge=0,
        description="On a Ray cluster that warns of preemptions (a spot node being reclaimed, a node "
        "drained), every N steps trainflow's loop asks Ray Train whether a node of the run is being "
        "preempted (ray.train.get_preemption_info); when one is, rank 0 saves the model and train "
        "state with the step reached, as every_n_steps does, and the run goes on from that step when "
        "Ray Train restarts it. Needs storage to be a folder. 0: never ask. trainflow's own local "
        "clusters warn of none, and their runs never ask.",
    )


class MetricConfig(Section):
    """A metric of your own: its function and the direction that is better."""

    fn: str = Field(
        ...,
        description="package.module:name, called as fn(targets, outputs) -> float (see evaluation.metrics).",
    )
    mode: Literal["max", "min"] = Field(
        ..., description="The better direction: max (accuracy-like) or min (error-like)."
    )

    @field_validator("fn")
    @classmethod
    def _callable_path(cls, v: str) -> str:
        return hook_path(v)


class EvaluationConfig(Section):
    """How the best checkpoint is scored on the test split, and metrics of your own."""

    batch_size: int = Field(
        512, ge=1, description="Rows per batch the model predicts at once on the test split."
    )
    concurrency: int = Field(
        1,
        ge=1,
        description="Actors in the map_batches pool that predicts a large test split; each loads "
        "the model once.",
    )
    in_driver_max_rows: int = Field(
        100_000,
        ge=0,
        description="A test split of at most this many rows is predicted in the driver instead: an "
        "actor pool costs seconds to start, more than predicting a small split takes. 0: always "
        "the actor pool.",
    )
    metrics: dict[str, MetricConfig] = Field(
        {},
        description="Metrics of your own, by name: {top2: {fn: mycode.metrics:top2, mode: max}}. Each "
        "fn is called as fn(targets, outputs) -> float on NumPy arrays: targets hold class indices "
        "and outputs a classifier's softmax probabilities [N, classes]; for a regression both are "
        "[N] floats in the label's units. Scored on the test split beside the built-in metrics "
        "(logged as test_<name>, a possible registry.gate_metric) and on the whole validation "
        "split each epoch as val_<name> (a possible checkpoint.metric and early stopping metric).",
    )

    @field_validator("metrics")
    @classmethod
    def _own_names(cls, v: dict[str, MetricConfig]) -> dict[str, MetricConfig]:
        for name in v:
            if name in BUILTIN_METRIC_NAMES:
                raise ValueError(
                    f"{name} is a built-in metric's name; give yours another "
                    f"(taken: {', '.join(BUILTIN_METRIC_NAMES)})"
                )
            if not re.fullmatch(r"[A-Za-z_]\w*", name):
                raise ValueError(f"{name!r} is not a name of letters, digits and '_' (top2_accuracy)")
        return v

    def hooks(self) -> dict[str, str]:
        """The user's callables this section names, by field."""
        return {f"evaluation.metrics.{name}.fn": m.fn for name, m in self.metrics.items()}


class RegistryConfig(Section):
    """The promotion gate: the champion alias moves to a new model version that clears it; one
    that does not becomes the challenger."""

    gate_metric: str = Field(
        "accuracy",
        description="The test metric the gate compares: accuracy, macro_f1, weighted_f1 "
        "(classification); rmse (a regression's default), mae, r2; or a name of "
        "evaluation.metrics (its mode says which way is better).",
    )
    min_improvement: float = Field(
        0.0,
        description="How much the new model must beat the champion by on gate_metric (lower by it, "
        "for rmse, mae and a metric of mode min); 0: at least as good as the champion.",
    )
    min_value: float | None = Field(
        0.9,
        description="A bound gate_metric must clear: a floor, or a ceiling for rmse, mae and a "
        "metric of mode min. null: no bound (a regression's default).",
    )
    lease_s: float = Field(
        60.0,
        gt=0,
        description="How long a run that crashed while it held or waited for the model's gate "
        "holds the other runs up, at most: each gate takes a lease kept in the registry, renewed "
        "every quarter of this, so runs on machines that share only the registry gate one at a time.",
    )

    @property
    def lower_is_better(self) -> bool:
        """For a built-in gate_metric; PipelineConfig.lower_is_better knows the user's metrics too."""
        return self.gate_metric in LOWER_IS_BETTER
