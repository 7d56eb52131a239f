"""The settings a training run's workers get: one typed, frozen object built from the
config (:meth:`TrainSettings.from_config`), and what training reads of a prepared entry
(:class:`PreparedSplits`); how a training ends (:class:`Outcome`). Torch-free: Ray Train's
controller imports it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainflow.config import ConfigError, PipelineConfig, TrainConfig

if TYPE_CHECKING:
    from trainflow.pipelines.sweep.trials import TuneReports

# The key under which the trainer hands every worker its TrainSettings.
SETTINGS = "settings"


@dataclass(frozen=True)
class Outcome:
    """How training ended, the same on every worker: ``completed``, ``early_stopped``
    (``message`` says why) or ``diverged`` (``message`` says what to change), after ``epoch``.

    What the workers' training function returns. Ray Train's controller unpickles it from
    their last status, importing its module: here, not beside the loop, whose module
    imports torch (the controller never holds a tensor; ray_internals.torch_config)."""

    status: str
    epoch: int
    message: str = ""


@dataclass(frozen=True)
class TrainSettings:
    """Everything a worker of one training run needs, each value held once.

    It crosses to the Ray Train workers pickled; the values computed at run time (the
    model spec, the preprocessor state, the split folders) must be plain JSON, as they
    are saved in each checkpoint: anything else is refused when the settings are made,
    naming the value, instead of failing inside a worker.
    """

    config: PipelineConfig  # the run's config: its train section drives the loop; saved with each checkpoint
    model_spec: dict[str, Any]  # the architecture (models.build.model_spec)
    preprocessor: dict[str, Any]  # the fitted preprocessing, saved with each checkpoint
    # The splits each worker reads once into memory, by name: their prepared folders.
    # The other train splits stream from the Datasets TorchTrainer is given.
    memory_splits: dict[str, str] = field(default_factory=dict)
    # train.class_weights: balanced: one weight per class for the loss (None: unweighted).
    class_weights: list[float] | None = None
    split_rows: dict[str, int] = field(default_factory=dict)  # the prepared rows of each split
    progress: str | None = None  # the ProgressLog the driver follows; None: nobody follows
    placements: str | None = None  # the PlacementTracker rank 0 records its group in (sweeps)
    # A checkpoint folder of this run newer than the one Ray Train will hand back, with its
    # epoch: written by a driver that died before Ray's controller recorded it
    # (run_records.newest_checkpoint). The loop resumes from whichever is newer.
    resume_from: str | None = None
    resume_from_epoch: int = 0
    # Where rank 0 saves the state mid-epoch (resume.StepSaver): every
    # checkpoint.every_n_steps steps, and when a node is being preempted; None: no saves.
    step_folder: str | None = None
    # The run's folder when the loop runs in its caller's process, without Ray Train
    # (.in_process): a sweep's trial in Tune's trial process, or a run of
    # scaling.num_workers 0 in the flow's. It saves each epoch's checkpoint there itself;
    # None: Ray Train's workers report them. ``to_tune``: where a trial's epochs go to Ray Tune.
    own_folder: str | None = None
    to_tune: TuneReports | None = None

    def __post_init__(self) -> None:
        for name in ("model_spec", "preprocessor", "memory_splits", "class_weights"):
            check_plain(getattr(self, name), f"train settings: {name}")

    @classmethod
    def from_config(
        cls,
        config: PipelineConfig,
        *,
        preprocessor: dict[str, Any],
        num_features: int,
        num_outputs: int,
        memory_splits: Mapping[str, str] = {},
        class_weights: list[float] | None = None,
        split_rows: Mapping[str, int] = {},
        progress: str | None = None,
        placements: str | None = None,
        resume_from: tuple[str, int] | None = None,
        step_folder: str | None = None,
    ) -> TrainSettings:
        """The settings of a run of ``config`` on data of ``num_features`` inputs and
        ``num_outputs`` outputs (its classes, or 1 for a regression); a model that does not
        fit them, or a loss or metric of the user's own that fails on outputs of this
        shape, raises ConfigError here, before any worker starts."""
        # Here, not at the top: Ray Train's controller unpickles the settings (they are the
        # trainer's train_loop_config) and must not import torch for it (ray_internals.torch_config).
        from trainflow.pipelines.metrics import check_metrics
        from trainflow.pipelines.models.build import image_shape, input_layout, model_spec
        from trainflow.pipelines.training.losses import check_loss

        spec = model_spec(
            config.model,
            num_features,
            num_outputs,
            image_shape=image_shape(preprocessor),
            inputs=input_layout(preprocessor),
            classes=preprocessor.get("classes"),
            lora=config.train.lora.model_dump() if config.train.lora else None,
        )
        check_loss(config, num_outputs)
        check_metrics(config.evaluation, config.objective, num_outputs)
        return cls(
            config=config,
            model_spec=spec,
            preprocessor=preprocessor,
            memory_splits=dict(memory_splits),
            class_weights=class_weights,
            split_rows=dict(split_rows),
            progress=progress,
            placements=placements,
            resume_from=resume_from[0] if resume_from else None,
            resume_from_epoch=resume_from[1] if resume_from else 0,
            step_folder=step_folder,
        )

    @property
    def train(self) -> TrainConfig:
        """The train section: epochs, batch size, optimizer, schedule, seed and the rest."""
        return self.config.train

    def batch_size(self, workers: int) -> int:
        """Each worker's batch in a group of ``workers``: ``train.batch_size``; in an
        elastic run, ``train.batch_size`` x the most workers over ``workers``, so that a
        step of the group takes the same rows (and an epoch the same steps) at any size."""
        scaling = self.config.scaling
        if not scaling.elastic:
            return self.train.batch_size
        return max(1, self.train.batch_size * scaling.max_workers // max(workers, 1))


def check_plain(value: Any, path: str) -> None:
    """Refuse, naming it by its ``path``, a value that is not plain JSON (str, int, finite
    float, bool, None, and lists and string-keyed dicts of them)."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{path}: {value} is not a finite number")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{path}: key {key!r} must be a string")
            check_plain(item, f"{path}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain(item, f"{path}[{i}]")
        return
    raise ConfigError(
        f"{path}: a {type(value).__name__} cannot be passed to Ray Train workers; "
        "use str, int, float, bool, None, lists or dicts of them"
    )


@dataclass(frozen=True)
class PreparedSplits:
    """What training reads of a prepared entry: its folder (``train/`` and ``val/``
    Parquet), its preprocessor state, and the model's input width and classes."""

    path: str
    preprocessor: dict[str, Any]
    num_features: int
    num_outputs: int
    counts: dict[str, int] = field(default_factory=dict)  # rows per split


def balanced_class_weights(path: str, num_classes: int) -> list[float]:
    """train.class_weights=balanced: ``rows / (classes * rows of the class)`` per class, from
    the labels of the prepared train split at ``path`` (scikit-learn's "balanced"); a class
    without train rows weighs 0 (it contributes no loss term anyway)."""
    import numpy as np
    import pyarrow.dataset as pads

    from trainflow.files import join
    from trainflow.pipelines.data.entry import split_files
    from trainflow.pipelines.data.preprocess import LABEL

    fs, files = split_files(join(path, "train"))
    labels = pads.dataset(files, filesystem=fs, format="parquet").to_table(columns=[LABEL])[LABEL]
    counts = np.bincount(labels.to_numpy(), minlength=num_classes).astype(np.float64)
    weights = np.divide(counts.sum(), num_classes * counts, out=np.zeros_like(counts), where=counts > 0)
    return [float(w) for w in weights]


@dataclass
class TrainingResult:
    """What a finished training run gives: its best checkpoint and how it got there."""

    run_path: str  # the Ray Train run's folder
    best_checkpoint: str  # the checkpoint that scored best on checkpoint.metric
    best_metrics: dict[str, Any]  # that checkpoint's epoch metrics
    history: list[dict[str, float]]  # every epoch's metrics, as the last checkpoint holds them
    status: str  # completed | early_stopped
    epoch: int  # the last epoch trained
    message: str  # why it stopped early ("" when it completed)
    # The epoch each start of the worker group resumed after, in this call: [0] ran from
    # scratch; [0, 3] lost a worker and resumed after epoch 3. With the node ids the
    # workers ran on and each start's workers (an elastic run's sizes), known when the run
    # was followed (on_row).
    starts: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    in_memory: tuple[str, ...] = ()  # the splits the workers held in memory; the rest streamed
