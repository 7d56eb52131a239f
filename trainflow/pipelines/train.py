"""Data-parallel training with Ray Train's TorchTrainer.

:func:`train_loop_per_worker` runs on every worker: it reads its shard of the prepared
splits, trains, and reports per-epoch metrics with a checkpoint from rank 0.
:func:`build_trainer` turns the config into the TorchTrainer that runs it.
"""

from __future__ import annotations

import itertools
import json
import math
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from trainflow.pipelines.checkpoint import TRAIN_STATE, save_checkpoint
from trainflow.pipelines.entry import read_split_batches, split_rows
from trainflow.pipelines.models import build_model
from trainflow.pipelines.preprocess import FEATURES, LABEL

if TYPE_CHECKING:
    import ray.data
    from ray.train.torch import TorchTrainer

    from trainflow.config import PipelineConfig


# The splits the train loop reads: it trains on the first and validates on the second.
SPLITS = ("train", "val")
# A streamed train split arrives from Ray Data in chunks of this many batches.
STREAM_CHUNK_BATCHES = 32
# A prepared split under this size is read once into each worker's memory (train.in_memory: auto).
IN_MEMORY_BYTES = 1 << 30
# Where ProgressLog keeps its rows in Ray's GCS key-value store.
PROGRESS_NAMESPACE = "trainflow"
PROGRESS_PREFIX = "trainflow/progress/"


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: training again with the same settings would too."""


def make_optimizer(
    name: str, params, lr: float, weight_decay: float, momentum: float = 0.9
) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"train.optimizer {name!r}: use adam, adamw or sgd")


def lr_factor(epoch: int, *, epochs: int, scheduler: str, warmup_epochs: int, step_size: int, gamma: float):
    """The multiple of train.lr used in ``epoch`` (0-based): linear warm-up, then the schedule."""
    if epoch < warmup_epochs:
        return (epoch + 1) / (warmup_epochs + 1)
    after = epoch - warmup_epochs
    if scheduler == "cosine":
        span = max(epochs - warmup_epochs, 1)
        return 0.5 * (1.0 + math.cos(math.pi * after / span))
    if scheduler == "step":
        return gamma ** (after // step_size)
    return 1.0


def make_scheduler(optimizer: torch.optim.Optimizer, config: dict[str, Any]):
    """A LambdaLR stepped once per epoch; its state (the epoch count) resumes with the run."""
    settings = {k: config[k] for k in ("epochs", "scheduler", "warmup_epochs", "step_size", "gamma")}
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: lr_factor(epoch, **settings))


AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class Precision:
    """``train.precision`` on one device: the autocast context and, for fp16, a gradient scaler."""

    def __init__(self, precision: str, device: torch.device):
        self.device_type = device.type
        self.dtype = AUTOCAST_DTYPES.get(precision)
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range.
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "16-mixed")

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)


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
    loss_sum, n = 0.0, 0
    for step, batch in enumerate(batches, start=1):
        x, y = batch[FEATURES], batch[LABEL]
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


def read_shard(path: str, rank: int, world_size: int, *, equal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rank``, ``rank + world_size``, ... of a prepared split, read straight from
    its Parquet (the train split was shuffled when it was written).

    ``equal`` drops the last ``rows % world_size`` rows first, so that every worker gets
    as many rows and so as many batches: DDP's all-reduce needs every worker at every step.
    """
    total = split_rows(path)
    n = total - total % world_size if equal else total
    count = len(range(rank, n, world_size))
    x = y = None
    filled = offset = 0
    # Batch by batch into arrays of this worker's size: a worker never holds the whole
    # split, nor its own rows twice.
    for batch in read_split_batches(path, batch_size=1 << 16):
        if x is None:
            x = np.empty((count, *batch[FEATURES].shape[1:]), dtype=batch[FEATURES].dtype)
            y = np.empty(count, dtype=batch[LABEL].dtype)
        rows = np.arange(offset, offset + len(batch[LABEL]))
        mine = np.flatnonzero((rows % world_size == rank) & (rows < n))
        x[filled : filled + len(mine)] = batch[FEATURES][mine]
        y[filled : filled + len(mine)] = batch[LABEL][mine]
        filled, offset = filled + len(mine), offset + len(rows)
    if x is None:  # an empty split
        return torch.zeros((0, 0)), torch.zeros(0, dtype=torch.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


class StreamedEpochs:
    """A streamed split's epochs, in chunks of rows, each epoch's execution started while
    the one before trains its last chunk.

    Ray Data executes the split anew at every epoch, and its first rows reach the worker
    about 1.4 s later (measured on 2 cores for a 40,000-row split), a wait at every epoch.
    Its coordinator shuts the running execution down when the next epoch starts, so the
    next one starts, in a thread, once the current one has handed over its last chunk.
    """

    def __init__(self, shard: ray.data.DataIterator, chunk_rows: int, device: torch.device, pin_memory: bool):
        self._shard = shard
        self._kwargs = {"batch_size": chunk_rows, "device": device, "pin_memory": pin_memory}
        self._ahead: threading.Thread | None = None  # starting the next epoch
        self._started: Any = None  # (first chunk or None, the epoch's iterator), or an exception

    def _start(self) -> None:
        """Start an epoch's execution and wait for its first chunk; keep what came of it."""
        try:
            it = iter(self._shard.iter_torch_batches(**self._kwargs))
            self._started = (next(it, None), it)
        except BaseException as e:  # raised in the loop, where the epoch is read
            self._started = e

    def epoch(self, more: bool) -> Iterator[dict[str, torch.Tensor]]:
        """This epoch's chunks; ``more``: another epoch follows, so start it early."""
        if self._ahead is None:
            self._start()
        else:
            self._ahead.join()
            self._ahead = None
        started, self._started = self._started, None
        if isinstance(started, BaseException):
            raise started
        chunk, it = started
        if chunk is None:
            return
        for following in it:
            yield chunk
            chunk = following
        if more:
            self._ahead = threading.Thread(target=self._start, name="trainflow-next-epoch", daemon=True)
            self._ahead.start()
        yield chunk


def chunk_batches(chunks, batch_size: int, generator: torch.Generator):
    """Mini-batches cut from larger chunks of rows, each chunk's rows shuffled first."""
    for chunk in chunks:
        yield from tensor_batches(chunk[FEATURES], chunk[LABEL], batch_size, generator)


def tensor_batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator | None = None
):
    """Mini-batches of in-memory tensors, shuffled when a generator is given."""
    if generator is not None:
        order = torch.randperm(len(y), generator=generator).to(y.device)
    else:
        order = torch.arange(len(y), device=y.device)
    for i in range(0, len(y), batch_size):
        idx = order[i : i + batch_size]
        yield {FEATURES: x[idx], LABEL: y[idx]}


