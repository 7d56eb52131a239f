"""Data-parallel training with Ray Train's TorchTrainer.

:func:`train_loop_per_worker` runs on every worker: it reads its shard of the prepared
splits, trains, and reports per-epoch metrics with a checkpoint from rank 0.
:func:`build_trainer` turns the config into the TorchTrainer that runs it.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from trainflow.pipelines.checkpoint import TRAIN_STATE, save_checkpoint
from trainflow.pipelines.models import build_model
from trainflow.pipelines.preprocess import FEATURES, LABEL

if TYPE_CHECKING:
    import ray.data
    from ray.train.torch import TorchTrainer

    from trainflow.config import PipelineConfig


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: training again with the same settings would too."""


def make_optimizer(name: str, params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    raise ValueError(f"train.optimizer {name!r}: use adam, adamw or sgd")


def _all_sum(*values: float) -> list[float]:
    """Sum values over every worker (one all-reduce), so each reports the global figure."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def train_epoch(model: nn.Module, batches, optimizer, loss_fn) -> float:
    model.train()
    loss_sum, n = 0.0, 0
    for batch in batches:
        x, y = batch[FEATURES], batch[LABEL]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(y)
        n += len(y)
    total, count = _all_sum(loss_sum, n)
    return total / max(count, 1)


def load_shard(shard) -> tuple[torch.Tensor, torch.Tensor]:
    """This worker's whole shard as two tensors, read once from Ray Data."""
    xs, ys = [], []
    for batch in shard.iter_torch_batches(batch_size=4096):
        xs.append(batch[FEATURES])
        ys.append(batch[LABEL])
    return torch.cat(xs), torch.cat(ys)


def tensor_batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator | None = None
):
    """Mini-batches of in-memory tensors, shuffled when a generator is given."""
    order = torch.randperm(len(y), generator=generator) if generator is not None else torch.arange(len(y))
    for i in range(0, len(y), batch_size):
        idx = order[i : i + batch_size]
        yield {FEATURES: x[idx], LABEL: y[idx]}


@torch.no_grad()
def validate(model: nn.Module, batches, loss_fn) -> tuple[float, float]:
    model.eval()
    loss_sum, correct, n = 0.0, 0, 0
    for batch in batches:
        x, y = batch[FEATURES], batch[LABEL]
        logits = model(x)
        loss_sum += loss_fn(logits, y).item() * len(y)
        correct += (logits.argmax(dim=1) == y).sum().item()
        n += len(y)
    total_loss, total_correct, count = _all_sum(loss_sum, correct, n)
    return total_loss / max(count, 1), total_correct / max(count, 1)


