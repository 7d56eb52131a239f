"""The training loop that runs on every Ray Train worker (or in its caller's process,
:mod:`.in_process`), and its parts: one epoch of training, validation, each epoch's
checkpoint and report; the optimizer, schedule, precision and early stopping it builds
are :mod:`.optim`'s.

:func:`train_loop_per_worker` reads its :class:`~.settings.TrainSettings`, builds its
:class:`TrainingParts`, resumes them from Ray's latest checkpoint when there is one, opens
its share of the prepared splits (:mod:`.inputs`), and then, epoch by epoch, trains,
validates and reports the epoch's metrics with a checkpoint from rank 0.
"""

from __future__ import annotations

import itertools
import json
import math
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from trainflow.pipelines.data.preprocess import LABEL
from trainflow.pipelines.metrics import load_metrics
from trainflow.pipelines.models.build import holds_adapter, initial_model
from trainflow.pipelines.models.checkpoint import metrics_json, save_checkpoint
from trainflow.pipelines.sweep.trials import record_placement
from trainflow.pipelines.training.in_process import LocalContext, save_kept
from trainflow.pipelines.training.inputs import Batch, epoch_batches, model_input, open_splits
from trainflow.pipelines.training.losses import make_loss, on_device
from trainflow.pipelines.training.optim import EarlyStopping, Precision, make_optimizer, make_scheduler
from trainflow.pipelines.training.progress import ProgressLog
from trainflow.pipelines.training.resume import resume_state, same_start, step_hooks
from trainflow.pipelines.training.settings import SETTINGS, Outcome
from trainflow.pipelines.training.val_metrics import ValidationMetrics

if TYPE_CHECKING:
    from trainflow.pipelines.training.settings import TrainSettings


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch (every device) from one seed."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """Each epoch draws from a seed of its own per worker, so a run resumed at epoch k
    draws the same shuffles and dropout masks as one that never stopped."""
    return seed * 1_000_003 + epoch * 7_919 + rank


def _all_sum(*values: float) -> list[float]:
    """Sum values over every worker (one all-reduce), so each reports the global figure."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def train_epoch(
    model: nn.Module,
    batches,
    optimizer,
    loss_fn,
    precision: Precision | None = None,
    grad_clip_norm: float | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> float:
    """One pass over ``batches``; returns the mean train loss over every worker's examples."""
    precision = precision or Precision("32", torch.device("cpu"))
    scaler = precision.scaler
    model.train()
    loss_sum = 0.0
    n = 0
    for step, batch in enumerate(batches, start=1):
        x = model_input(batch)
        y = batch[LABEL]
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        if grad_clip_norm is not None:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip_norm)
        scaler.step(optimizer)
        scaler.update()
        batch_loss = loss.item()
        loss_sum += batch_loss * len(y)
        n += len(y)
        if on_step is not None:
            on_step(step, batch_loss)
    total, count = _all_sum(loss_sum, n)
    return total / max(count, 1)


@torch.no_grad()
def validate(
    model: nn.Module,
    batches,
    loss_fn,
    precision: Precision | None = None,
    classify: bool = True,
    scores: ValidationMetrics | None = None,
) -> dict[str, float]:
    """The mean loss over every worker's examples, the accuracy when ``classify``, and the
    user's metrics (``val_<name>``) over the whole split when there are ``scores``."""
    precision = precision or Precision("32", torch.device("cpu"))
    model.eval()
    loss_sum = 0.0
    correct = 0
    n = 0
    kept = []  # (outputs, labels) of each batch, for the user's metrics
    for batch in batches:
        x = model_input(batch)
        y = batch[LABEL]
        with precision.autocast():
            outputs = model(x)
        outputs = outputs.float()
        loss_sum += loss_fn(outputs, y).item() * len(y)
        if classify:
            correct += (outputs.argmax(dim=1) == y).sum().item()
        if scores is not None:
            kept.append((outputs.cpu(), y.cpu()))
        n += len(y)
    total_loss, total_correct, count = _all_sum(loss_sum, correct, n)
    out = {"val_loss": total_loss / max(count, 1)}
    if classify:
        out["val_accuracy"] = total_correct / max(count, 1)
    if scores is not None:
        out.update(scores(kept))
    return out


def load_callbacks(paths: list[str]) -> list[Callable[..., None]]:
    """Import ``train.callbacks`` ("package.module:function") on the worker."""
    import importlib

    out = []
    for path in paths:
        module, _, name = path.partition(":")
        try:
            out.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError) as e:
            raise ValueError(f"train.callbacks: cannot import {path!r} on the Ray worker: {e}") from e
    return out


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


@dataclass
class TrainingParts:
    """What one worker trains with, built once from the settings: the model (wrapped for
    DDP), what updates it, the precision, the loss, the user's metrics and early stopping.
    Every part but the loss and the metrics saves its state with each checkpoint and
    resumes from it."""

    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    grad_clip_norm: float | None
    classify: bool  # validation measures accuracy too
    stopping: EarlyStopping | None
    scores: ValidationMetrics | None = None  # evaluation.metrics, as val_<name>
    # The history's rows as each checkpoint's metrics.json holds them, each encoded once.
    history_rows: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, settings: TrainSettings) -> TrainingParts:
        """The parts of ``settings``' run on this worker's device. Seeded before the model
        is built: the same initial weights on every worker."""
        import ray.train.torch

        cfg = settings.train
        if cfg.deterministic:
            ray.train.torch.enable_reproducibility(cfg.seed)
        else:
            seed_everything(cfg.seed)
        if settings.own_folder:  # the only worker, in its caller's process (.in_process)
            device = torch.device("cpu")
            model = initial_model(settings.model_spec)
        else:
            device = ray.train.torch.get_device()
            model = ray.train.torch.prepare_model(initial_model(settings.model_spec))
        optimizer = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr, cfg.weight_decay, cfg.momentum)
        config = settings.config
        loss_fn = make_loss(
            config.loss,
            label_smoothing=cfg.label_smoothing,
            class_weights=settings.class_weights,
            loss_args=cfg.loss_args,
            objective=config.objective,
        )
        metrics = load_metrics(config.evaluation)
        return cls(
            device=device,
            model=model,
            optimizer=optimizer,
            scheduler=make_scheduler(optimizer, cfg),
            precision=Precision(cfg.precision, device),
            loss_fn=on_device(loss_fn, device),
            grad_clip_norm=cfg.grad_clip_norm,
            classify=config.objective == "classification",
            stopping=EarlyStopping(**cfg.early_stopping.model_dump()) if cfg.early_stopping else None,
            scores=ValidationMetrics(metrics, config.objective, settings.preprocessor) if metrics else None,
        )

    def train_on(self, batches: Iterable[Batch], on_step: Callable[[int, float], None] | None) -> float:
        """One epoch of training on ``batches`` (:func:`train_epoch`): the mean train loss."""
        return train_epoch(
            self.model, batches, self.optimizer, self.loss_fn, self.precision, self.grad_clip_norm, on_step
        )

    def validate_on(self, batches: Iterable[Batch]) -> dict[str, float]:
        """The validation metrics over ``batches`` (:func:`validate`)."""
        return validate(self.model, batches, self.loss_fn, self.precision, self.classify, self.scores)

    def train_state(self, epoch: int, history: list[dict[str, float]] | None = None) -> dict[str, Any]:
        """What a checkpoint holds to resume after ``epoch``, besides the model's weights;
        the ``history`` too where no ``metrics.json`` beside it holds it (a mid-epoch save)."""
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "early_stopping": json.dumps(self.stopping.state_dict()) if self.stopping else "",
            "epoch": epoch,
        }
        return state if history is None else {**state, "history": json.dumps(history)}

    def resume(self, state: tuple[dict, dict] | None) -> tuple[int, int, list[dict[str, float]]]:
        """Load a checkpoint's train state and model weights (:func:`.resume.resume_state`);
        return the epochs it ends after, the steps of the next it trained (a mid-epoch
        save's), and the metrics of the epochs so far (0, 0 and [] without one)."""
        if state is None:
            return 0, 0, []
        train_state, model_state = state
        # An adapter's state alone (train.lora) loads onto the pretrained base built here.
        _unwrap(self.model).load_state_dict(model_state, strict=not holds_adapter(_unwrap(self.model)))
        # The optimizer's moments and the schedule's place come from the checkpoint, its
        # hyperparameters from this run's config (a PBT trial goes on from another's
        # checkpoint with its own learning rate and weight decay).
        configured = [
            {k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups
        ]
        self.optimizer.load_state_dict(train_state["optimizer"])
        self.scheduler.load_state_dict(train_state["scheduler"])
        for group, settings, factor in zip(
            self.optimizer.param_groups, configured, self.scheduler.lr_lambdas, strict=True
        ):
            group.update(settings, lr=settings["initial_lr"] * factor(self.scheduler.last_epoch))
        self.scheduler.base_lrs = [settings["initial_lr"] for settings in configured]
        self.precision.scaler.load_state_dict(train_state["scaler"])
        if self.stopping is not None and train_state["early_stopping"]:
            self.stopping.load_state_dict(json.loads(train_state["early_stopping"]))
        return train_state["epoch"], train_state.get("step", 0), json.loads(train_state["history"])


def report_epoch(
    metrics: dict[str, float],
    history: list[dict[str, float]],
    parts: TrainingParts,
    settings: TrainSettings,
    saved_config: dict[str, Any],
    rank: int,
    progress: ProgressLog | None,
) -> None:
    """Report an epoch's ``metrics`` to Ray Train from every worker, rank 0's report with
    a checkpoint: the model with its spec, preprocessor and config, the metrics with the
    ``history`` of every epoch so far, and the train state to resume from. Rank 0 also
    writes the epoch's progress row. A loop in its caller's process saves the checkpoint
    itself (:func:`.in_process.save_kept`), a sweep's trial then reporting to Ray Tune."""
    import ray.train

    def save(folder: str | Path) -> None:
        save_checkpoint(
            folder,
            model=parts.model,
            spec=settings.model_spec,
            preprocessor=settings.preprocessor,
            config=saved_config,
            metrics=metrics_json({**metrics, "history": history}, parts.history_rows),
            train_state=parts.train_state(metrics["epoch"]),  # the history is in metrics.json
        )

    if settings.own_folder:  # the only worker, in its caller's process (.in_process)
        path = save_kept(metrics, settings.own_folder, settings.config.checkpoint, save)
        if progress is not None:
            progress.add(metrics)
        if settings.to_tune is not None:
            settings.to_tune.add(metrics, path)
        return
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            save(tmp)
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
            if progress is not None:
                progress.add(metrics)
        ray.train.report(metrics, checkpoint=checkpoint)


def diverged(train_loss: float, epoch: int, lr: float) -> Outcome:
    """How a run ends whose train loss became NaN or infinite in ``epoch``, saying what to
    change. Returned, not raised: Ray would restart the workers, and they would diverge
    again from the last checkpoint."""
    return Outcome(
        "diverged",
        epoch,
        f"train loss became {train_loss} in epoch {epoch}; lower train.lr "
        f"(now {lr}) or check the data for extreme values",
    )


def early_stopped(stopping: EarlyStopping, epoch: int) -> Outcome:
    """How a run ends that early stopping ended after ``epoch``, saying why."""
    return Outcome(
        "early_stopped", epoch, f"{stopping.metric} did not improve for {stopping.patience} epochs"
    )


def resumed(
    parts: TrainingParts, settings: TrainSettings, progress: ProgressLog | None, workers: int
) -> tuple[int, int, list[dict[str, float]]]:
    """``parts`` resumed from the newest state, the same on every worker: Ray's latest
    checkpoint (after a lost worker, or when the same run name is fitted again: a Prefect
    retry of the train task, `--resume`), a newer folder that Ray's controller never
    recorded (its driver died first), or a mid-epoch save (:func:`.resume.resume_state`).
    The epochs and steps it ends after and the history so far, as the start row says,
    with the group's ``workers``."""
    import ray
    import ray.train

    checkpoint = None if settings.own_folder else ray.train.get_checkpoint()
    epoch, step, history = parts.resume(resume_state(checkpoint, settings))
    if settings.step_folder:
        same_start(epoch, step)
    if progress is not None:
        progress.started(ray.get_runtime_context().get_node_id(), epoch, workers, step)
    return epoch, step, history


def train_loop_per_worker(loop_config: dict[str, TrainSettings]) -> Outcome:
    """Runs on every Ray Train worker, with its settings under ``loop_config["settings"]``.

    Returns how training ended, the same :class:`Outcome` on every worker.
    """
    import ray
    import ray.train

    settings = loop_config[SETTINGS]
    cfg = settings.train
    callbacks = load_callbacks(cfg.callbacks)
    saved_config = settings.config.model_dump(mode="json")  # what each checkpoint's config.json holds

    # Set up: the model and what trains it; this worker's place in the group.
    parts = TrainingParts.build(settings)
    ctx = LocalContext(settings.own_folder) if settings.own_folder else ray.train.get_context()
    rank = ctx.get_world_rank()
    # The ProgressLog the driver follows (None: nobody follows this run).
    progress = ProgressLog(settings.progress, rank) if settings.progress else None
    if settings.placements and rank == 0:
        record_placement(settings.placements, ctx.get_experiment_name())

    # Resume after a lost worker, a retry of the task or `--resume` (:func:`resumed`).
    start_epoch, skip, history = resumed(parts, settings, progress, ctx.get_world_size())

    # Data: the splits in memory_splits are read once, straight from the prepared Parquet,
    # and kept as tensors: Ray Data's split coordinators and a streaming pass per epoch
    # cost more than a small epoch (see benchmarks/results.md, training throughput). The
    # others stream every epoch.
    train, val = open_splits(settings, rank, ctx.get_world_size(), parts.device)

    for epoch in range(start_epoch, cfg.epochs):
        # Train, from a seed of the epoch's own: a resumed run draws as one that never stopped.
        this_seed = epoch_seed(cfg.seed, epoch, rank)
        seed_everything(this_seed)
        train_batches, val_batches = epoch_batches(
            train, val, epoch, this_seed, settings, parts.device, settings.batch_size(ctx.get_world_size())
        )
        lr = parts.optimizer.param_groups[0]["lr"]
        # After a mid-epoch save, the steps it trained are drawn and passed over.
        train_batches = itertools.islice(train_batches, skip, None) if skip else train_batches
        on_step = step_hooks(progress, settings, rank, epoch, parts, history, skip)
        train_loss = parts.train_on(train_batches, on_step)
        skip = 0
        if not math.isfinite(train_loss):  # all-reduced: every worker stops here together
            return diverged(train_loss, epoch + 1, cfg.lr)

        # Validate, then step the schedule and early stopping.
        metrics = {"epoch": epoch + 1, "train_loss": train_loss, **parts.validate_on(val_batches), "lr": lr}
        parts.scheduler.step()
        history.append(metrics)
        stop = parts.stopping.update(metrics) if parts.stopping is not None else False

        # Checkpoint and report, then the user's callbacks.
        report_epoch(metrics, history, parts, settings, saved_config, rank, progress)
        for callback in callbacks:
            callback(epoch + 1, metrics, rank)
        if stop:
            return early_stopped(parts.stopping, epoch + 1)
    return Outcome("completed", cfg.epochs)
