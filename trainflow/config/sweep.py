"""The ``sweep`` section: the search space, the scheduler and each trial's resources; the
space checked against the whole config before any trial runs (:func:`check_sweep_space`),
and one trial's config made from its sampled values (:func:`trial_config`).

Both take the whole config (a ``PipelineConfig``, which holds :class:`SweepConfig`) and
use its type, so that this module needs no import of ``pipeline``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from trainflow.config.overrides import at_path, merge
from trainflow.config.resources import ScalingSection
from trainflow.config.sections import ConfigError, Section, section_type, validation_message

# The kinds of search dimension, as Ray Tune names them. Bounds are [low, high]; randint's
# high is exclusive, as in Ray Tune and NumPy. grid runs every value (in every sample).
DIMENSION_KINDS = ("choice", "grid", "uniform", "loguniform", "randint")
# Only these sections vary between trials: the data is ingested and prepared once per sweep,
# and every trial runs on the same resources so that concurrency can be planned.
SWEEPABLE_SECTIONS = ("model", "train")


class Dimension(Section):
    """One axis of the search space: exactly one of its fields is set."""

    choice: list[Any] | None = Field(
        None, min_length=1, description="Values to draw from, one at random for each trial."
    )
    grid: list[Any] | None = Field(
        None, min_length=1, description="Values each tried in turn: every sample runs the whole grid."
    )
    uniform: tuple[float, float] | None = Field(
        None, description="[low, high]: a number drawn uniformly between the bounds."
    )
    loguniform: tuple[float, float] | None = Field(
        None,
        description="[low, high], both above 0: a number drawn uniformly on a log scale (a learning "
        "rate, a weight decay).",
    )
    randint: tuple[int, int] | None = Field(
        None,
        description="[low, high]: an integer drawn uniformly from low up to high, high excluded, as "
        "in Ray Tune and NumPy; for integer fields.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Dimension:
        kinds = [k for k in DIMENSION_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"give exactly one of {', '.join(DIMENSION_KINDS)}, such as {{loguniform: [0.0001, 0.1]}}; "
                f"got {', '.join(kinds) or 'none'}"
            )
        low, high = self.bounds or (None, None)
        if self.loguniform is not None and low <= 0:
            raise ValueError(f"loguniform bounds must be above 0, got [{low}, {high}]")
        if low is not None and (high <= low if self.randint is not None else high < low):
            raise ValueError(f"{self.kind} needs low < high, got [{low}, {high}]")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in DIMENSION_KINDS if getattr(self, k) is not None)

    @property
    def bounds(self) -> tuple[float, float] | None:
        return self.uniform or self.loguniform or self.randint

    def extremes(self) -> list[Any]:
        """Values a trial may be given: every listed value, or both bounds and one between."""
        if self.choice is not None or self.grid is not None:
            return list(self.choice if self.choice is not None else self.grid)
        low, high = self.bounds
        if self.randint is not None:
            return [low, high - 1]
        # A value between the bounds too: an integer field refuses it (use randint there).
        return [low, 0.63 * low + 0.37 * high, high]


# Schedulers that train a population: a weak trial goes on from a strong one's checkpoint.
POPULATION_SCHEDULERS = ("pbt", "pb2")


class SweepScheduler(Section):
    """Which trials Ray Tune stops before their last epoch, or, with a population
    scheduler, which go on from a stronger trial's checkpoint with new hyperparameters."""

    kind: Literal["asha", "fifo", "pbt", "pb2"] = Field(
        "asha",
        description="asha: stop trials whose metric trails the others' at the same epoch; fifo: run "
        "all to the end; pbt: Population Based Training, every perturbation_interval epochs a "
        "trial in the bottom quantile_fraction goes on from a top trial's checkpoint with its "
        "hyperparameters perturbed (x0.8 or x1.2) or drawn again from the space; pb2: the same, "
        "the new hyperparameters chosen by a Gaussian-process bandit within the space's bounds.",
    )
    grace_period: int = Field(
        1, ge=1, description="asha: every trial trains at least this many epochs before it may be stopped."
    )
    reduction_factor: float = Field(
        2.0,
        gt=1.0,
        description="asha: at each rung (epochs grace_period, then times reduction_factor) only the "
        "best 1/reduction_factor of the trials go on.",
    )
    perturbation_interval: int = Field(
        2,
        ge=1,
        description="pbt, pb2: epochs between two looks at a trial's rank; below train.epochs.",
    )
    quantile_fraction: float = Field(
        0.25,
        gt=0.0,
        le=0.5,
        description="pbt, pb2: the share of trials in the bottom (replaced) and top (copied) quantiles.",
    )
    synch: bool = Field(
        False,
        description="pbt, pb2: every trial waits at each interval for the slowest to reach it, "
        "then all are ranked at once (reproducible, slower); false: each trial is ranked against "
        "the others' latest results as it reaches the interval.",
    )