def train_loop_per_worker(config: dict[str, Any]) -> str | None:
    """Runs on every Ray Train worker. Every key is read here, once; a missing one fails now."""
    import ray
    import ray.train
    import ray.train.torch

    spec = config["model_spec"]
    epochs = config["epochs"]
    batch_size = config["batch_size"]
    seed = config["seed"]
    preprocessor = config["preprocessor"]
    pipeline = config["pipeline"]
    progress_actor = config["progress_actor"]
    in_memory = config["in_memory"]

    torch.manual_seed(seed)
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    model = ray.train.torch.prepare_model(build_model(spec))
    optimizer = make_optimizer(config["optimizer"], model.parameters(), config["lr"], config["weight_decay"])
    loss_fn = nn.CrossEntropyLoss()

    # Resume: Ray hands back the latest checkpoint after a worker failure or when the
    # same run name is fitted again (a Prefect retry of the train task).
    start_epoch, history = 0, []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / TRAIN_STATE, map_location="cpu", weights_only=True)
            model_state = torch.load(Path(folder) / "model.pt", map_location="cpu", weights_only=True)
        (model.module if hasattr(model, "module") else model).load_state_dict(model_state)
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"]
        history = json.loads(state["history"])

    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("val")
    if in_memory:
        # Small splits are read from Ray Data once and kept as tensors: a streaming pass
        # per epoch costs seconds of scheduling that dwarf the epoch itself.
        train_x, train_y = load_shard(train_shard)
        val_x, val_y = load_shard(val_shard)

    for epoch in range(start_epoch, epochs):
        shuffle_seed = seed * 100_003 + epoch * 101 + rank
        if in_memory:
            train_batches = tensor_batches(
                train_x, train_y, batch_size, torch.Generator().manual_seed(shuffle_seed)
            )
            val_batches = tensor_batches(val_x, val_y, batch_size)
        else:
            train_batches = train_shard.iter_torch_batches(
                batch_size=batch_size,
                local_shuffle_buffer_size=batch_size * 8,
                local_shuffle_seed=shuffle_seed,
            )
            val_batches = val_shard.iter_torch_batches(batch_size=batch_size)
        train_loss = train_epoch(model, train_batches, optimizer, loss_fn)
        if not math.isfinite(train_loss):
            # Every worker holds the same all-reduced figure, so all stop here together.
            # A returned message, not an exception: Ray would restart the workers and
            # diverge again from the last checkpoint.
            return (
                f"train loss became {train_loss} in epoch {epoch + 1}; lower train.lr "
                f"(now {config['lr']}) or check the data for extreme values"
            )
        val_loss, val_accuracy = validate(model, val_batches, loss_fn)
        metrics = {
            "epoch": epoch + 1,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
        }
        history.append(metrics)
        with tempfile.TemporaryDirectory() as tmp:
            report_checkpoint = None
            if rank == 0:
                save_checkpoint(
                    tmp,
                    model=model,
                    spec=spec,
                    preprocessor=preprocessor,
                    config=pipeline,
                    metrics={**metrics, "history": history},
                    train_state={
                        "optimizer": optimizer.state_dict(),
                        "epoch": epoch + 1,
                        "history": json.dumps(history),
                    },
                )
                report_checkpoint = ray.train.Checkpoint.from_directory(tmp)
                if progress_actor:
                    ray.get_actor(progress_actor).add.remote(metrics)
            ray.train.report(metrics, checkpoint=report_checkpoint)
    return None


class ProgressLog:
    """A Ray actor that rank 0 tells each epoch's metrics, so the driver can log them live.

    An actor rather than a file: it works when rank 0 runs on another node.
    """

    def __init__(self):
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def since(self, start: int) -> list[dict[str, Any]]:
        return self.rows[start:]


@contextmanager
def follow_progress(name: str, on_epoch: Callable[[dict[str, Any]], None], every_s: float = 0.5):
    """Start the ProgressLog actor ``name`` and call ``on_epoch`` for each row as it arrives."""
    import ray

    actor = ray.remote(num_cpus=0)(ProgressLog).options(name=name).remote()
    stop = threading.Event()
    seen = 0

    def drain() -> None:
        nonlocal seen
        for row in ray.get(actor.since.remote(seen)):
            seen += 1
            on_epoch(row)

    def poll() -> None:
        while not stop.wait(every_s):
            drain()

    thread = threading.Thread(target=poll, name=f"{name}-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        drain()
        ray.kill(actor)


def build_trainer(
    config: PipelineConfig,
    loop_config: dict[str, Any],
    datasets: dict[str, ray.data.Dataset],
    *,
    run_name: str,
    storage_path: str,
) -> TorchTrainer:
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        datasets=datasets,
        scaling_config=ScalingConfig(
            num_workers=config.scaling.num_workers,
            use_gpu=config.scaling.use_gpu,
            resources_per_worker=dict(config.scaling.resources_per_worker),
        ),
        run_config=RunConfig(
            name=run_name,
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(
                num_to_keep=config.checkpoint.keep,
                checkpoint_score_attribute=config.checkpoint.metric,
                checkpoint_score_order=config.checkpoint.mode,
            ),
            failure_config=FailureConfig(max_failures=config.failure.max_failures),
            # Ray Train logs every report and checkpoint at INFO; trainflow logs each epoch.
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )
