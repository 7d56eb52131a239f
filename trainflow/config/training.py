"""The model and train sections: the network, and how it trains on the Ray Train workers."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from trainflow.config.objective import BUILTIN_LOSSES
from trainflow.config.sections import HOOK, Section, hook_path

# model.kind: mlp, cnn, torchvision:<architecture> or package.module:callable.
MODEL_KIND = re.compile(r"mlp|cnn|torchvision:[A-Za-z_]\w*|hf:\S+|[A-Za-z_][\w.]*:[A-Za-z_]\w*")
HF = "hf:"
# What train.loop's config dict holds besides loop_config's keys: these train.* settings,
# which trainflow's loop reads too, and the run's whole config under LOOP_RESERVED.
LOOP_SETTINGS = ("epochs", "batch_size", "lr", "seed")
LOOP_RESERVED = "trainflow"


# model.kind's families besides trainflow's own (mlp, cnn) and the user's: each one's
# kinds are its name, a colon and what it names (hf:bert-base-uncased).
PREFIXED_FAMILIES = ("torchvision", "hf")


def kind_family(kind: str) -> str:
    """The family of a model kind: ``own`` (mlp, cnn), ``torchvision``, ``hf`` or ``user``
    (``package.module:callable``), the key of ``pipelines/models/kinds.py``'s table."""
    if kind in ("mlp", "cnn"):
        return "own"
    prefix, _, _ = kind.partition(":")
    return prefix if prefix in PREFIXED_FAMILIES else "user"


def kind_name(kind: str) -> str:
    """What a model kind names within its family: ``resnet18`` for ``torchvision:resnet18``,
    ``bert-base-uncased`` for ``hf:bert-base-uncased``, the kind itself for the others."""
    family = kind_family(kind)
    return kind.removeprefix(f"{family}:") if family in PREFIXED_FAMILIES else kind


def user_module_of(kind: str) -> str | None:
    """The module of a ``package.module:callable`` model kind (a user's model); None for
    trainflow's own kinds, torchvision's and Hugging Face's."""
    return kind.partition(":")[0] if kind_family(kind) == "user" else None


class ModelConfig(Section):
    """The network: trainflow's MLP or small CNN, a torchvision architecture, or a builder of
    your own; its initial weights and the layers kept frozen."""

    kind: str = Field(
        "cnn",
        description="mlp, cnn, torchvision:<architecture> (a classification builder of "
        "torchvision.models, such as torchvision:resnet18), or package.module:callable, a model "
        "of your own: called in each worker as callable(input_shape=[c, h, w] or [num_features], "
        "num_outputs=..., **args) and given one flat tensor per batch; or, when it takes a "
        "parameter named inputs, as callable(inputs={column: shape}, num_outputs=..., **args) "
        "and given a dict of tensors by column (features, and each array column of a "
        "preprocess.transform's output).",
    )
    hidden_sizes: list[int] = Field(
        [128],
        description="mlp and cnn: the width of each hidden linear layer (the cnn's head, after its "
        "convolutions), each followed by a ReLU and dropout.",
    )
    channels: list[int] = Field(
        [32, 64],
        description="cnn: the output channels of each 3x3 convolution, which one 2x2 max pooling "
        "follows before the head.",
    )
    dropout: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="mlp and cnn: the probability of zeroing an activation after each hidden layer "
        "(and before the cnn's head) while training.",
    )
    image_shape: list[int] | None = Field(
        None,
        description="[channels, height, width] that each row's features form, for the cnn, a "
        "torchvision model or your own; null: an image source's own shape, else a single-channel "
        "square image from the number of features (64 -> [1, 8, 8]), or [num_features] for your own.",
    )
    args: dict[str, Any] = Field(
        {},
        description="Keyword arguments for a torchvision builder (image_size for a ViT) or your "
        "callable, or settings of a Hugging Face model's config (classifier_dropout); mlp and cnn "
        "take none.",
    )
    weights: str | None = Field(
        None,
        description="Initial weights: null (random), a torchvision weights name "
        "(ResNet18_Weights.DEFAULT, read from torch's hub cache) or a state dict file. A head of "
        "another size than the data's outputs starts anew; a first convolution of other channels "
        "is adapted.",
    )
    freeze: list[str] = Field(
        [], description="Parameter name prefixes kept frozen while the rest trains (conv1, layer1)."
    )

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
                "must be mlp, cnn, torchvision:<architecture> (torchvision:resnet18), "
                "hf:<model id or folder> (hf:bert-base-uncased) or package.module:callable "
                "(mymodels.net:build)"
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
    def family(self) -> str:
        """``own``, ``torchvision``, ``hf`` or ``user``: the family of :attr:`kind`."""
        return kind_family(self.kind)

    @property
    def user_module(self) -> str | None:
        """The module of a ``package.module:callable`` kind; None for the others."""
        return user_module_of(self.kind)

    def hooks(self) -> dict[str, str]:
        """The user's callables this section names, by field."""
        return {"model.kind": self.kind} if self.user_module else {}


