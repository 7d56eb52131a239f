"""PipelineConfig: every section of a run, the rules across them, and its hashes.

A config arrives as a dict (a deployment's parameters, Python), a YAML or JSON file,
plus dotted overrides from the command line (``train.lr=0.01``). Unknown keys and
wrong types are refused with a :class:`ConfigError` that names the dotted field.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from trainflow.config.data import DataConfig, PreprocessConfig
from trainflow.config.drift import DriftConfig
from trainflow.config.objective import (
    EPOCH_METRICS,
    LOWER_IS_BETTER,
    OBJECTIVE_LOSSES,
    OBJECTIVE_METRICS,
    OLD_KEY,
    REGRESSION_DEFAULTS,
    renamed_key,
)
from trainflow.config.outputs import CheckpointSection, EvaluationConfig, RegistryConfig
from trainflow.config.resources import FailureSection, RayConfig, ScalingSection
from trainflow.config.sections import ConfigError, Section, validation_message
from trainflow.config.sweep import SweepConfig
from trainflow.config.training import LOOP_SETTINGS, ModelConfig, TrainConfig

# The URI schemes of pyarrow's filesystems, which every trainflow process reads and
# writes the cache through.
CACHE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs", "file")
# Fields a config hash leaves out while they hold their empty default (null, or an empty
# dict), so that a config that does not use them hashes as it does in a release without
# them (the keys to each).
HASHED_WHEN_SET = (
    ("scaling", "resize_check_s"),
    ("failure", "max_preemptions"),
    ("sweep", "scaling", "resize_check_s"),
    ("sweep", "search"),
    ("train", "loss_args"),
    ("evaluation", "metrics"),
    ("train", "loop"),
    ("train", "loop_config"),
    ("preprocess", "transform"),
    ("checkpoint", "every_n_steps"),
    ("preprocess", "tokenizer"),
    ("preprocess", "image_mean"),
    ("preprocess", "image_std"),
    ("train", "lora"),
)

# Fields added with a default of their own, which a config hash leaves out while they hold
# it (the key path to each, and that default).
HASHED_UNLESS_DEFAULT = {
    ("sweep", "scheduler", "perturbation_interval"): 2,
    ("sweep", "scheduler", "quantile_fraction"): 0.25,
    ("sweep", "scheduler", "synch"): False,
    ("sweep", "reuse_workers"): True,
    ("checkpoint", "preemption_check_steps"): 20,
}

# Top-level sections a config hash leaves out while they are null (unset).
OPTIONAL_SECTIONS = ("sweep", "drift")


class PipelineConfig(Section):
    """Every setting of a training run: the top-level fields and one section per concern."""

    name: str = Field(
        "digits",
        description="The registered model's name, which each run's name starts with: letters, "
        "digits, '_', '.' and '-', starting with a letter or digit.",
    )
    objective: Literal["classification", "regression"] = Field(
        "classification",
        description="classification: the label holds classes; regression: a number to predict. A "
        "regression starts from its own defaults: the mse loss, checkpoints ranked by val_loss, "
        "the gate on rmse with no bound. Its old name, task, is still read in this release.",
    )
    data: DataConfig = DataConfig()
    preprocess: PreprocessConfig = PreprocessConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    scaling: ScalingSection = ScalingSection()
    checkpoint: CheckpointSection = CheckpointSection()
    failure: FailureSection = FailureSection()
    evaluation: EvaluationConfig = EvaluationConfig()
    registry: RegistryConfig = RegistryConfig()
    ray: RayConfig = RayConfig()
    storage: str | None = Field(
        None,
        description="Ray Train storage for runs and their checkpoints; null: TRAINFLOW_HOME/runs. "
        "Use s3://... or a shared filesystem when the Ray cluster has more than one node.",
    )
    cache: str | None = Field(
        None,
        description="The prepared-split cache; null: TRAINFLOW_HOME/cache. Every node of a Ray "
        "cluster reads and writes it: on several nodes, a folder they all mount at this path, or "
        "a URI like storage's (s3://bucket/cache, gs://..., abfs://..., hdfs://...). Where it is "
        "changes no result, nor the config's hash.",
    )
    drift: DriftConfig | None = Field(
        None,
        description="Measure drift before training: this run's train split against the champion's "
        "(each feature's population stability index, a KS test for numbers, the label's "
        "distribution), published as a table and a plot; drift.action says what a drifted "
        "feature does. null: no drift check.",
    )
    sweep: SweepConfig | None = Field(
        None,
        description="A hyperparameter sweep on Ray Tune (trainflow sweep): the search space, the "
        "trials, the scheduler that stops the weak early, each trial's resources. trainflow run "
        "trains one model and ignores it; null: no sweep.",
    )

    def hooks(self) -> dict[str, str]:
        """Every user callable the config names (``package.module:name``), by its field:
        ``model.kind``'s builder and whatever other section names one."""
        found: dict[str, str] = {}
        for section in (self.data, self.preprocess, self.model, self.train, self.evaluation):
            found.update(getattr(section, "hooks", dict)())
        return found

    @property
    def user_modules(self) -> dict[str, str]:
        """The module of each user callable the config names, with the field that names it:
        what a run ships to the Ray workers (its top-level package) and imports there."""
        modules: dict[str, str] = {}
        for field, path in self.hooks().items():
            modules.setdefault(path.partition(":")[0], field)
        return modules

    @field_validator("cache")
    @classmethod
    def _cache_folder(cls, v: str | None) -> str | None:
        if v is not None and "://" in v and v.partition("://")[0].lower() not in CACHE_SCHEMES:
            raise ValueError(
                f"{v!r} is not a folder or a URI of a filesystem trainflow reaches: use a folder "
                f"or one of {', '.join(f'{s}://' for s in CACHE_SCHEMES)}"
            )
        if v is not None and not v.strip():
            raise ValueError("is empty: give a folder, or leave it out for TRAINFLOW_HOME/cache")
        return v

    @field_validator("name")
    @classmethod
    def _registry_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v):
            raise ValueError(
                f"must start with a letter or digit and hold only letters, digits, '_', '.', '-'; got {v!r}"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _objective_defaults(cls, raw: Any) -> Any:
        """The old key ``task`` read as ``objective``; a regression's sections start from
        REGRESSION_DEFAULTS, and what the config sets wins."""
        raw = renamed_key(raw)
        if not isinstance(raw, Mapping) or raw.get("objective") != "regression":
            return raw
        raw = dict(raw)
        for section, defaults in REGRESSION_DEFAULTS.items():
            given = raw.get(section)
            if given is None and section != "sweep":
                raw[section] = dict(defaults)
            elif isinstance(given, Mapping):
                raw[section] = {**defaults, **given}
        return raw

    @model_validator(mode="after")
    def _fits_objective(self) -> PipelineConfig:
        objective = self.objective
        train = self.train
        own = tuple(self.evaluation.metrics)  # the user's metrics, by name
        wrong = []
        if self.registry.gate_metric not in (*OBJECTIVE_METRICS[objective], *own):
            wrong.append(
                ("registry.gate_metric", self.registry.gate_metric, (*OBJECTIVE_METRICS[objective], *own))
            )
        if (
            train.loss is not None
            and train.user_loss is None
            and train.loss not in OBJECTIVE_LOSSES[objective]
        ):
            wrong.append(("train.loss", train.loss, OBJECTIVE_LOSSES[objective]))
        # A loop of the user's own ranks its checkpoints by any metric it reports.
        epoch_metrics = [] if train.loop else [("checkpoint.metric", self.checkpoint.metric)]
        if train.early_stopping is not None:
            epoch_metrics.append(("train.early_stopping.metric", train.early_stopping.metric))
        valid = (*EPOCH_METRICS[objective], *(f"val_{name}" for name in own))
        wrong += [(f, m, valid) for f, m in epoch_metrics if m not in valid]
        if self.sweep is not None and self.sweep.metric not in EPOCH_METRICS[objective]:
            wrong.append(("sweep.metric", self.sweep.metric, EPOCH_METRICS[objective]))
        if wrong:
            field, value, valid = wrong[0]
            raise ValueError(
                f"{field}: {value} does not measure a {objective}; use one of {', '.join(valid)}"
            )
        if objective == "regression":
            for field in ("label_smoothing", "class_weights"):
                if field in train.model_fields_set and getattr(train, field):
                    raise ValueError(f"train.{field} applies to classification, not to a regression")
            if self.data.classes is not None:
                raise ValueError("data.classes: a regression's label is a number, not one of classes")
        return self

    @model_validator(mode="after")
    def _hf_settings_fit(self) -> PipelineConfig:
        tokenizer = self.preprocess.tokenizer
        if tokenizer is not None and tokenizer.name is None and self.model.family != "hf":
            raise ValueError(
                "preprocess.tokenizer.name: null takes the tokenizer of an hf: model.kind; "
                f"{self.model.kind} has none, so name one (a model id or folder)"
            )
        if self.train.lora is not None and self.model.family != "hf":
            raise ValueError(f"train.lora adapts an hf: model.kind, not {self.model.kind}")
        return self

    @model_validator(mode="after")
    def _own_loss_and_metrics_fit(self) -> PipelineConfig:
        """train.loss_args go with a loss of the user's own, label_smoothing and class_weights
        with the built-in cross_entropy; a checkpoint or early stopping ranked by val_<name>
        ranks in the direction of that metric's mode."""
        train = self.train
        if train.loss_args and train.user_loss is None:
            raise ValueError(
                f"train.loss_args are for a loss of your own (train.loss: package.module:name); "
                f"{self.loss} takes none"
            )
        if train.user_loss is not None:
            for field in ("label_smoothing", "class_weights"):
                if getattr(train, field):
                    raise ValueError(
                        f"train.{field} applies to the built-in cross_entropy, not to train.loss "
                        f"{train.user_loss}; give your loss its own settings in train.loss_args"
                    )
        ranked = [("checkpoint", self.checkpoint.metric, self.checkpoint.mode)]
        if train.early_stopping is not None:
            stop = train.early_stopping
            ranked.append(("train.early_stopping", stop.metric, stop.mode))
        for section, metric, mode in ranked:
            own = self.evaluation.metrics.get(metric.removeprefix("val_"))
            if metric.startswith("val_") and own is not None and own.mode != mode:
                raise ValueError(
                    f"{section}.mode: {mode} ranks {metric} the wrong way; evaluation.metrics."
                    f"{metric.removeprefix('val_')}.mode is {own.mode}: set {section}.mode to {own.mode}"
                )
        return self

    @model_validator(mode="after")
    def _in_process_runs_trainflows_loop(self) -> PipelineConfig:
        """scaling.num_workers 0 runs trainflow's loop on splits held in the flow's memory."""
        if not self.scaling.in_process:
            return self
        if self.train.loop is not None:
            raise ValueError(
                f"scaling.num_workers 0 trains trainflow's own loop in the flow's process; train.loop "
                f"{self.train.loop} runs on Ray Train workers: give num_workers 1 or more"
            )
        if self.train.in_memory == "never":
            raise ValueError(
                "train.in_memory never streams the splits to Ray Train workers, and scaling.num_workers "
                "0 has none: the flow's process reads them into memory; use auto or always, or give "
                "num_workers 1 or more"
            )
        return self

    @model_validator(mode="after")
    def _loop_replaces_trainflows(self) -> PipelineConfig:
        """Beside train.loop, the train fields that only trainflow's loop reads keep their
        defaults: the user's loop would never read them. train.loop_config goes with a loop."""
        train = self.train
        if train.loop is None:
            if train.loop_config:
                raise ValueError("train.loop_config: settings for train.loop, which is not set")
            return self
        if self.checkpoint.every_n_steps is not None:
            raise ValueError(
                f"checkpoint.every_n_steps: trainflow's own loop saves mid-epoch, and train.loop "
                f"{train.loop} replaces that loop; report checkpoints from your loop as often as it needs"
            )
        applies = (*LOOP_SETTINGS, "loop", "loop_config")
        for name, field in TrainConfig.model_fields.items():
            if name not in applies and getattr(train, name) != field.get_default(call_default_factory=True):
                raise ValueError(
                    f"train.{name}: trainflow's own loop reads it, and train.loop {train.loop} replaces "
                    f"that loop; leave it out, and give your loop its settings in train.loop_config"
                )
        return self

    def lower_is_better(self, metric: str) -> bool:
        """Whether a lower ``metric`` (a test metric: built-in, or a name of
        evaluation.metrics) is the better: rmse, mae, and the user's of mode min."""
        own = self.evaluation.metrics.get(metric)
        return own.mode == "min" if own is not None else metric in LOWER_IS_BETTER

    @property
    def loss(self) -> str:
        """The loss training uses: train.loss, or the objective's default."""
        return self.train.loss or OBJECTIVE_LOSSES[self.objective][0]

    def config_hash(self) -> str:
        """A stable short hash of the canonical JSON of the whole config: registered models
        carry it, and ``--resume`` continues only a run of the same hash."""
        data = _as_hashed(self.model_dump(mode="json"))
        for section in OPTIONAL_SECTIONS:
            if data[section] is None:
                # A config without the section leaves the key out, so that it hashes the
                # same as a config of a release without it.
                del data[section]
        _drop_unset(data)
        # Where prepared splits are kept, and how long a crashed run may hold the gate up,
        # change no result: a config hashes the same whatever they are.
        del data["cache"]
        del data["registry"]["lease_s"]
        return _short_hash(data)

    def preparation_hash(self) -> str:
        """A stable short hash of the sections that decide how data is prepared (``data``,
        ``preprocess``, ``objective``): two configs of the same hash prepare the same input the
        same way, so a step tells by it whether prepared data was made by this config."""
        data = _as_hashed(self.model_dump(mode="json", include={"data", "preprocess", "objective"}))
        _drop_unset(data)
        return _short_hash(data)


def _as_hashed(data: dict[str, Any]) -> dict[str, Any]:
    """A config's JSON with ``objective`` spelled by its old name, ``task``: hashed so, a
    config hashes as it did before the rename, and the versions registered, the runs to
    resume and the preparations made under the old name are still found by their hash."""
    data[OLD_KEY] = data.pop("objective")
    return data


def _drop_unset(data: dict) -> None:
    """Leave out of a config's JSON each field of :data:`HASHED_WHEN_SET` that holds its
    empty default and each of :data:`HASHED_UNLESS_DEFAULT` that holds its default, where
    the config has it."""
    unset = [(path, (None, {})) for path in HASHED_WHEN_SET]
    unset += [(path, (default,)) for path, default in HASHED_UNLESS_DEFAULT.items()]
    for (*parents, field), defaults in unset:
        holder = data
        for key in parents:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and field in holder and holder[field] in defaults:
            del holder[field]


def _short_hash(data: dict[str, Any]) -> str:
    """The first 12 hex digits of the SHA-256 of ``data``'s canonical JSON."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def validate_config(raw: Mapping[str, Any]) -> PipelineConfig:
    """``raw`` as a PipelineConfig, or a ConfigError naming every field it gets wrong."""
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(validation_message(e, PipelineConfig)) from None