@torch.no_grad()
def validate(model: nn.Module, batches, loss_fn, precision: Precision | None = None) -> tuple[float, float]:
    precision = precision or Precision("32", torch.device("cpu"))
    model.eval()
    loss_sum, correct, n = 0.0, 0, 0
    for batch in batches:
        x, y = batch[FEATURES], batch[LABEL]
        with precision.autocast():
            logits = model(x)
        logits = logits.float()
        loss_sum += loss_fn(logits, y).item() * len(y)
        correct += (logits.argmax(dim=1) == y).sum().item()
        n += len(y)
    total_loss, total_correct, count = _all_sum(loss_sum, correct, n)
    return total_loss / max(count, 1), total_correct / max(count, 1)


class EarlyStopping:
    """Counts epochs without improvement of one metric; its state resumes with the run."""

    def __init__(self, metric: str, mode: str, patience: int, min_delta: float):
        self.metric, self.mode, self.patience, self.min_delta = metric, mode, patience, min_delta
        self.best: float | None = None
        self.bad_epochs = 0

    def update(self, metrics: dict[str, float]) -> bool:
        """Record an epoch; True when training should stop."""
        value = metrics[self.metric]
        if self.best is None:
            improved = True
        elif self.mode == "max":
            improved = value > self.best + self.min_delta
        else:
            improved = value < self.best - self.min_delta
        if improved:
            self.best, self.bad_epochs = value, 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_epochs = state["best"], state["bad_epochs"]


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


