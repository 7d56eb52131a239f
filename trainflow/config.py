"""The config schema: one typed place for every setting of a training run.

A config arrives as a dict (a deployment's parameters, Python), a YAML or JSON file,
plus dotted overrides from the command line (``train.lr=0.01``). Unknown keys and
wrong types are refused with a :class:`ConfigError` that names the dotted field.
The defaults below are the bundled digits job; ``configs/digits.yaml`` spells them out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)


class ConfigError(ValueError):
    """A config that cannot run; the message names the field and what would be valid."""


# What a run learns to predict: a class (its label holds categories) or a number.
TASKS = ("classification", "regression")
# The test metrics each task is measured and gated on, and the direction that is better.
TASK_METRICS = {
    "classification": ("accuracy", "macro_f1", "weighted_f1"),
    "regression": ("rmse", "mae", "r2"),
}
LOWER_IS_BETTER = ("rmse", "mae")
# The losses each task trains with; the first is its default.
TASK_LOSSES = {"classification": ("cross_entropy",), "regression": ("mse", "l1", "huber")}
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


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SplitConfig(_Section):
    val: float = Field(0.1, ge=0.0, lt=1.0)
    test: float = Field(0.2, gt=0.0, lt=1.0)
    seed: int = 0
    stratify: bool = True

    @model_validator(mode="after")
    def _leaves_training_rows(self) -> SplitConfig:
        if self.val + self.test >= 1.0:
            raise ValueError(
                f"val + test must be below 1 so rows remain for training, got {self.val + self.test}"
            )
        return self


class DataConfig(_Section):
    # A Parquet, CSV, JSON lines or NumPy (.npy/.npz) file, folder or glob, as a local
    # path or a URI (file://, s3://, gs://, ...); an image folder (root/<class>/*.png);
    # torchvision:MNIST | torchvision:FashionMNIST | torchvision:CIFAR10; builtin:digits,
    # builtin:diabetes (a regression: its label_column is target).
    source: str = "builtin:digits"
    # auto: from the files' suffixes (a folder of class folders of images is "images").
    format: Literal["auto", "parquet", "csv", "json", "numpy", "images"] = "auto"
    label_column: str = "label"
    # None: every column but the label is a feature.
    feature_columns: list[str] | None = None
    # Features holding categories (strings, or integers that are codes): one-hot encoded
    # with a vocabulary fitted on the train split.
    categorical_columns: list[str] = []
    # The label's classes, in the model's output order; None: the sorted labels found.
    # A label outside a declared list is an error.
    classes: list[int | str] | None = None
    # Rows with a null or NaN feature or label: fail, or drop them (counted and logged).
    missing: Literal["fail", "drop"] = "fail"
    # How images are read: RGB (3 channels) or L (grayscale, 1 channel); None: the
    # source's own (RGB for image folders; L for MNIST and FashionMNIST, RGB for CIFAR10).
    image_mode: Literal["RGB", "L"] | None = None
    # Read only the first N rows (smoke runs, quick trials); None reads everything.
    limit: int | None = Field(None, ge=1)
    split: SplitConfig = SplitConfig()

    @model_validator(mode="after")
    def _categorical_are_features(self) -> DataConfig:
        if self.label_column in self.categorical_columns:
            raise ValueError(f"categorical_columns must not hold the label column {self.label_column!r}")
        if self.feature_columns is not None:
            outside = [c for c in self.categorical_columns if c not in self.feature_columns]
            if outside:
                raise ValueError(f"categorical_columns {outside} are not in feature_columns")
        if self.classes is not None and len(set(map(str, self.classes))) != len(self.classes):
            raise ValueError(f"classes must be distinct, got {self.classes}")
        return self


class PreprocessConfig(_Section):
    # Numeric features, fitted on the train split: standard (mean 0, std 1), minmax
    # (into [0, 1]) or none.
    scaler: Literal["standard", "minmax", "none"] = "standard"
    # Images (image folders, torchvision datasets): [height, width] every image is
    # resized to; None: the size of the input's first image.
    image_size: list[int] | None = None
    # Images: a random crop (4-pixel padding at 32 px) and horizontal flip of the
    # train split, drawn anew every epoch; evaluation and prediction never augment.
    augment: bool = False

    @field_validator("image_size")
    @classmethod
    def _height_width(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) != 2 or min(v) < 1):
            raise ValueError(f"must be [height, width] of positive integers, got {v}")
        return v


# model.kind: mlp, cnn, torchvision:<architecture> or package.module:callable.
MODEL_KIND = re.compile(r"mlp|cnn|torchvision:[A-Za-z_]\w*|[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def user_module_of(kind: str) -> str | None:
    """The module of a ``package.module:callable`` model kind (a user's model); None for
    trainflow's own kinds and torchvision's."""
    if kind in ("mlp", "cnn") or kind.startswith("torchvision:"):
        return None
    return kind.partition(":")[0]


class ModelConfig(_Section):
    # mlp | cnn | torchvision:<architecture>, a classification builder of torchvision.models
    # (torchvision:resnet18) | package.module:callable, a model of your own, called in each
    # worker as callable(input_shape=[c, h, w] or [num_features], num_outputs=..., **args).
    kind: str = "cnn"
    hidden_sizes: list[int] = [128]
    channels: list[int] = [32, 64]
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    # [channels, height, width] of image-shaped features for the cnn; None infers a
    # single-channel square image from the number of features (64 -> [1, 8, 8]).
    image_shape: list[int] | None = None
    # Keyword arguments for a torchvision builder (image_size for a ViT) or your callable.
    args: dict[str, Any] = {}
    # Initial weights: None (random), a torchvision weights name (ResNet18_Weights.DEFAULT,
    # read from torch's hub cache) or a state dict file. A head of another size than the
    # data's outputs starts anew; a first convolution of other channels is adapted.
    weights: str | None = None
    # Parameter name prefixes kept frozen while the rest trains (conv1, layer1).
    freeze: list[str] = []

    @field_validator("hidden_sizes", "channels", "image_shape")
    @classmethod
    def _positive(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(n < 1 for n in v):
            raise ValueError(f"every size must be a positive integer, got {v}")
        return v

    @field_validator("kind")
    @classmethod
    def _known_form(cls, v: str) -> str:
        if not MODEL_KIND.fullmatch(v):
            raise ValueError(
                "must be mlp, cnn, torchvision:<architecture> (torchvision:resnet18) or "
                "package.module:callable (mymodels.net:build)"
            )
        return v

    @field_validator("args")
    @classmethod
    def _args_need_a_builder(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        kind = info.data.get("kind")
        if v and kind in ("mlp", "cnn"):
            raise ValueError(
                f"args are for torchvision and your own models; {kind} takes hidden_sizes, "
                "channels, dropout and image_shape"
            )
        return v

    @property
    def user_module(self) -> str | None:
        """The module of a ``package.module:callable`` kind; None for the others."""
        return user_module_of(self.kind)


class EarlyStoppingConfig(_Section):
    # Stop when `metric` has not improved by more than `min_delta` for `patience` epochs.
    # The metric is the same all-reduced figure on every worker, so all stop together.
    metric: Literal["val_accuracy", "val_loss", "train_loss"] = "val_loss"
    mode: Literal["max", "min"] = "min"
    patience: int = Field(3, ge=1)
    min_delta: float = Field(0.0, ge=0.0)


class TrainConfig(_Section):
    epochs: int = Field(20, ge=1)
    batch_size: int = Field(64, ge=1)  # per worker
    lr: float = Field(1e-3, gt=0.0)
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    momentum: float = Field(0.9, ge=0.0, lt=1.0)  # sgd only
    weight_decay: float = Field(0.0, ge=0.0)
    # Learning-rate schedule, stepped once per epoch after `warmup_epochs` of linear
    # warm-up: none (constant), cosine (to 0 at the last epoch), or step (times `gamma`
    # every `step_size` epochs).
    scheduler: Literal["none", "cosine", "step"] = "none"
    warmup_epochs: int = Field(0, ge=0)
    step_size: int = Field(10, ge=1)
    gamma: float = Field(0.1, gt=0.0, le=1.0)
    # Clip the global gradient norm to this value; None: no clipping.
    grad_clip_norm: float | None = Field(None, gt=0.0)
    # "32": full precision. "bf16-mixed" / "16-mixed": torch.autocast in bfloat16 /
    # float16 (fp16 with a gradient scaler); bf16 also runs on CPUs.
    precision: Literal["32", "bf16-mixed", "16-mixed"] = "32"
    seed: int = 0
    # Deterministic algorithms on every worker (ray.train.torch.enable_reproducibility):
    # the same config gives the same weights, at some cost in speed on GPUs.
    deterministic: bool = False
    early_stopping: EarlyStoppingConfig | None = None
    # Log the running train loss every N optimizer steps (rank 0) as well as per epoch.
    log_every_n_steps: int | None = Field(None, ge=1)
    # Import paths ("package.module:function") called on every worker after each epoch
    # with (epoch, metrics, rank): custom logging, fault drills, extra stopping rules.
    callbacks: list[str] = []
    # The loss: cross_entropy for classification; mse, l1 or huber for regression.
    # None: the task's first (cross_entropy, or mse).
    loss: Literal["cross_entropy", "mse", "l1", "huber"] | None = None
    # Classification: the target's share spread over the other classes (cross_entropy's
    # label_smoothing), and class weights in the loss; "balanced" weighs each class by
    # rows / (classes * its rows in the train split), for imbalanced data.
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    class_weights: Literal["balanced"] | None = None
    # Read each worker's shards once, straight from the prepared Parquet, and keep them in
    # memory instead of streaming them from Ray Data every epoch. "auto" decides per
    # split: each one whose prepared Parquet is under 1 GB per worker (so a large train
    # split streams while a small val split stays in memory). "always" keeps both; "never"
    # streams both, for workers whose memory cannot spare them. An augmented train split
    # draws new crops and flips each epoch either way.
    in_memory: Literal["auto", "always", "never"] = "auto"

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_as_text(cls, v: Any) -> Any:
        # YAML reads `precision: 32` as a number.
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("callbacks")
    @classmethod
    def _import_paths(cls, v: list[str]) -> list[str]:
        for path in v:
            if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", path):
                raise ValueError(f"{path!r} is not an import path such as 'mypackage.hooks:on_epoch'")
        return v


class ScalingSection(_Section):
    num_workers: int = Field(2, ge=1)
    use_gpu: bool = False
    # Half a CPU per worker: two workers on a 2-core machine leave a core for Ray Data.
    resources_per_worker: dict[str, float] = {"CPU": 0.5}
    # How Ray places the workers on nodes: PACK fills a node first, SPREAD spreads them.
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    # When the workers and Ray Data's CPU do not fit: "fail" at once with what would
    # fit, or "shrink" each worker's CPU to fit (logged as a warning).
    on_cpu_shortage: Literal["fail", "shrink"] = "fail"
    # On an autoscaling cluster, wait up to this many seconds for the resources to
    # appear before failing; 0 checks once.
    wait_for_resources_s: float = Field(0.0, ge=0.0)


class CheckpointSection(_Section):
    keep: int = Field(2, ge=1)
    metric: Literal["val_accuracy", "val_loss", "train_loss"] = "val_accuracy"
    mode: Literal["max", "min"] = "max"


class FailureSection(_Section):
    max_failures: int = Field(1, ge=-1)  # -1: retry without end


class EvaluationConfig(_Section):
    batch_size: int = Field(512, ge=1)
    # Actors in the map_batches pool; each loads the model once.
    concurrency: int = Field(1, ge=1)
    # A test split of at most this many rows is predicted in the driver instead: an
    # actor pool costs seconds to start, more than predicting a small split takes.
    # 0: always the actor pool.
    in_driver_max_rows: int = Field(100_000, ge=0)


class RegistryConfig(_Section):
    # A test metric of the run's task: accuracy, macro_f1, weighted_f1 (classification);
    # rmse (a regression's default), mae, r2.
    gate_metric: Literal["accuracy", "macro_f1", "weighted_f1", "rmse", "mae", "r2"] = "accuracy"
    # The champion alias moves when the new model beats the champion by min_improvement
    # (lower by it, for rmse and mae) and clears min_value: a floor, or for rmse and mae a
    # ceiling. None: no bound (a regression's default).
    min_improvement: float = 0.0
    min_value: float | None = 0.9

    @property
    def lower_is_better(self) -> bool:
        return self.gate_metric in LOWER_IS_BETTER


class RayConfig(_Section):
    # A running cluster ("ray://host:10001" or "host:6379"); None: RAY_ADDRESS, else a
    # local cluster started for the run.
    address: str | None = None


# The kinds of search dimension, as Ray Tune names them. Bounds are [low, high]; randint's
# high is exclusive, as in Ray Tune and NumPy. grid runs every value (in every sample).
DIMENSION_KINDS = ("choice", "grid", "uniform", "loguniform", "randint")
# Only these sections vary between trials: the data is ingested and prepared once per sweep,
# and every trial runs on the same resources so that concurrency can be planned.
SWEEPABLE_SECTIONS = ("model", "train")


class Dimension(_Section):
    """One axis of the search space: exactly one of its fields is set."""

    choice: list[Any] | None = Field(None, min_length=1)
    grid: list[Any] | None = Field(None, min_length=1)
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None

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


class SweepScheduler(_Section):
    # asha: stop trials whose metric trails the others' at the same epoch; fifo: run all to the end.
    kind: Literal["asha", "fifo"] = "asha"
    # ASHA: every trial trains at least this many epochs before it may be stopped...
    grace_period: int = Field(1, ge=1)
    # ... and at each rung only the best 1/reduction_factor of the trials go on.
    reduction_factor: float = Field(2.0, gt=1.0)


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


class SweepConfig(_Section):
    # Dotted fields of the model and train sections, each with its dimension:
    # {"train.lr": {loguniform: [0.0001, 0.1]}, "model.hidden_sizes": {choice: [[32], [128]]}}
    space: dict[str, Dimension] = Field(..., min_length=1)
    # Samples drawn from the space; with grid dimensions, each sample runs the whole grid.
    trials: int = Field(8, ge=1)
    # None: as many trials at once as the cluster fits (preflight computes it).
    max_concurrent: int | None = Field(None, ge=1)
    scheduler: SweepScheduler = SweepScheduler()
    metric: Literal["val_accuracy", "val_loss", "train_loss"] = "val_accuracy"
    mode: Literal["max", "min"] = "max"
    seed: int = 0  # draws the samples: the same seed draws the same trials
    # Each trial's resources: one worker by default, so that several trials run at once.
    scaling: ScalingSection = ScalingSection(num_workers=1)

    @field_validator("space", mode="before")
    @classmethod
    def _dotted(cls, v: Any) -> Any:
        return _flatten_space(v)

    @model_validator(mode="after")
    def _metric_matches_mode(self) -> SweepConfig:
        expected = "min" if self.metric.endswith("loss") else "max"
        if self.mode != expected:
            raise ValueError(f"metric {self.metric} is best at its {expected}imum: set mode to {expected}")
        return self


# The URI schemes of pyarrow's filesystems, which every trainflow process reads and
# writes the cache through.
CACHE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs", "file")


class PipelineConfig(_Section):
    name: str = Field("digits", description="The registered model's name.")
    # classification: the label holds classes; regression: a number to predict.
    task: Literal["classification", "regression"] = "classification"
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
    # Ray Train storage for runs; None: TRAINFLOW_HOME/runs. Use s3://... or a shared
    # filesystem when the Ray cluster has more than one node.
    storage: str | None = None
    # The prepared-split cache; None: TRAINFLOW_HOME/cache. Every node of a Ray cluster
    # reads and writes it: on several nodes, a folder they all mount at this path, or a
    # URI like storage's (s3://bucket/cache, gs://..., abfs://..., hdfs://...).
    cache: str | None = None
    # A hyperparameter sweep (`trainflow sweep`); `trainflow run` trains one model and ignores it.
    sweep: SweepConfig | None = None

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
    def _task_defaults(cls, raw: Any) -> Any:
        """A regression's sections start from REGRESSION_DEFAULTS; what the config sets wins."""
        if not isinstance(raw, Mapping) or raw.get("task") != "regression":
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
    def _fits_task(self) -> PipelineConfig:
        task, train = self.task, self.train
        wrong = []
        if self.registry.gate_metric not in TASK_METRICS[task]:
            wrong.append(("registry.gate_metric", self.registry.gate_metric, TASK_METRICS[task]))
        if train.loss is not None and train.loss not in TASK_LOSSES[task]:
            wrong.append(("train.loss", train.loss, TASK_LOSSES[task]))
        epoch_metrics = [("checkpoint.metric", self.checkpoint.metric)]
        if train.early_stopping is not None:
            epoch_metrics.append(("train.early_stopping.metric", train.early_stopping.metric))
        if self.sweep is not None:
            epoch_metrics.append(("sweep.metric", self.sweep.metric))
        wrong += [(f, m, EPOCH_METRICS[task]) for f, m in epoch_metrics if m not in EPOCH_METRICS[task]]
        if wrong:
            field, value, valid = wrong[0]
            raise ValueError(f"{field}: {value} does not measure a {task}; use one of {', '.join(valid)}")
        if task == "regression":
            for field in ("label_smoothing", "class_weights"):
                if field in train.model_fields_set and getattr(train, field):
                    raise ValueError(f"train.{field} applies to classification, not to a regression")
            if self.data.classes is not None:
                raise ValueError("data.classes: a regression's label is a number, not one of classes")
        return self

    @property
    def loss(self) -> str:
        """The loss training uses: train.loss, or the task's default."""
        return self.train.loss or TASK_LOSSES[self.task][0]

    def config_hash(self) -> str:
        """A stable short hash of the canonical JSON of the whole config."""
        data = self.model_dump(mode="json")
        if data["sweep"] is None:
            # A config without a sweep hashes as it did before sweeps existed.
            del data["sweep"]
        # Where prepared splits are kept changes no result: a config hashes the same wherever
        # its cache is (and as it did before the field existed).
        del data["cache"]
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


# What `--smoke` changes: a small sample, one epoch, one worker, and its own registered
# model, so that checking a new config end to end never touches the real champion.
SMOKE_OVERRIDES = {
    "data": {"limit": 600},
    "train": {"epochs": 1},
    "scaling": {"num_workers": 1},
    "registry": {"min_value": None},
}


def smoke_config(config: PipelineConfig) -> PipelineConfig:
    """The config as a smoke run: validates everything, trains in well under a minute."""
    raw = _merge(config.model_dump(mode="json"), SMOKE_OVERRIDES)
    raw["name"] = f"{config.name}-smoke"
    return PipelineConfig.model_validate(raw)


def _format_validation_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            parent = e["loc"][:-1]
            model: type[BaseModel] = PipelineConfig
            for p in parent:
                model = model.model_fields[str(p)].annotation  # type: ignore[assignment]
            known = ", ".join(model.model_fields) if isinstance(model, type) else ""
            msg = f"unknown key; valid keys here: {known}"
        elif not e["loc"]:  # a rule across sections: the message names its fields
            parts.append(msg)
            continue
        elif "input" in e and not isinstance(e["input"], (dict, list)) and repr(e["input"]) not in msg:
            msg = f"{msg} (got {e['input']!r})"
        parts.append(f"{field}: {msg}")
    return "invalid config: " + "; ".join(parts)


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn ``["train.lr=0.01", "scaling.num_workers=1"]`` into a nested dict.

    Values are read as YAML, so ``0.01`` is a float, ``true`` a bool, ``null`` None and
    ``[1, 8, 8]`` a list.
    """
    nested: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE such as train.lr=0.01")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {key}: cannot read value {raw!r}: {e}") from None
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is set twice")
            node = child
        node[parts[-1]] = value
    return nested


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path}: no such file")
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"config file {path}: not valid {path.suffix.lstrip('.') or 'YAML'}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top, got {type(data).__name__}")
    return data


def load_config(
    source: PipelineConfig | Mapping[str, Any] | str | Path | None = None,
    overrides: Iterable[str] = (),
) -> PipelineConfig:
    """Validate a config from a dict, a YAML/JSON file or the defaults, plus overrides."""
    if isinstance(source, PipelineConfig):
        raw = source.model_dump(mode="json")
    elif isinstance(source, Mapping):
        raw = dict(source)
    elif source is None:
        raw = {}
    else:
        raw = read_config_file(source)
    raw = _merge(raw, parse_overrides(overrides))
    try:
        config = PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e)) from None
    if config.sweep is not None:
        check_sweep_space(config)
    return config


def _nested(path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def _section_type(annotation: Any) -> type[BaseModel] | None:
    """The section class behind a field's annotation (``EarlyStoppingConfig | None``)."""
    import typing

    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def check_sweep_space(config: PipelineConfig) -> None:
    """Every dotted field of ``sweep.space`` exists, may vary between trials, and accepts
    each value a trial can be given (every choice, both bounds); else ConfigError naming it."""
    base = config.model_dump(mode="json")
    for path, dim in config.sweep.space.items():
        field = f"sweep.space.{path}"
        parts = path.split(".")
        section: type[BaseModel] | None = PipelineConfig
        for depth, part in enumerate(parts):
            if section is None:
                raise ConfigError(f"invalid config: {field}: {'.'.join(parts[:depth])} has no fields")
            if part not in section.model_fields:
                where = ".".join(parts[:depth]) or "the config"
                raise ConfigError(
                    f"invalid config: {field}: unknown field; valid keys of {where}: "
                    + ", ".join(section.model_fields)
                )
            section = _section_type(section.model_fields[part].annotation)
        if parts[0] not in SWEEPABLE_SECTIONS:
            raise ConfigError(
                f"invalid config: {field}: only model.* and train.* fields vary between trials "
                "(a sweep prepares the data once, and every trial runs on sweep.scaling)"
            )
        if section is not None:
            raise ConfigError(f"invalid config: {field}: a section; sweep one of its fields instead")
        for value in dim.extremes():
            try:
                PipelineConfig.model_validate(_merge(base, _nested(path, value)))
            except ValidationError as e:
                reason = _format_validation_error(e).removeprefix("invalid config: ")
                if dim.kind in ("uniform", "loguniform") and "integer" in reason:
                    reason += "; integer fields take randint or choice"
                raise ConfigError(
                    f"invalid config: {field}: {dim.kind} value {value!r} does not fit: {reason}"
                ) from None


def trial_config(config: PipelineConfig, params: Mapping[str, Any]) -> PipelineConfig:
    """One trial's config: the base config with the sampled ``params`` ("train.lr": 0.01),
    the sweep's per-trial scaling, checkpoints ranked by the sweep's metric, and no sweep
    section, so that it runs as it is with `trainflow run`."""
    sweep = config.sweep
    raw = config.model_dump(mode="json")
    raw["sweep"] = None
    raw["scaling"] = sweep.scaling.model_dump(mode="json")
    raw["checkpoint"] = {**raw["checkpoint"], "metric": sweep.metric, "mode": sweep.mode}
    for path, value in params.items():
        raw = _merge(raw, _nested(path, value))
    return load_config(raw)
