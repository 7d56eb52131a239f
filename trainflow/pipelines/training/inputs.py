"""What the train loop reads: the prepared train and val splits, each either read once into
every worker's memory or streamed from Ray Data every epoch, and cut into mini-batches.

:func:`splits_in_memory` decides which splits sit in memory (``train.in_memory``);
:func:`split_inputs` turns that into the folders the workers read themselves and the
Datasets TorchTrainer shards. A worker's side of it: :func:`open_splits` opens its share
of each split, :func:`epoch_batches` cuts an epoch of it into mini-batches.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainflow.files import join
from trainflow.pipelines.data.entry import read_split_batches, split_bytes, split_dataset, split_rows
from trainflow.pipelines.data.preprocess import FEATURES, LABEL, augment_dataset, augment_images

if TYPE_CHECKING:
    import ray.data

    from trainflow.config import PipelineConfig
    from trainflow.pipelines.training.settings import TrainSettings


# The prepared splits the train loop reads: it trains on the first and validates on the second.
TRAIN_SPLITS = ("train", "val")
# A streamed train split arrives from Ray Data in chunks of this many batches, fewer
# when their features pass STREAM_CHUNK_BYTES (a chunk of 224x224 RGB images holds
# about 200 rows).
STREAM_CHUNK_BATCHES = 32
STREAM_CHUNK_BYTES = 128 << 20
# A prepared split under this size per worker is read once into each worker's memory
# (train.in_memory: auto).
IN_MEMORY_BYTES = 1 << 30

# What a model is called with: its ``features``, or with a transform's array columns
# every input by name (models.build.Reshaped joins them, or hands them over by name).
Inputs = torch.Tensor | dict[str, torch.Tensor]
# A split held in memory: its inputs and labels, as tensors on the worker's device.
InMemory = tuple[Inputs, torch.Tensor]
# A mini-batch: its inputs and labels, by column name (``features``, array columns, ``label``).
Batch = dict[str, torch.Tensor]


def model_input(batch: Batch) -> Inputs:
    """What the model is called with for ``batch``: its ``features`` when they are its one
    input, else every input by name (all but ``label``)."""
    if len(batch) == 2 and FEATURES in batch:
        return batch[FEATURES]
    return {name: value for name, value in batch.items() if name != LABEL}


def in_memory_splits(setting: str, split_bytes: dict[str, int], *, workers: int = 1) -> tuple[str, ...]:
    """The splits each worker reads once into memory under ``train.in_memory``.

    ``always``: train and val; ``never``: neither, both stream from Ray Data every epoch;
    ``auto``: each split whose prepared Parquet per worker (``split_bytes`` over ``workers``)
    is under :data:`IN_MEMORY_BYTES`. An augmented train split draws new crops and flips each
    epoch either way (:func:`augmented_batches` in memory). Streaming costs processes of its
    own (benchmarks/results.md, scaling)."""
    if setting == "always":
        return TRAIN_SPLITS
    if setting == "never":
        return ()
    return tuple(name for name in TRAIN_SPLITS if split_bytes[name] / max(workers, 1) < IN_MEMORY_BYTES)


def stream_chunk_rows(batch_size: int, num_features: int) -> int:
    """Rows per chunk of a streamed train split: STREAM_CHUNK_BATCHES batches, or as many
    whole batches as STREAM_CHUNK_BYTES of float32 features hold; at least one batch."""
    rows = min(batch_size * STREAM_CHUNK_BATCHES, STREAM_CHUNK_BYTES // (4 * max(num_features, 1)))
    return max(batch_size, rows // batch_size * batch_size)


def augments(preprocessor: dict[str, Any]) -> bool:
    """Whether the prepared train split is augmented anew each epoch (image folders)."""
    return bool((preprocessor.get("image") or {}).get("augment"))


def splits_in_memory(config: PipelineConfig, path: str | Path) -> tuple[str, ...]:
    """The splits of the prepared entry at ``path`` that the workers of ``config`` read once
    into memory (:func:`in_memory_splits`), every one without workers (``num_workers``
    0); the rest stream from Ray Data."""
    if config.scaling.in_process:  # no workers to stream to: the flow's process holds them
        return TRAIN_SPLITS
    sizes = {name: split_bytes(join(path, name)) for name in TRAIN_SPLITS}
    # An elastic run's fewest workers hold the largest share each.
    return in_memory_splits(config.train.in_memory, sizes, workers=config.scaling.min_workers)


def split_inputs(
    path: str | Path, *, in_memory: Collection[str], preprocessor: dict[str, Any] | None = None
) -> tuple[dict[str, str], dict[str, ray.data.Dataset] | None]:
    """What the train loop reads of a prepared entry at ``path``, given the names of the
    splits kept in memory: their folders (the settings' ``memory_splits``), which each
    worker reads itself, and a Dataset for every other split, to hand TorchTrainer (None
    when there is none). A streamed train split is augmented anew each epoch when the
    preprocessor says so."""
    unknown = set(in_memory) - set(TRAIN_SPLITS)
    if unknown:
        raise ValueError(f"in_memory: unknown splits {sorted(unknown)}; use {list(TRAIN_SPLITS)}")
    memory_splits = {name: join(path, name) for name in TRAIN_SPLITS if name in in_memory}
    streamed = [name for name in TRAIN_SPLITS if name not in in_memory]
    if not streamed:
        return memory_splits, None
    datasets = {name: split_dataset(join(path, name)) for name in streamed}
    if "train" in datasets:
        datasets["train"] = augment_dataset(datasets["train"], preprocessor or {})
    return memory_splits, datasets


# A worker's side.


def read_shard(path: str, rank: int, world_size: int, *, equal: bool) -> InMemory:
    """Rows ``rank``, ``rank + world_size``, ... of a prepared split, read straight from
    its Parquet (the train split was shuffled when it was written): its inputs
    (:func:`model_input`) and labels.

    ``equal`` drops the last ``rows % world_size`` rows first, so that every worker gets
    as many rows and so as many batches: DDP's all-reduce needs every worker at every step.
    """
    total = split_rows(path)
    n = total - total % world_size if equal else total
    count = len(range(rank, n, world_size))
    columns: dict[str, np.ndarray] | None = None
    filled = offset = 0
    # Batch by batch into arrays of this worker's size: a worker never holds the whole
    # split, nor its own rows twice.
    for batch in read_split_batches(path, batch_size=1 << 16):
        if columns is None:
            columns = {name: np.empty((count, *v.shape[1:]), dtype=v.dtype) for name, v in batch.items()}
        rows = np.arange(offset, offset + len(batch[LABEL]))
        mine = np.flatnonzero((rows % world_size == rank) & (rows < n))
        for name, values in batch.items():
            columns[name][filled : filled + len(mine)] = values[mine]
        filled = filled + len(mine)
        offset = offset + len(rows)
    if columns is None:  # an empty split
        return torch.zeros((0, 0)), torch.zeros(0, dtype=torch.int64)
    tensors = {name: torch.from_numpy(values) for name, values in columns.items()}
    y = tensors.pop(LABEL)
    return model_input({**tensors, LABEL: y}), y


def to_device(x: Inputs, device: torch.device) -> Inputs:
    return {name: v.to(device) for name, v in x.items()} if isinstance(x, dict) else x.to(device)


def split_source(
    name: str, memory_splits: dict[str, str], rank: int, world_size: int, device: torch.device
) -> InMemory | ray.data.DataIterator:
    """This worker's part of split ``name``: its rows as tensors on ``device`` when the
    split is kept in memory, else its Ray Data shard, iterated anew each epoch.

    The train split is read in equal shards (DDP needs every worker at every step); the
    val split whole, since its metrics are summed over workers.
    """
    import ray.train

    if name not in memory_splits:
        return ray.train.get_dataset_shard(name)
    x, y = read_shard(memory_splits[name], rank, world_size, equal=name == "train")
    return to_device(x, device), y.to(device)


class StreamedEpochs:
    """A streamed split's epochs, in chunks of rows, each epoch's execution started while
    the one before trains its last chunk.

    Ray Data executes the split anew at every epoch, and its first rows reach the worker
    only after a start-up wait (benchmarks/results.md, training throughput).
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
        started = self._started
        self._started = None
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
        yield from tensor_batches(model_input(chunk), chunk[LABEL], batch_size, generator)


def tensor_batches(x: Inputs, y: torch.Tensor, batch_size: int, generator: torch.Generator | None = None):
    """Mini-batches of in-memory tensors (``x``: the features, or every input by name),
    shuffled when a generator is given."""
    if generator is not None:
        order = torch.randperm(len(y), generator=generator).to(y.device)
    else:
        order = torch.arange(len(y), device=y.device)
    named = x if isinstance(x, dict) else {FEATURES: x}
    for i in range(0, len(y), batch_size):
        idx = order[i : i + batch_size]
        yield {**{name: v[idx] for name, v in named.items()}, LABEL: y[idx]}


def augmented_batches(batches, preprocessor: dict[str, Any]):
    """In-memory train batches, each image augmented anew as it is drawn
    (:func:`~trainflow.pipelines.data.preprocess.augment_images`, what Ray Data maps over a
    streamed train split), when the preprocessor augments; else the batches as they are."""
    if not augments(preprocessor):
        yield from batches
        return
    shape = preprocessor["image"]["shape"]
    for batch in batches:
        yield {FEATURES: augment_images(batch[FEATURES], shape), LABEL: batch[LABEL]}


def open_splits(
    settings: TrainSettings, rank: int, world_size: int, device: torch.device
) -> tuple[InMemory | StreamedEpochs, InMemory | ray.data.DataIterator]:
    """This worker's train and val splits: tensors on ``device`` for the splits in
    ``settings.memory_splits``, else its Ray Data shard, the train split's epochs
    streamed in chunks (:class:`StreamedEpochs`)."""
    train = split_source("train", settings.memory_splits, rank, world_size, device)
    val = split_source("val", settings.memory_splits, rank, world_size, device)
    if not isinstance(train, tuple):
        chunk_rows = stream_chunk_rows(settings.batch_size(world_size), settings.model_spec["num_features"])
        train = StreamedEpochs(train, chunk_rows, device, device.type == "cuda")
    return train, val


def epoch_batches(
    train: InMemory | StreamedEpochs,
    val: InMemory | ray.data.DataIterator,
    epoch: int,
    seed: int,
    settings: TrainSettings,
    device: torch.device,
    batch_size: int,
) -> tuple[Iterable[Batch], Iterable[Batch]]:
    """Epoch ``epoch``'s batches of ``batch_size`` rows: the train split's, shuffled by a
    generator seeded with ``seed`` (and augmented, in memory, when the preprocessor
    augments), and the val split's in order."""
    if isinstance(train, tuple):
        train_batches = tensor_batches(*train, batch_size, torch.Generator().manual_seed(seed))
        train_batches = augmented_batches(train_batches, settings.preprocessor)
    else:
        # Chunks of whole batches from Ray Data (stream_chunk_rows), each shuffled and cut
        # into batches here.
        chunks = train.epoch(more=epoch + 1 < settings.train.epochs)
        train_batches = chunk_batches(chunks, batch_size, torch.Generator().manual_seed(seed))
    if isinstance(val, tuple):
        val_batches = tensor_batches(*val, batch_size)
    else:
        pin_memory = device.type == "cuda"
        val_batches = val.iter_torch_batches(batch_size=batch_size, device=device, pin_memory=pin_memory)
    return train_batches, val_batches