def _flatten_space(value: Any, prefix: str = "") -> Any:
    """``{train: {lr: {loguniform: [...]}}}`` and ``{"train.lr": {...}}`` mean the same."""
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        path = f"{prefix}{key}"
        is_dimension = isinstance(item, Mapping) and any(k in DIMENSION_KINDS for k in item)
        if isinstance(item, Mapping) and not is_dimension and item:
            out.update(_flatten_space(item, f"{path}."))
        else:
            out[path] = item
    return out


class SweepConfig(Section):
    """A hyperparameter sweep on Ray Tune: the search space, the trials, the scheduler that
    stops the weak early, and each trial's resources."""

    space: dict[str, Dimension] = Field(
        ...,
        min_length=1,
        description="Dotted fields of the model and train sections, each with its dimension, one of "
        'choice, grid, uniform, loguniform or randint: {"train.lr": {loguniform: [0.0001, 0.1]}, '
        '"model.hidden_sizes": {choice: [[32], [128]]}}; nested mappings ({train: {lr: ...}}) say '
        "the same.",
    )
    search: Literal["optuna"] | None = Field(
        None,
        description="How trials are drawn: null, at random from the space (and every grid value "
        "in turn); optuna, by Optuna's TPE sampler, each trial suggested from the results of "
        "those before it (no grid dimensions).",
    )
    trials: int = Field(
        8,
        ge=1,
        description="Samples drawn from the space; with grid dimensions, each sample runs the whole grid.",
    )
    max_concurrent: int | None = Field(
        None,
        ge=1,
        description="Trials run at once; null: as many as the cluster fits (preflight computes it).",
    )
    scheduler: SweepScheduler = SweepScheduler()
    metric: Literal["val_accuracy", "val_loss", "train_loss"] = Field(
        "val_accuracy",
        description="The epoch metric that ranks the trials: the best trial's best checkpoint is "
        "evaluated and registered.",
    )
    mode: Literal["max", "min"] = Field(
        "max", description="The metric's better direction: max for val_accuracy, min for a loss."
    )
    seed: int = Field(0, description="Seeds the sampling: the same seed draws the same trials.")
    scaling: ScalingSection = Field(
        ScalingSection(num_workers=1),
        description="Each trial's workers, as scaling says a run's: one worker by default, so that "
        "several trials run at once.",
    )
    reuse_workers: bool = Field(
        True,
        description="Trials of one CPU worker with trainflow's own loop, under asha or fifo, train "
        "in Ray Tune's trial process, which the next trial reuses: no processes start per trial. "
        "false: each trial starts a Ray Train run of its own (a controller and its workers), as "
        "trials of several workers, on a GPU, with a train.loop or under PBT always do.",
    )

    @field_validator("space", mode="before")
    @classmethod
    def _dotted(cls, v: Any) -> Any:
        return _flatten_space(v)

    @field_validator("scaling")
    @classmethod
    def _fixed_workers(cls, v: ScalingSection) -> ScalingSection:
        if v.in_process:
            raise ValueError(
                "num_workers 0: each trial trains in a process of its own; give sweep.scaling."
                "num_workers 1 (a trial of one CPU worker trains in its Tune trial's process) or more"
            )
        if v.elastic:
            raise ValueError(
                f"num_workers {list(v.num_workers)}: a trial trains on a fixed number of workers; "
                "give sweep.scaling.num_workers a number"
            )
        return v

    @model_validator(mode="after")
    def _search_takes_the_space(self) -> SweepConfig:
        grid = [name for name, dim in self.space.items() if dim.grid is not None]
        if self.search == "optuna" and grid:
            raise ValueError(
                f"search optuna suggests each value, it runs no grid: give {', '.join(grid)} "
                "a choice instead of a grid, or leave search unset"
            )
        return self

    @property
    def population(self) -> int:
        """How many trials the sweep runs: each sample runs every grid value."""
        return self.trials * math.prod(len(dim.grid) for dim in self.space.values() if dim.grid is not None)

    @model_validator(mode="after")
    def _population_takes_the_space(self) -> SweepConfig:
        kind = self.scheduler.kind
        if kind not in POPULATION_SCHEDULERS:
            return self
        if self.search is not None:
            raise ValueError(
                f"scheduler {kind} draws each trial's next hyperparameters itself: leave search unset"
            )
        if self.population < 2:
            raise ValueError(f"scheduler {kind} trains a population: give trials 2 or more")
        discrete = [name for name, dim in self.space.items() if dim.kind in ("choice", "grid")]
        if kind == "pb2" and discrete:
            raise ValueError(
                f"scheduler pb2 chooses numbers within bounds: give {', '.join(discrete)} a uniform, "
                "loguniform or randint, or use scheduler pbt"
            )
        return self

    @model_validator(mode="after")
    def _metric_matches_mode(self) -> SweepConfig:
        expected = "min" if self.metric.endswith("loss") else "max"
        if self.mode != expected:
            raise ValueError(f"metric {self.metric} is best at its {expected}imum: set mode to {expected}")
        return self