def split_source(
    name: str, memory_splits: dict[str, str], rank: int, world_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | ray.data.DataIterator:
    """This worker's part of split ``name``: its rows as tensors on ``device`` when the
    split is kept in memory, else its Ray Data shard, iterated anew each epoch.

    The train split is read in equal shards (DDP needs every worker at every step); the
    val split whole, since its metrics are summed over workers.
    """
    import ray.train

    if name not in memory_splits:
        return ray.train.get_dataset_shard(name)
    x, y = read_shard(memory_splits[name], rank, world_size, equal=name == "train")
    return x.to(device), y.to(device)


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    """Runs on every Ray Train worker. Every key is read here, once; a missing one fails now.

    Returns how training ended, the same on every worker: ``{"status": "completed" |
    "early_stopped" | "diverged", "epoch": last epoch, "message": ...}``.
    """
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
    memory_splits = config["memory_splits"]
    grad_clip_norm = config["grad_clip_norm"]
    log_every = config["log_every_n_steps"]
    callbacks = load_callbacks(config["callbacks"])
    stopping = EarlyStopping(**config["early_stopping"]) if config["early_stopping"] else None

    # Seeded before the model is built: the same initial weights on every worker.
    if config["deterministic"]:
        ray.train.torch.enable_reproducibility(seed)
    else:
        seed_everything(seed)
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    device = ray.train.torch.get_device()
    model = ray.train.torch.prepare_model(build_model(spec))
    optimizer = make_optimizer(
        config["optimizer"], model.parameters(), config["lr"], config["weight_decay"], config["momentum"]
    )
    scheduler = make_scheduler(optimizer, config)
    precision = Precision(config["precision"], device)
    loss_fn = nn.CrossEntropyLoss()
    # The name of the ProgressLog the driver follows (None: nobody follows this run).
    progress = ProgressLog(progress_actor, rank) if progress_actor else None

    # Resume: Ray hands back the latest checkpoint after a worker failure or when the
    # same run name is fitted again (a Prefect retry of the train task).
    start_epoch, history = 0, []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / TRAIN_STATE, map_location="cpu", weights_only=True)
            model_state = torch.load(Path(folder) / "model.pt", map_location="cpu", weights_only=True)
        _unwrap(model).load_state_dict(model_state)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        precision.scaler.load_state_dict(state["scaler"])
        if stopping is not None and state["early_stopping"]:
            stopping.load_state_dict(json.loads(state["early_stopping"]))
        start_epoch = state["epoch"]
        history = json.loads(state["history"])
    if progress is not None:
        group = ray.util.get_current_placement_group()
        progress.started(
            ray.get_runtime_context().get_node_id(),
            start_epoch,
            group.id.hex() if group else None,
            ctx.get_experiment_name(),
        )

    # Splits in memory_splits are read once, straight from the prepared Parquet, and kept
    # as tensors: Ray Data's split coordinators and a streaming pass per epoch cost
    # seconds that dwarf a small epoch. The others stream from Ray Data every epoch.
    world_size = ctx.get_world_size()
    train = split_source("train", memory_splits, rank, world_size, device)
    val = split_source("val", memory_splits, rank, world_size, device)
    pin_memory = device.type == "cuda"
    if not isinstance(train, tuple):
        train = StreamedEpochs(train, batch_size * STREAM_CHUNK_BATCHES, device, pin_memory)

    outcome = {"status": "completed", "epoch": epochs, "message": ""}
    for epoch in range(start_epoch, epochs):
        this_seed = epoch_seed(seed, epoch, rank)
        seed_everything(this_seed)
        if isinstance(train, tuple):
            train_batches = tensor_batches(*train, batch_size, torch.Generator().manual_seed(this_seed))
        else:
            # Chunks of STREAM_CHUNK_BATCHES batches from Ray Data, each shuffled and cut
            # into batches here.
            chunks = train.epoch(more=epoch + 1 < epochs)
            train_batches = chunk_batches(chunks, batch_size, torch.Generator().manual_seed(this_seed))
        if isinstance(val, tuple):
            val_batches = tensor_batches(*val, batch_size)
        else:
            val_batches = val.iter_torch_batches(batch_size=batch_size, device=device, pin_memory=pin_memory)

        on_step = None
        if log_every and rank == 0 and progress is not None:

            def on_step(step: int, loss: float, epoch: int = epoch) -> None:
                if step % log_every == 0:
                    progress.step({"epoch": epoch + 1, "step": step, "loss": loss})

        lr = optimizer.param_groups[0]["lr"]
        train_loss = train_epoch(model, train_batches, optimizer, loss_fn, precision, grad_clip_norm, on_step)
        if not math.isfinite(train_loss):
            # Every worker holds the same all-reduced figure, so all stop here together.
            # A returned outcome, not an exception: Ray would restart the workers and
            # diverge again from the last checkpoint.
            return {
                "status": "diverged",
                "epoch": epoch + 1,
                "message": f"train loss became {train_loss} in epoch {epoch + 1}; lower train.lr "
                f"(now {config['lr']}) or check the data for extreme values",
            }
        val_loss, val_accuracy = validate(model, val_batches, loss_fn, precision)
        scheduler.step()
        metrics = {
            "epoch": epoch + 1,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "lr": lr,
        }
        history.append(metrics)
        stop = stopping.update(metrics) if stopping is not None else False
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
                        "scheduler": scheduler.state_dict(),
                        "scaler": precision.scaler.state_dict(),
                        "early_stopping": json.dumps(stopping.state_dict()) if stopping else "",
                        "epoch": epoch + 1,
                        "history": json.dumps(history),
                    },
                )
                report_checkpoint = ray.train.Checkpoint.from_directory(tmp)
                if progress is not None:
                    progress.add(metrics)
            ray.train.report(metrics, checkpoint=report_checkpoint)
        for callback in callbacks:
            callback(epoch + 1, metrics, rank)
        if stop:
            outcome = {
                "status": "early_stopped",
                "epoch": epoch + 1,
                "message": f"{stopping.metric} did not improve for {stopping.patience} epochs",
            }
            break
    return outcome


class ProgressLog:
    """The rows that Ray Train workers write for the driver: each worker (re)start, each
    epoch's metrics and, with ``log_every_n_steps``, step losses.

    Held in Ray's GCS key-value store, which every driver and worker already talks to, so
    a run costs no process of its own; and a row is stored once its write returns, so a
    worker killed right after loses nothing. Each row is one key,
    ``trainflow/progress/<name>/<kind>/<time_ns>-<rank>-<counter>``, with the row as JSON:
    unique without coordination between workers, and ordered as written by its time.
    A writer holds ``name`` and its rank; a reader (the driver) holds the rows it has
    read, so each poll reads only the new keys.
    """

    def __init__(self, name: str, rank: int = 0):
        self.name = name
        self.rank = rank
        self.prefix = f"{PROGRESS_PREFIX}{name}/"
        self._last_ns = 0
        self._read: dict[bytes, dict[str, Any]] = {}  # every row read, by key
        self._unseen: list[bytes] = []  # the keys read since rows() last returned them

    # Written by the workers.

    def add(self, row: dict[str, Any]) -> None:
        self._put({"kind": "epoch", **row})

    def step(self, row: dict[str, Any]) -> None:
        self._put({"kind": "step", **row})

    def started(
        self, node_id: str, start_epoch: int, placement_group: str | None = None, run: str = ""
    ) -> None:
        """This worker (re)started: its node, the epoch it resumes after (0: from scratch),
        its worker group's placement group and its Ray Train run."""
        self._put(
            {
                "kind": "start",
                "rank": self.rank,
                "node_id": node_id,
                "start_epoch": start_epoch,
                "placement_group": placement_group,
                "run": run,
            }
        )

    def _put(self, row: dict[str, Any]) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        value = json.dumps(row)
        for counter in itertools.count():
            # Never behind this writer's last key, even if the wall clock steps back.
            self._last_ns = max(time.time_ns(), self._last_ns + 1)
            key = f"{self.prefix}{row['kind']}/{self._last_ns:020d}-{self.rank}-{counter}"
            # True when the key was taken (by another writer in the same nanosecond).
            if not _internal_kv_put(key, value, overwrite=False, namespace=PROGRESS_NAMESPACE):
                return

    # Read by the driver.

    def rows(self) -> list[dict[str, Any]]:
        """The rows written since the last call, in order: every epoch and step row, and
        the start of each worker group (its rank 0)."""
        self._read_new(self.prefix)
        keys, self._unseen = sorted(self._unseen, key=_written), []
        rows = [self._read[key] for key in keys]
        return [row for row in rows if row["kind"] != "start" or row["rank"] == 0]

    def workers(self) -> list[dict[str, Any]]:
        """Every worker start written so far, in order, without its ``kind``."""
        self._read_new(f"{self.prefix}start/")
        return [
            {k: v for k, v in row.items() if k != "kind"}
            for key, row in sorted(self._read.items(), key=lambda item: _written(item[0]))
            if row["kind"] == "start"
        ]

    def clear(self) -> None:
        """Delete every row of ``name`` from the store."""
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(self.prefix, del_by_prefix=True, namespace=PROGRESS_NAMESPACE)

    def _read_new(self, prefix: str) -> None:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

        for key in _internal_kv_list(prefix, namespace=PROGRESS_NAMESPACE):
            if key not in self._read:
                value = _internal_kv_get(key, namespace=PROGRESS_NAMESPACE)
                if value is not None:
                    self._read[key] = json.loads(value)
                    self._unseen.append(key)


