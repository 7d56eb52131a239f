"""The sections of a run's config, each a typed pydantic model with its defaults.

Every section refuses unknown keys and checks values assigned after construction too.
The defaults are the bundled digits job; ``configs/digits.yaml`` spells them out.
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from trainflow.config.task import BUILTIN_LOSSES, BUILTIN_METRIC_NAMES, LOWER_IS_BETTER


class Section(BaseModel):
    """A part of the config: unknown keys are refused, and so are wrong values set later."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def section_type(annotation: Any) -> type[BaseModel] | None:
    """The section class behind a field's annotation: ``EarlyStoppingConfig | None`` gives
    EarlyStoppingConfig, ``dict[str, Dimension]`` its values' Dimension; None for a value."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


class SplitConfig(Section):
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


class DataConfig(Section):
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


class PreprocessConfig(Section):
    # Numeric features, fitted on the train split: standard (mean 0, std 1), minmax
    # (into [0, 1]) or none.
    scaler: Literal["standard", "minmax", "none"] = "standard"
    # Images (image folders, torchvision datasets): [height, width] every image is
    # resized to; None: the size of the input's first image.
    image_size: list[int] | None = None
    # Images: a random crop (4-pixel padding at 32 px) and horizontal flip of the
    # train split, drawn anew every epoch; evaluation and prediction never augment.
    augment: bool = False
    # A function of your own, package.module:name, fn(batch: pandas.DataFrame) ->
    # pandas.DataFrame, applied to every batch of a table's rows before the row checks,
    # the split and the fit: one row out per row in, holding the label column. Its output
    # columns are the data's: numbers, categories, or fixed-length numeric arrays (token
    # ids, embeddings). Saved with the model, so prediction takes the raw columns it takes.
    transform: str | None = None

    @field_validator("image_size")
    @classmethod
    def _height_width(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) != 2 or min(v) < 1):
            raise ValueError(f"must be [height, width] of positive integers, got {v}")
        return v

    @field_validator("transform")
    @classmethod
    def _transform_path(cls, v: str | None) -> str | None:
        return v if v is None else hook_path(v)

    def hooks(self) -> dict[str, str]:
        """The user's callables this section names, by field."""
        return {"preprocess.transform": self.transform} if self.transform else {}


# model.kind: mlp, cnn, torchvision:<architecture> or package.module:callable.
MODEL_KIND = re.compile(r"mlp|cnn|torchvision:[A-Za-z_]\w*|[A-Za-z_][\w.]*:[A-Za-z_]\w*")
# A user's callable: package.module:name.
HOOK = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
# What train.loop's config dict holds besides loop_config's keys: these train.* settings,
# which trainflow's loop reads too, and the run's whole config under LOOP_RESERVED.
LOOP_SETTINGS = ("epochs", "batch_size", "lr", "seed")
LOOP_RESERVED = "trainflow"


def hook_path(v: str) -> str:
    """``v`` when it names a callable as ``package.module:name``; else ValueError saying so."""
    if not HOOK.fullmatch(v):
        raise ValueError(f"{v!r} is not package.module:name (such as mycode.losses:focal)")
    return v


def user_module_of(kind: str) -> str | None:
    """The module of a ``package.module:callable`` model kind (a user's model); None for
    trainflow's own kinds and torchvision's."""
    if kind in ("mlp", "cnn") or kind.startswith("torchvision:"):
        return None
    return kind.partition(":")[0]


class ModelConfig(Section):
    # mlp | cnn | torchvision:<architecture>, a classification builder of torchvision.models
    # (torchvision:resnet18) | package.module:callable, a model of your own, called in each
    # worker as callable(input_shape=[c, h, w] or [num_features], num_outputs=..., **args)
    # and given one flat tensor per batch; or, when it takes a parameter named inputs, as
    # callable(inputs={column: shape}, num_outputs=..., **args) and given a dict of tensors
    # by column (features, and each array column of a preprocess.transform's output).
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

    def hooks(self) -> dict[str, str]:
        """The user's callables this section names, by field."""
        return {"model.kind": self.kind} if self.user_module else {}


class EarlyStoppingConfig(Section):
    # Stop when `metric` has not improved by more than `min_delta` for `patience` epochs:
    # val_accuracy, val_loss, train_loss, or val_<name> of a metric in evaluation.metrics.
    # The metric is the same figure on every worker (over the whole val split), so all stop together.
    metric: str = "val_loss"
    mode: Literal["max", "min"] = "min"
    patience: int = Field(3, ge=1)
    min_delta: float = Field(0.0, ge=0.0)


class TrainConfig(Section):
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
    # The loss: cross_entropy for classification; mse, l1 or huber for regression; or
    # package.module:name, a loss of your own: a function (outputs, targets) -> scalar
    # tensor, or an nn.Module class built with loss_args, called the same way. outputs are
    # the model's [N, classes] logits and targets class indices (int64); for a regression,
    # both are [N] floats, the label standardized as training sees it.
    # None: the task's first (cross_entropy, or mse).
    loss: str | None = None
    # Keyword arguments for a loss of your own: its class's (FocalLoss(**loss_args)), or
    # passed to its function on every call.
    loss_args: dict[str, Any] = {}
    # Classification with the built-in cross_entropy: the target's share spread over the
    # other classes (its label_smoothing), and class weights in the loss; "balanced" weighs
    # each class by rows / (classes * its rows in the train split), for imbalanced data.
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    class_weights: Literal["balanced"] | None = None
    # Read each worker's shards once, straight from the prepared Parquet, and keep them in
    # memory instead of streaming them from Ray Data every epoch. "auto" decides per
    # split: each one whose prepared Parquet is under 1 GB per worker (so a large train
    # split streams while a small val split stays in memory). "always" keeps both; "never"
    # streams both, for workers whose memory cannot spare them. An augmented train split
    # draws new crops and flips each epoch either way.
    in_memory: Literal["auto", "always", "never"] = "auto"
    # A training function of your own, package.module:name, run on every Ray Train worker
    # as fn(config) in place of trainflow's loop, as Ray Train runs a train_func: it reads
    # the prepared splits with ray.train.get_dataset_shard("train") and ("val"), and
    # reports checkpoints holding model.pt, the state dict of the model model.kind builds.
    # config holds epochs, batch_size, lr and seed (the fields above), loop_config's keys,
    # and under "trainflow" the run's whole config with "model_spec". The fields above
    # that only trainflow's loop reads keep their defaults beside it. None: trainflow's loop.
    loop: str | None = None
    # Your loop's own settings: keys of its config dict, as given (plain JSON).
    loop_config: dict[str, Any] = {}

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_as_text(cls, v: Any) -> Any:
        # YAML reads `precision: 32` as a number.
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("loss")
    @classmethod
    def _loss_form(cls, v: str | None) -> str | None:
        if v is None or v in BUILTIN_LOSSES:
            return v
        if not HOOK.fullmatch(v):
            raise ValueError(
                f"must be {', '.join(BUILTIN_LOSSES)} or package.module:name of your own "
                f"(mycode.losses:FocalLoss), got {v!r}"
            )
        return v

    @property
    def user_loss(self) -> str | None:
        """train.loss when it names a loss of the user's own (package.module:name)."""
        return self.loss if self.loss is not None and self.loss not in BUILTIN_LOSSES else None

    @field_validator("loop")
    @classmethod
    def _loop_path(cls, v: str | None) -> str | None:
        return v if v is None else hook_path(v)

    @field_validator("loop_config")
    @classmethod
    def _loop_config_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        taken = [key for key in v if key in (*LOOP_SETTINGS, LOOP_RESERVED)]
        if taken:
            raise ValueError(
                f"{taken[0]} is a key trainflow gives the loop ({', '.join(LOOP_SETTINGS)} from "
                f"train.*, {LOOP_RESERVED}: the run's config); set train.{taken[0]} or use another name"
                if taken[0] != LOOP_RESERVED
                else f"{LOOP_RESERVED} is the key of the run's config in the loop's; use another name"
            )
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"must be plain JSON (numbers, strings, lists, dicts): {e}") from None
        return v

    def hooks(self) -> dict[str, str]:
        """The user's callables this section names, by field."""
        found = {"train.loss": self.user_loss} if self.user_loss else {}
        if self.loop:
            found["train.loop"] = self.loop
        return found

    @field_validator("callbacks")
    @classmethod
    def _import_paths(cls, v: list[str]) -> list[str]:
        for path in v:
            if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", path):
                raise ValueError(f"{path!r} is not an import path such as 'mypackage.hooks:on_epoch'")
        return v


class ScalingSection(Section):
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


class CheckpointSection(Section):
    keep: int = Field(2, ge=1)
    # The epoch metric that ranks checkpoints (the best is evaluated and registered):
    # val_accuracy, val_loss, train_loss, or val_<name> of a metric in evaluation.metrics.
    metric: str = "val_accuracy"
    mode: Literal["max", "min"] = "max"


class FailureSection(Section):
    max_failures: int = Field(1, ge=-1)  # -1: retry without end


class MetricConfig(Section):
    # package.module:name, called as fn(targets, outputs) -> float (see EvaluationConfig.metrics).
    fn: str
    # The better direction: max (accuracy-like) or min (error-like).
    mode: Literal["max", "min"]

    @field_validator("fn")
    @classmethod
    def _callable_path(cls, v: str) -> str:
        return hook_path(v)


class EvaluationConfig(Section):
    batch_size: int = Field(512, ge=1)
    # Actors in the map_batches pool; each loads the model once.
    concurrency: int = Field(1, ge=1)
    # A test split of at most this many rows is predicted in the driver instead: an
    # actor pool costs seconds to start, more than predicting a small split takes.
    # 0: always the actor pool.
    in_driver_max_rows: int = Field(100_000, ge=0)
    # Metrics of your own, by name: {top2: {fn: mycode.metrics:top2, mode: max}}. Each fn
    # is called as fn(targets, outputs) -> float on NumPy arrays: targets hold class
    # indices and outputs a classifier's softmax probabilities [N, classes]; for a
    # regression both are [N] floats in the label's units. Scored on the test split beside
    # the built-in metrics (logged as test_<name>, a possible registry.gate_metric) and on
    # the whole validation split each epoch as val_<name> (a possible checkpoint.metric
    # and early stopping metric). mode: the better direction, max or min.
    metrics: dict[str, MetricConfig] = {}

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
    # A test metric of the run's task: accuracy, macro_f1, weighted_f1 (classification);
    # rmse (a regression's default), mae, r2; or a name of evaluation.metrics (its mode
    # says which way is better).
    gate_metric: str = "accuracy"
    # The champion alias moves when the new model beats the champion by min_improvement
    # (lower by it, for rmse, mae and a metric of mode min) and clears min_value: a floor,
    # or for those a ceiling. None: no bound (a regression's default).
    min_improvement: float = 0.0
    min_value: float | None = 0.9

    @property
    def lower_is_better(self) -> bool:
        """For a built-in gate_metric; PipelineConfig.lower_is_better knows the user's metrics too."""
        return self.gate_metric in LOWER_IS_BETTER


class RayConfig(Section):
    # A running cluster ("ray://host:10001" or "host:6379"); None: RAY_ADDRESS, else a
    # local cluster started for the run.
    address: str | None = None