# The whole config (PipelineConfig) that a sweep's space is checked against and trials made from.
Config = TypeVar("Config", bound=Section)


def check_sweep_space(config: Config) -> None:
    """Every dotted field of ``sweep.space`` exists, may vary between trials, and accepts
    each value a trial can be given (every choice, both bounds); else ConfigError naming it."""
    whole = type(config)  # PipelineConfig, which holds this module's SweepConfig
    base = config.model_dump(mode="json")
    for path, dim in config.sweep.space.items():
        field = f"sweep.space.{path}"
        parts = path.split(".")
        section: type[BaseModel] | None = whole
        for depth, part in enumerate(parts):
            if section is None:
                raise ConfigError(f"invalid config: {field}: {'.'.join(parts[:depth])} has no fields")
            if part not in section.model_fields:
                where = ".".join(parts[:depth]) or "the config"
                raise ConfigError(
                    f"invalid config: {field}: unknown field; valid keys of {where}: "
                    + ", ".join(section.model_fields)
                )
            section = section_type(section.model_fields[part].annotation)
        if parts[0] not in SWEEPABLE_SECTIONS:
            raise ConfigError(
                f"invalid config: {field}: only model.* and train.* fields vary between trials "
                "(a sweep prepares the data once, and every trial runs on sweep.scaling)"
            )
        if section is not None:
            raise ConfigError(f"invalid config: {field}: a section; sweep one of its fields instead")
        for value in dim.extremes():
            try:
                whole.model_validate(merge(base, at_path(path, value)))
            except ValidationError as e:
                reason = validation_message(e, whole).removeprefix("invalid config: ")
                if dim.kind in ("uniform", "loguniform") and "integer" in reason:
                    reason += "; integer fields take randint or choice"
                raise ConfigError(
                    f"invalid config: {field}: {dim.kind} value {value!r} does not fit: {reason}"
                ) from None
    check_population(config)


def check_population(config: Config) -> None:
    """A population scheduler (pbt, pb2) hands a trial another's checkpoint: the space holds
    train.* fields only (another model's weights would not load), not train.epochs (every
    trial trains to the same end), trainflow's own loop resumes the checkpoint, and a
    perturbation comes before the last epoch; else ConfigError naming the field."""
    sweep = config.sweep
    kind = sweep.scheduler.kind
    if kind not in POPULATION_SCHEDULERS:
        return
    for path in sweep.space:
        if not path.startswith("train.") or path == "train.epochs":
            raise ConfigError(
                f"invalid config: sweep.space.{path}: scheduler {kind} hands a trial another trial's "
                "weights mid-run, so only train.* fields other than train.epochs may vary"
            )
    if config.train.loop:
        raise ConfigError(
            f"invalid config: sweep.scheduler.kind: {kind} resumes trials from each other's "
            f"checkpoints, which trainflow's own loop does; train.loop {config.train.loop} is "
            "your own: use asha or fifo"
        )
    if sweep.scheduler.perturbation_interval >= config.train.epochs:
        raise ConfigError(
            f"invalid config: sweep.scheduler.perturbation_interval: "
            f"{sweep.scheduler.perturbation_interval} epochs is not below train.epochs "
            f"{config.train.epochs}, so no trial would be perturbed: lower it or train longer"
        )


def trial_config(config: Config, params: Mapping[str, Any]) -> Config:
    """One trial's config: the base config with the sampled ``params`` ("train.lr": 0.01),
    the sweep's per-trial scaling, checkpoints ranked by the sweep's metric, and no sweep
    section, so that it runs as it is with `trainflow run`."""
    sweep = config.sweep
    raw = config.model_dump(mode="json")
    raw["sweep"] = None
    raw["scaling"] = sweep.scaling.model_dump(mode="json")
    raw["checkpoint"] = {**raw["checkpoint"], "metric": sweep.metric, "mode": sweep.mode}
    for path, value in params.items():
        raw = merge(raw, at_path(path, value))
    try:
        return type(config).model_validate(raw)
    except ValidationError as e:
        raise ConfigError(validation_message(e, type(config))) from None
