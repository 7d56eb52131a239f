"""Preparing an input: check its rows, split, fit on train, transform and write every split
into a cache entry; one engine for tables, image folders, torchvision datasets and
``ray.data.Dataset`` sources.

The passes are plain functions of one fragment (:mod:`trainflow.pipelines.data.readers`),
run as one Ray task per fragment (:mod:`trainflow.pipelines.data.runner`), or in the driver
(:func:`prepares_in_driver`). :func:`prepare` makes two passes, three for an exact split:

1. scan: the row checks' counts, and each row's split and the train split's statistics
   (for an exact split, each row's label and seeded hash, which the driver ranks);
2. fit (exact split only): the train split's statistics;
3. write: each split's rows transformed, as Parquet, into the entry's temporary folder.

:func:`raw_split` rebuilds one split's raw rows the same way, for the gate's comparison."""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainflow.config import ConfigError, PreprocessConfig, SplitConfig
from trainflow.files import filesystem as location_filesystem
from trainflow.files import join
from trainflow.pipelines.data import readers, runner, sources, tensors, tokenizer
from trainflow.pipelines.data import split as splits
from trainflow.pipelines.data.entry import PreparedEntry, cache_key, finish_entry, finished_entry, staging
from trainflow.pipelines.data.preprocess import LABEL, Preprocessor
from trainflow.pipelines.data.readers import Fragment, fragment_batches
from trainflow.pipelines.data.schema import DataError, SourceInfo, filesystem
from trainflow.pipelines.data.stats import FitStats, RowCounts, kept_rows

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger("trainflow")

# A table of one file up to this size is prepared in the driver: its one fragment gains
# nothing from a Ray task, which costs a worker process of its own (Python, pandas and
# pyarrow imports) and the round trips to it.
IN_DRIVER_BYTES = 16 << 20
# On a Ray cluster of this machine alone, a table up to this size without a transform is
# prepared on the driver's threads: Ray workers' start and imports cost more than the GIL
# does (benchmarks/ingest.py); a larger input gains from processes the GIL does not hold.
LOCAL_DRIVER_BYTES = 512 << 20


def prepares_in_driver(info: SourceInfo, *, local: bool | None = None) -> bool:
    """Whether this input is prepared in this process rather than in Ray tasks: the
    bundled digits; one Parquet, CSV, JSON lines or NumPy file (or a Dataset) of at most
    :data:`IN_DRIVER_BYTES`; or, when the Ray cluster is this machine alone (``local``;
    None: asked of Ray), a table of at most :data:`LOCAL_DRIVER_BYTES` without a transform."""
    if info.format == "builtin":
        return True
    single = info.format == "dataset" or (not info.is_images and len(info.files) == 1)
    if single and info.bytes <= IN_DRIVER_BYTES:
        return True
    if info.is_images or info.transform or info.bytes > LOCAL_DRIVER_BYTES:
        return False
    return runner.local_cluster() if local is None else local


def driver_threads(info: SourceInfo) -> int:
    """The threads of this process that prepare this input; 0: Ray tasks do. A user's
    transform (a tokenizer, say) is called on one batch at a time."""
    if not prepares_in_driver(info):
        return 0
    return 1 if info.transform else runner.available_threads()


def worker_modules(info: SourceInfo, *, local: bool) -> tuple[str, ...]:
    """What the Ray workers that prepare this input import (for a run to start them early,
    ``cluster.session.warm_workers``); none when it is prepared in the driver. ``local``:
    whether the run's Ray cluster is this machine alone."""
    return () if prepares_in_driver(info, local=local) else (__name__,)


# The passes: what one worker runs on one fragment.


@dataclass
class Scan:
    counts: RowCounts = field(default_factory=RowCounts)
    train: FitStats = field(default_factory=FitStats)
    keys: list[np.ndarray] = field(default_factory=list)  # exact: each kept row's hash
    labels: list[np.ndarray] = field(default_factory=list)  # exact: each kept row's label
    placed: list[np.ndarray] = field(default_factory=list)  # by hash: each kept row's split

    @property
    def codes(self) -> np.ndarray:
        return np.concatenate(self.placed) if self.placed else np.zeros(0, dtype=np.int8)


def scan_fragment(
    info: SourceInfo,
    fragment: Fragment,
    split: SplitConfig,
    scaler: str,
    exact: bool,
    image_shape: list[int] | None = None,
) -> Scan:
    """Row counts; and either each kept row's hash and label (``exact``), or each kept
    row's split by its own hash and the train split's statistics."""
    scan = Scan()
    for batch in fragment_batches(info, fragment):
        scan.counts.add(batch, info)
        kept = kept_rows(batch, info)
        keys = splits.row_keys(kept, info, split.seed)
        if exact:
            scan.keys.append(keys)
            scan.labels.append(kept[info.label_column].to_numpy())
        else:
            scan.placed.append(splits.hash_split_codes(keys, val=split.val, test=split.test))
            scan.train.add(kept[scan.placed[-1] == 0], info, scaler, image_shape)
    return scan


def fit_fragment(
    info: SourceInfo,
    fragment: Fragment,
    split: SplitConfig,
    scaler: str,
    codes: np.ndarray | None,
    image_shape: list[int] | None = None,
) -> Scan:
    """The train split's statistics, each kept row's split given by ``codes`` or, when
    None, by its own hash."""
    scan = Scan()
    offset = 0
    for batch in fragment_batches(info, fragment):
        kept = kept_rows(batch, info)
        if codes is None:
            keys = splits.row_keys(kept, info, split.seed)
            scan.placed.append(splits.hash_split_codes(keys, val=split.val, test=split.test))
        else:
            scan.placed.append(codes[offset : offset + len(kept)])
        scan.train.add(kept[scan.placed[-1] == 0], info, scaler, image_shape)
        offset += len(kept)
    return scan


def write_fragment(
    info: SourceInfo,
    fragment: Fragment,
    split: SplitConfig,
    codes: np.ndarray,
    state: dict[str, Any],
    folder: str,
    name: str,
) -> dict[str, int]:
    """Transform the fragment's kept rows and write each split's (``codes``: each kept
    row's split) to ``folder/<split>/<name>``; the train rows of each batch (for images,
    of each chunk of :attr:`Preprocessor.chunk_rows`) in a seeded random order. Returns
    the rows per split."""
    import pyarrow.parquet as pq

    pre = Preprocessor.from_dict(state)
    rng = np.random.default_rng([split.seed, fragment.index])
    writers: dict[str, pq.ParquetWriter] = {}
    counts = dict.fromkeys(splits.SPLIT_NAMES, 0)
    offset = 0
    # Without rows to drop, the columns go to the transform as arrays, not a DataFrame.
    frames = info.missing == "drop"
    try:
        for batch in fragment_batches(info, fragment, frames=frames):
            kept = kept_rows(batch, info) if frames else batch
            n = len(kept[info.label_column])
            where = codes[offset : offset + n]
            offset += n
            step = pre.chunk_rows or max(n, 1)
            for start in range(0, n, step):
                part = _rows(kept, slice(start, start + step))
                x = pre.inputs(part)
                y = pre.labels(part[info.label_column])
                for i, split_name in enumerate(splits.SPLIT_NAMES):
                    rows = np.flatnonzero(where[start : start + step] == i)
                    if split_name == "train":
                        rows = rng.permutation(rows)
                    if len(rows):
                        where_to = join(folder, split_name, name)
                        _write(writers, split_name, where_to, _table(x, y, rows), pre)
                        counts[split_name] += len(rows)
    finally:
        for writer in writers.values():
            writer.close()
    return counts


def _rows(batch, rows: slice):
    """Some rows of a batch: a DataFrame, or a dict of column arrays."""
    return batch.iloc[rows] if hasattr(batch, "iloc") else {c: v[rows] for c, v in batch.items()}


def _table(x: dict[str, np.ndarray], y: np.ndarray, rows: np.ndarray):
    """Some rows of prepared inputs (``features``, a transform's arrays) and labels, as
    the split's Parquet holds them: a tensor column per input (:mod:`tensors`), then ``label``."""
    return tensors.table({name: v[rows] for name, v in x.items()}, {LABEL: y[rows]})


def _write(writers: dict, split_name: str, location: str, table, pre: Preprocessor) -> None:
    """Append ``table`` to the split's file of this fragment, opened on its first rows."""
    import pyarrow.parquet as pq

    if split_name not in writers:
        fs, path = location_filesystem(location)
        fs.create_dir(path.rpartition("/")[0], recursive=True)
        # Dictionary encoding and statistics of feature tensors cost time and help no
        # reader: splits are read whole.
        writers[split_name] = pq.ParquetWriter(
            path,
            table.schema,
            filesystem=fs,
            use_dictionary=[LABEL] if not pre.is_regression else False,
            write_statistics=False,
        )
    writers[split_name].write_table(table)


def select_fragment(info: SourceInfo, fragment: Fragment, split: SplitConfig, codes, code: int):
    """The fragment's raw kept rows whose split is ``code`` (``codes``: each kept row's
    split, or None to place each row by its own hash); with a transform, the source's
    rows it is handed, placed by its output as preparing placed them."""
    import pandas as pd

    parts = []
    offset = 0
    for raw in fragment_batches(info, fragment, raw=True):
        batch = readers.transformed(info, raw) if info.transform else raw
        kept = kept_rows(batch, info)
        if codes is None:
            keys = splits.row_keys(kept, info, split.seed)
            where = splits.hash_split_codes(keys, val=split.val, test=split.test)
        else:
            where = codes[offset : offset + len(kept)]
        offset += len(kept)
        rows = raw.loc[kept.index] if info.transform else kept
        parts.append(rows[where == code])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


# The driver's side.


def plan(info: SourceInfo, threads: int) -> list[Fragment]:
    """The fragments of the input, data.limit applied; an input without rows fails.
    ``threads``: of this process, to count rows on (0: Ray tasks), as :func:`runner.run`."""
    fragments = readers.plan_fragments(info)
    if readers.needs_counts(info):
        counts = runner.run(readers.count_rows, [(info, f) for f in fragments], threads)
        fragments = readers.limit_fragments(info, fragments, counts)
    if not fragments:
        raise DataError(f"data.source {info.source}: no rows")
    return fragments


def image_shape(info: SourceInfo, cfg: PreprocessConfig) -> list[int] | None:
    """[channels, height, width] every image is resized to: data.image_size, else the
    size of the input's first image (read from its header; a torchvision dataset's, from
    its conversion). A normalization of other channels fails here (ConfigError)."""
    if not info.is_images:
        return None
    channels = 3 if info.image_mode == "RGB" else 1
    if cfg.image_mean is not None and len(cfg.image_mean) != channels:
        raise ConfigError(
            "preprocess.image_mean and image_std: one value per channel, and the images have "
            f"{channels} (data.image_mode {info.image_mode}), not {len(cfg.image_mean)}"
        )
    if cfg.image_size is not None:
        return [channels, *cfg.image_size]
    if info.format == "image_parquet":
        return [channels, *sources.converted_meta(info.location)["shape"][:2]]
    from PIL import Image

    with filesystem(info).open_input_file(info.files[0]) as f:
        width, height = Image.open(f).size
    return [channels, height, width]


@dataclass
class Placement:
    """Where every kept row of the input goes, and what the passes learned on the way."""

    counts: RowCounts
    codes: list[np.ndarray | None]  # per fragment: each kept row's split (None: by its hash)
    exact: bool
    train: FitStats | None = None  # the train split's statistics, when fitted


def place_rows(
    info: SourceInfo,
    split: SplitConfig,
    fragments: list[Fragment],
    threads: int,
    *,
    scaler: str = "none",
    shape: list[int] | None = None,
    kept: int | None = None,
) -> Placement:
    """The scan: the rows checked and each kept row's split (exact for small inputs).
    ``kept``: the kept rows when already known (a split rebuilt later), which decides
    exact or hashed without a pass for a hashed split."""
    candidate = splits.small_input(info) and (kept is None or splits.split_is_exact(info, kept))
    if kept is not None and not candidate:
        return Placement(RowCounts(), [None] * len(fragments), exact=False)
    calls = [(info, f, split, scaler, candidate, shape) for f in fragments]
    scans = runner.run(scan_fragment, calls, threads)
    counts = RowCounts()
    train = FitStats()
    for s in scans:
        counts.merge(s.counts)
        train.merge(s.train)
    counts.check(info)
    if not candidate:
        return Placement(counts, [s.codes for s in scans], exact=False, train=train)
    if not splits.split_is_exact(info, counts.kept):
        return Placement(counts, [None] * len(fragments), exact=False)
    codes = splits.exact_split_codes(
        [np.concatenate(s.keys or [np.zeros(0, np.uint64)]) for s in scans],
        [np.concatenate(s.labels or [np.zeros(0)]) for s in scans],
        # A regression's label is a number, not a class to stratify by.
        split if info.objective == "classification" else split.model_copy(update={"stratify": False}),
    )
    return Placement(counts, list(codes), exact=True)