def _written(key: bytes) -> tuple[int, ...]:
    """A progress row's key, as what orders it: its time, then its writer's rank and counter."""
    return tuple(int(part) for part in key.rsplit(b"/", 1)[1].split(b"-"))


@dataclass
class Progress:
    """What :func:`follow_progress` saw: after the block, every worker (re)start."""

    workers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def starts(self) -> list[int]:
        """The epoch each start of the worker group resumed after (0: from scratch)."""
        return [w["start_epoch"] for w in self.workers if w["rank"] == 0]

    @property
    def nodes(self) -> list[str]:
        return sorted({w["node_id"] for w in self.workers})


@contextmanager
def follow_progress(
    name: str, on_row: Callable[[dict[str, Any]], None], every_s: float = 0.5
) -> Iterator[Progress]:
    """Call ``on_row`` for each row the workers write to the :class:`ProgressLog` ``name``
    as it arrives, ``{"kind": "start" | "epoch" | "step", ...}``, and delete the rows
    after the block."""
    log = ProgressLog(name)
    stop = threading.Event()
    progress = Progress()

    def drain() -> None:
        for row in log.rows():
            on_row(row)

    def poll() -> None:
        while not stop.wait(every_s):
            drain()

    thread = threading.Thread(target=poll, name=f"{name}-progress", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()
        try:
            drain()
            progress.workers = log.workers()
        finally:
            log.clear()


def in_memory_splits(
    setting: str, split_bytes: dict[str, int], *, augment: bool, workers: int = 1
) -> tuple[str, ...]:
    """The splits each worker reads once into memory under ``train.in_memory``.

    ``always``: train and val; ``never``: neither, both stream from Ray Data every epoch;
    ``auto``: each split whose share per worker (its prepared Parquet, ``split_bytes``,
    over ``workers``) is under :data:`IN_MEMORY_BYTES`, decided per split, so a small
    val split stays in memory while a large train split streams. An augmented train
    split always streams, so its crops and flips are drawn anew each epoch.

    Per worker, because that is what a worker holds: streaming costs processes of its
    own (a split coordinator, Ray Data's readers), measured at more memory than a 1.4 GB
    split held by two workers (benchmarks/scaling.py: 6.4-6.8 against 5.5 GB).
    """
    if setting == "always":
        return SPLITS
    if setting == "never":
        return ()
    return tuple(
        name
        for name in SPLITS
        if split_bytes[name] / max(workers, 1) < IN_MEMORY_BYTES and not (name == "train" and augment)
    )


def split_inputs(
    path: str | Path, *, in_memory: Collection[str], preprocessor: dict[str, Any] | None = None
) -> tuple[dict[str, str], dict[str, ray.data.Dataset] | None]:
    """What the train loop reads of a prepared entry at ``path``, given the names of the
    splits kept in memory: their folders (the loop config's ``memory_splits``), which each
    worker reads itself, and a Dataset for every other split, to hand TorchTrainer (None
    when there is none). A streamed train split is augmented anew each epoch when the
    preprocessor says so."""
    unknown = set(in_memory) - set(SPLITS)
    if unknown:
        raise ValueError(f"in_memory: unknown splits {sorted(unknown)}; use {list(SPLITS)}")
    memory_splits = {name: str(Path(path) / name) for name in SPLITS if name in in_memory}
    streamed = [name for name in SPLITS if name not in in_memory]
    if not streamed:
        return memory_splits, None
    import ray.data

    from trainflow.pipelines.preprocess import augment_dataset

    datasets = {name: ray.data.read_parquet(str(Path(path) / name)) for name in streamed}
    if "train" in datasets:
        datasets["train"] = augment_dataset(datasets["train"], preprocessor or {})
    return memory_splits, datasets


def build_trainer(
    config: PipelineConfig,
    loop_config: dict[str, Any],
    datasets: dict[str, ray.data.Dataset] | None,
    *,
    run_name: str,
    storage_path: str,
    callbacks: list[Any] = (),
) -> TorchTrainer:
    """``callbacks``: Ray Train callbacks, such as Ray Tune's TuneReportCallback in a sweep."""
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
            placement_strategy=config.scaling.placement_strategy,
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
            callbacks=list(callbacks),
        ),
    )