class EarlyStoppingConfig(Section):
    """When training ends before train.epochs: once a metric has stopped improving."""

    metric: str = Field(
        "val_loss",
        description="The epoch metric watched: val_accuracy, val_loss, train_loss, or val_<name> of "
        "a metric in evaluation.metrics. It is the same figure on every worker (over the whole val "
        "split), so all stop together.",
    )
    mode: Literal["max", "min"] = Field(
        "min",
        description="The metric's better direction: min for a loss, max for an accuracy (a metric "
        "of your own: its mode).",
    )
    patience: int = Field(3, ge=1, description="Stop after this many epochs in a row without an improvement.")
    min_delta: float = Field(
        0.0,
        ge=0.0,
        description="The least change in the better direction that counts as an improvement.",
    )


class LoraConfig(Section):
    """A LoRA adapter (PEFT) trained in place of an hf: model's weights: only the adapter and
    the head train."""

    r: int = Field(8, ge=1, description="The rank of each adapter's two matrices.")
    alpha: float = Field(16, gt=0, description="The adapter's scale, alpha / r.")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the adapter's input.")
    target_modules: list[str] | None = Field(
        None, description="The layers adapted, by name; null: PEFT's defaults for the architecture."
    )
    merge: bool = Field(
        False,
        description="Merge the adapter into the base weights wherever the version is loaded (one "
        "plain model, without the adapter's extra steps at prediction); false keeps base and "
        "adapter apart.",
    )


class TrainConfig(Section):
    """How the model trains: epochs, batches, optimizer and schedule, precision, the loss, or a
    training loop of your own."""

    epochs: int = Field(
        20, ge=1, description="Passes over the train split; early stopping may end training sooner."
    )
    batch_size: int = Field(
        64,
        ge=1,
        description="Rows per optimizer step on each worker: one step of all workers takes "
        "batch_size x scaling.num_workers rows. With a range of workers, a step takes "
        "batch_size x the range's max rows at any size, each worker's batch that over the "
        "workers training, so the learning rate holds as the run resizes; a train.loop reads "
        "batch_size as written.",
    )
    lr: float = Field(
        1e-3,
        gt=0.0,
        description="The learning rate, which the warm-up and the scheduler scale each epoch.",
    )
    optimizer: Literal["adam", "adamw", "sgd"] = Field(
        "adam",
        description="adam, adamw (Adam with decoupled weight decay) or sgd (with momentum).",
    )
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sgd's momentum; adam and adamw do not read it.")
    weight_decay: float = Field(
        0.0,
        ge=0.0,
        description="The optimizer's weight decay (L2 penalty; adamw's decoupled); 0: none.",
    )
    scheduler: Literal["none", "cosine", "step"] = Field(
        "none",
        description="The learning-rate schedule, stepped once per epoch after warmup_epochs: none "
        "(constant), cosine (down to 0 at the last epoch), or step (times gamma every step_size "
        "epochs).",
    )
    warmup_epochs: int = Field(
        0,
        ge=0,
        description="Epochs of linear warm-up before the schedule, from lr / (warmup_epochs + 1) "
        "up towards lr; 0: none.",
    )
    step_size: int = Field(
        10, ge=1, description="The step scheduler: epochs between two cuts of the learning rate."
    )
    gamma: float = Field(
        0.1,
        gt=0.0,
        le=1.0,
        description="The step scheduler: the factor the learning rate is multiplied by every "
        "step_size epochs.",
    )
    grad_clip_norm: float | None = Field(
        None,
        gt=0.0,
        description="Clip the global gradient norm to this value; null: no clipping.",
    )
    precision: Literal["32", "bf16-mixed", "16-mixed", "auto"] = Field(
        "32",
        description="32: full precision. bf16-mixed, 16-mixed: torch.autocast in bfloat16 or "
        "float16 (float16 with a gradient scaler); bf16 also runs on CPUs. auto: bf16-mixed on a "
        "GPU that has bfloat16 (Ampere and later), 32 elsewhere.",
    )
    seed: int = Field(
        0,
        description="Seeds the initial weights, and each epoch's shuffling and dropout on every "
        "worker: a resumed run draws as one that never stopped.",
    )
    deterministic: bool = Field(
        False,
        description="Deterministic algorithms on every worker (ray.train.torch.enable_reproducibility): "
        "the same config gives the same weights, at some cost in speed on GPUs.",
    )
    early_stopping: EarlyStoppingConfig | None = Field(
        None,
        description="Stop when a metric stops improving, as train.early_stopping's fields say "
        "({metric: val_loss, mode: min, patience: 3}); null: train every epoch.",
    )
    log_every_n_steps: int | None = Field(
        None,
        ge=1,
        description="Log the running train loss every N optimizer steps (rank 0) as well as per "
        "epoch; null: per epoch only.",
    )
    callbacks: list[str] = Field(
        [],
        description="Import paths (package.module:function) called on every worker after each epoch "
        "with (epoch, metrics, rank): custom logging, fault drills, extra stopping rules.",
    )
    loss: str | None = Field(
        None,
        description="cross_entropy for classification; mse, l1 or huber for regression; or "
        "package.module:name, a loss of your own: a function (outputs, targets) -> scalar tensor, "
        "or an nn.Module class built with loss_args, called the same way. outputs are the "
        "model's [N, classes] logits and targets class indices (int64); for a regression, both "
        "are [N] floats, the label standardized as training sees it. null: the objective's first "
        "(cross_entropy, or mse).",
    )
    loss_args: dict[str, Any] = Field(
        {},
        description="Keyword arguments for a loss of your own: its class's (FocalLoss(**loss_args)), "
        "or passed to its function on every call.",
    )
    label_smoothing: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Classification with the built-in cross_entropy: the share of the target spread "
        "over the other classes; 0: none.",
    )
    class_weights: Literal["balanced"] | None = Field(
        None,
        description="Classification with the built-in cross_entropy: balanced weighs each class by "
        "rows / (classes * its rows in the train split), for imbalanced data; null: every class "
        "weighs the same.",
    )
    in_memory: Literal["auto", "always", "never"] = Field(
        "auto",
        description="Whether each worker reads its shards once, straight from the prepared Parquet, "
        "and keeps them in memory instead of streaming them from Ray Data every epoch. auto "
        "decides per split: each one whose prepared Parquet is under 1 GB per worker (so a large "
        "train split streams while a small val split stays in memory); always keeps both; never "
        "streams both, for workers whose memory cannot spare them. An augmented train split draws "
        "new crops and flips each epoch either way.",
    )
    loop: str | None = Field(
        None,
        description="A training function of your own, package.module:name, run on every Ray Train "
        "worker as fn(config) in place of trainflow's loop, as Ray Train runs a train_func: it "
        'reads the prepared splits with ray.train.get_dataset_shard("train") and ("val"), and '
        "reports checkpoints holding model.pt, the state dict of the model model.kind builds. "
        "config holds epochs, batch_size, lr and seed, loop_config's keys, and under trainflow "
        "the run's whole config with model_spec; the other train fields keep their defaults "
        "beside it. null: trainflow's loop.",
    )
    loop_config: dict[str, Any] = Field(
        {},
        description="train.loop's own settings: more keys of its config dict, as given (plain JSON).",
    )
    lora: LoraConfig | None = Field(
        None,
        description="An hf: model fine-tuned through a LoRA adapter; null: every weight trains.",
    )

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