def prepare(
    info: SourceInfo, split: SplitConfig, cfg: PreprocessConfig, cache_root: str | Path
) -> PreparedEntry:
    """Check the rows, split, fit on train, transform and write every split into the
    cache entry for this input and config, all or nothing; or reuse a finished entry.
    ``cache_root``: a local folder or a URI."""
    key = cache_key(info, split, cfg)
    found = finished_entry(cache_root, key)
    if found:
        return found
    threads = driver_threads(info)
    # In the driver the passes run here, one after another: the rows each fragment's
    # first pass read, and a tokenizer's batches, are kept for the passes after it (in
    # Ray tasks each pass is a task of its own).
    with ExitStack() as remembering:
        if threads:
            remembering.enter_context(readers.remembered())
            remembering.enter_context(tokenizer.remembered())
        return _prepare(info, split, cfg, cache_root, key, threads)


def _prepare(
    info: SourceInfo,
    split: SplitConfig,
    cfg: PreprocessConfig,
    cache_root: str | Path,
    key: str,
    threads: int,
) -> PreparedEntry:
    clock = time.perf_counter()
    tasks_info = replace(info, dataset=None)  # what each Ray task is handed
    fragments = plan(info, threads)
    shape = image_shape(info, cfg)
    # Images normalized by a given mean and std need no pixel statistics.
    scaler = "none" if info.is_images and cfg.image_mean is not None else cfg.scaler
    placed = place_rows(tasks_info, split, fragments, threads, scaler=scaler, shape=shape)
    if placed.train is None:  # each row's split given: fitting is a pass of its own
        codes = zip(fragments, placed.codes, strict=True)
        calls = [(tasks_info, f, split, scaler, c, shape) for f, c in codes]
        fits = runner.run(fit_fragment, calls, threads)
        placed.codes = [s.codes for s in fits]
        placed.train = FitStats()
        for s in fits:
            placed.train.merge(s.train)
    classes = info.classes if info.classes is not None else placed.counts.sorted_labels()
    pre = placed.train.preprocessor(info, classes, cfg, shape)
    scanned = time.perf_counter() - clock
    # Fragments' files are named in a seeded random order: a reader of the train split
    # meets them shuffled even when the input was sorted (by label, say).
    names = np.random.default_rng(split.seed).permutation(len(fragments))
    dropped = placed.counts.missing_rows  # the checks let them through only for data.missing=drop
    with staging(join(cache_root, key)) as tmp:
        counts = dict.fromkeys(splits.SPLIT_NAMES, 0)
        calls = [
            (tasks_info, f, split, c, pre.to_dict(), tmp, f"part-{names[f.index]:05d}.parquet")
            for f, c in zip(fragments, placed.codes, strict=True)
        ]
        for written in runner.run(write_fragment, calls, threads):
            for name, n in written.items():
                counts[name] += n
        finish_entry(tmp, pre, counts, placed.train.profile.to_dict(label=info.label_column))
    log.info(
        "prepared %s rows of %s in %d fragments%s (%s split): checked and fitted in %.1f s, "
        "written in %.1f s",
        f"{placed.counts.kept:,}",
        info.source,
        len(fragments),
        f" on {threads} thread(s) of the driver" if threads else "",
        "exact" if placed.exact else "hashed",
        scanned,
        time.perf_counter() - clock - scanned,
    )
    # The entry as published: the renamed folder, or on a URI the attempt the marker names.
    return finished_entry(cache_root, key).with_run(reused=False, dropped=dropped)


def raw_split(info: SourceInfo, split: SplitConfig, name: str, *, kept_rows: int) -> ray.data.Dataset:
    """The raw rows of one split (the input columns and the label; images with their
    paths; with a transform, the source's columns it is handed) as :func:`prepare`
    placed them (``kept_rows``: the rows it kept, all of the splits'), read again from
    the source: for scoring another model on exactly this run's rows with that model's
    own preprocessing."""
    threads = driver_threads(info)
    tasks_info = replace(info, dataset=None)
    fragments = plan(info, threads)
    placed = place_rows(tasks_info, split, fragments, threads, kept=kept_rows)
    code = splits.SPLIT_NAMES.index(name)
    calls = [(tasks_info, f, split, c, code) for f, c in zip(fragments, placed.codes, strict=True)]
    return runner.run_to_dataset(select_fragment, calls, threads)
