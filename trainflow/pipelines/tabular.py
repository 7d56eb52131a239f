"""Tabular inputs prepared by Ray tasks, one per fragment of the input (in the driver
when the input is one small file: :func:`prepares_in_driver`).

A fragment is a slice of the input that one task reads with pyarrow, batch by batch in
bounded memory: a run of a Parquet file's row groups (about FRAGMENT_BYTES of rows), a
CSV, JSON lines or NumPy file, or the builtin digits. :func:`prepare_tabular` passes
over the input two times, three for an exact split:

1. scan: per fragment, the row checks' counts (:func:`~trainflow.pipelines.data.batch_stats`)
   and, for a split by row hash, the train split's statistics; for an exact split each
   kept row's label and seeded hash instead, from which the driver ranks every class;
2. fit (exact split only): the train split's statistics, each row's split given;
3. write: split, transform and write each split's rows as Parquet, one file per
   fragment and split, into the entry's temporary folder.

The work per row is the same as the Ray Data path's (image folders still take it), but
a Dataset per pass costs a streaming execution, its actors and fresh worker processes:
1.5 to 2 s per pass on 2 cores, where reading a 250,000-row fragment takes 0.1 s
(``benchmarks/ingest.py --phases``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainflow.config import PreprocessConfig, SplitConfig
from trainflow.pipelines.data import (
    SPLITS,
    DataError,
    SourceInfo,
    _digits_frame,
    _filesystem,
    _plain,
    batch_stats,
    hash_split_codes,
    rank_split_codes,
    row_keys,
    row_report,
    small_input,
    split_is_exact,
    value_order,
)
from trainflow.pipelines.preprocess import (
    FEATURES,
    LABEL,
    MAX_VOCABULARY,
    Preprocessor,
    finish_entry,
    staging,
)

log = logging.getLogger("trainflow")

FORMATS = ("parquet", "csv", "json", "numpy", "digits")
# About this many bytes of decoded rows per fragment (Parquet row groups are grouped
# up to it); a CSV, JSON lines or NumPy file is one fragment whatever its size.
FRAGMENT_BYTES = 64 << 20
# Rows a task holds at once: up to BATCH_ROWS, fewer for wide inputs, so that a batch's
# float64 features (scaled in float64) stay near BATCH_BYTES.
BATCH_ROWS = 65_536
BATCH_BYTES = 64 << 20


def batch_rows(info: SourceInfo) -> int:
    return max(1024, min(BATCH_ROWS, BATCH_BYTES // (8 * (len(info.feature_columns) + 1))))


@dataclass(frozen=True)
class Fragment:
    index: int
    path: str = ""  # on the source's filesystem; "" for the builtin digits
    row_groups: tuple[int, ...] | None = None  # Parquet: these row groups only
    max_rows: int | None = None  # data.limit: read no more than this many rows
    frame: pd.DataFrame | None = field(default=None, repr=False, compare=False)  # digits: the rows


def plan_fragments(info: SourceInfo) -> list[Fragment]:
    """The input cut into fragments, in the input's order (data.limit counts from the
    first row of the first file). Reads only Parquet footers."""
    if info.format == "digits":
        # Loaded here, where inspect_source imported scikit-learn, not in a worker.
        return [Fragment(0, max_rows=info.limit, frame=_digits_frame())]
    if info.format != "parquet":
        # Row counts of text files are unknown until read: data.limit then goes through
        # a counting pass (see _limit_by_counts).
        return [Fragment(i, path) for i, path in enumerate(info.files)]
    import pyarrow.parquet as pq

    fs = _filesystem(info)
    fragments: list[Fragment] = []
    left = info.limit
    for path in info.files:
        with fs.open_input_file(path) as f:
            meta = pq.ParquetFile(f).metadata
        groups: list[int] = []
        rows = size = 0
        for g in range(meta.num_row_groups):
            if left is not None and left <= 0:
                break
            group = meta.row_group(g)
            groups.append(g)
            rows, size = rows + group.num_rows, size + group.total_byte_size
            if left is not None:
                left -= group.num_rows
            if size >= FRAGMENT_BYTES:
                fragments.append(_parquet_fragment(len(fragments), path, groups, rows, left))
                groups, rows, size = [], 0, 0
        if groups:
            fragments.append(_parquet_fragment(len(fragments), path, groups, rows, left))
    return fragments


def _parquet_fragment(index: int, path: str, groups: list[int], rows: int, left: int | None) -> Fragment:
    # A negative ``left`` means the limit falls inside these row groups.
    cap = rows + left if left is not None and left < 0 else None
    return Fragment(index, path, tuple(groups), cap)


def fragment_batches(
    info: SourceInfo, fragment: Fragment, *, frames: bool = True
) -> Iterator[pd.DataFrame | dict[str, np.ndarray]]:
    """The fragment's rows (the feature columns and the label), at most :func:`batch_rows`
    at a time: DataFrames, or with ``frames=False`` a dict of column arrays (no copy into
    pandas' blocks); an unreadable file is a DataError naming it."""
    import pyarrow as pa

    columns = [*info.feature_columns, info.label_column]
    left = fragment.max_rows
    try:
        for batch in _read(info, fragment, columns, batch_rows(info)):
            if left is not None:
                if left <= 0:
                    return
                batch = batch.iloc[:left] if isinstance(batch, pd.DataFrame) else batch.slice(0, left)
                left -= len(batch)
            if isinstance(batch, pd.DataFrame):
                yield batch if frames else {c: batch[c].to_numpy() for c in columns}
            else:
                yield batch.to_pandas() if frames else _arrays(batch)
    except (pa.ArrowException, OSError, ValueError, EOFError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        where = fragment.path or info.source
        message = f"data.source {info.source}: cannot read {where} as {info.format}: {message}"
        raise DataError(message) from None


def _read(info: SourceInfo, fragment: Fragment, columns: list[str], rows: int) -> Iterator[Any]:
    """Arrow record batches (a DataFrame for digits) of the fragment's columns."""
    if fragment.frame is not None:
        yield fragment.frame[columns]
        return
    fs = _filesystem(info)
    if info.format == "parquet":
        import pyarrow.parquet as pq

        with fs.open_input_file(fragment.path) as f:
            groups = list(fragment.row_groups) if fragment.row_groups is not None else None
            yield from pq.ParquetFile(f).iter_batches(batch_size=rows, row_groups=groups, columns=columns)
    elif info.format == "csv":
        import pyarrow.csv as pacsv

        # The column types inspect_source checked (inferred from the file's first block):
        # a later value that does not parse as its column's type fails naming the file.
        types = _text_schema(fs, fragment.path, "csv")
        with fs.open_input_stream(fragment.path) as f:
            reader = pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(block_size=16 << 20),
                convert_options=pacsv.ConvertOptions(
                    include_columns=columns, column_types={c: types.field(c).type for c in columns}
                ),
            )
            for batch in reader:
                yield from _rebatch(batch, rows)
    elif info.format == "json":
        import pyarrow.json as pajson

        types = _text_schema(fs, fragment.path, "json")
        with fs.open_input_stream(fragment.path) as f:
            reader = pajson.open_json(
                f,
                read_options=pajson.ReadOptions(block_size=16 << 20),
                parse_options=pajson.ParseOptions(explicit_schema=types),
            )
            for batch in reader:
                yield from _rebatch(batch.select(columns), rows)
    elif info.format == "numpy":
        from trainflow.pipelines.sources import numpy_frame

        with fs.open_input_stream(fragment.path) as f:
            frame = pd.DataFrame(numpy_frame(f.read(), fragment.path))[columns]
        for start in range(0, len(frame), rows):
            yield frame.iloc[start : start + rows]
    else:
        raise DataError(f"data.format {info.format!r}: not a tabular format ({', '.join(FORMATS)})")


def _arrays(batch) -> dict[str, np.ndarray]:
    return {name: batch.column(name).to_numpy(zero_copy_only=False) for name in batch.schema.names}


def _text_schema(fs, path: str, fmt: str):
    import pyarrow.dataset as pads

    return pads.dataset(path, format=fmt, filesystem=fs).schema


def _rebatch(batch, rows: int):
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


def kept_rows(batch: pd.DataFrame, info: SourceInfo) -> pd.DataFrame:
    """The rows that are split and trained on: all, or for data.missing=drop those
    without a missing value (any other missing value fails the scan)."""
    if info.missing != "drop":
        return batch
    return batch.dropna(subset=[*info.feature_columns, info.label_column])


@dataclass
class TrainStats:
    """What fitting needs of the train split, mergeable across batches and fragments:
    per numeric column the count, mean and sum of squared deviations (Chan's parallel
    update, stable where sums of squares are not) or the minimum and maximum, and the
    categories of each categorical column."""

    rows: int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    categories: dict[str, set] = field(default_factory=dict)

    def add(self, frame: pd.DataFrame, info: SourceInfo, scaler: str) -> None:
        if frame.empty:
            return
        numeric = info.numeric_columns
        if numeric and scaler != "none":
            x = frame[numeric].to_numpy(dtype=np.float64)
            if scaler == "standard":
                mean = x.mean(axis=0)
                self._merge_moments(len(x), mean, ((x - mean) ** 2).sum(axis=0))
            else:
                self._merge_range(x.min(axis=0), x.max(axis=0))
        for c in info.categorical_columns:
            values = self.categories.setdefault(c, set())
            if len(values) <= MAX_VOCABULARY:
                values.update(_plain(v) for v in frame[c].dropna().unique()[: MAX_VOCABULARY + 1])
        self.rows += len(frame)

    def merge(self, other: TrainStats) -> None:
        if other.mean is not None:
            self._merge_moments(other.rows, other.mean, other.m2)
        if other.lo is not None:
            self._merge_range(other.lo, other.hi)
        for c, values in other.categories.items():
            self.categories.setdefault(c, set()).update(values)
        self.rows += other.rows

    def _merge_moments(self, n: int, mean: np.ndarray, m2: np.ndarray) -> None:
        if self.mean is None:
            self.mean, self.m2 = mean, m2
            return
        total = self.rows + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.rows * n / total)

    def _merge_range(self, lo: np.ndarray, hi: np.ndarray) -> None:
        self.lo = lo if self.lo is None else np.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else np.maximum(self.hi, hi)

    def preprocessor(self, info: SourceInfo, classes: list[Any], cfg: PreprocessConfig) -> Preprocessor:
        """The fitted state, as :func:`~trainflow.pipelines.preprocess.fit_preprocessor`
        fits it on a Dataset."""
        if self.rows == 0:
            raise DataError("the train split is empty; add rows or change data.split")
        numeric = info.numeric_columns
        scale = cfg.scaler != "none"
        pre = Preprocessor(list(numeric), info.label_column, list(classes), scale, scaler=cfg.scaler)
        if scale and numeric:
            if cfg.scaler == "standard":
                offset, spread = self.mean, np.sqrt(self.m2 / self.rows)
            else:
                offset, spread = self.lo, self.hi - self.lo
            pre.mean = [float(v) for v in offset]
            # A constant column (std or range 0) is shifted but not scaled.
            pre.std = [float(v) or 1.0 for v in spread]
        for c in info.categorical_columns:
            values = self.categories.get(c, set())
            if len(values) > MAX_VOCABULARY:
                raise DataError(
                    f"data.categorical_columns: {c!r} has more than {MAX_VOCABULARY} categories in the "
                    "train split; fewer are one-hot encoded"
                )
            pre.categorical[c] = sorted(values, key=value_order)
        return pre


# What each pass runs in a Ray task, one task per fragment.


def scan_fragment(
    info: SourceInfo, fragment: Fragment, split: SplitConfig, scaler: str, exact: bool
) -> dict[str, Any]:
    """Row counts per batch; and either each kept row's label and hash (``exact``), or
    each kept row's split by its own hash and the train split's statistics."""
    features = info.feature_columns
    stats, keys, labels, codes, train = [], [], [], [], TrainStats()
    for batch in fragment_batches(info, fragment):
        stats.append(
            batch_stats(batch, features=features, numeric=info.numeric_columns, label=info.label_column)
        )
        kept = kept_rows(batch, info)
        if exact:
            keys.append(row_keys(kept, split.seed))
            labels.append(kept[info.label_column].to_numpy())
        else:
            codes.append(hash_split_codes(kept, val=split.val, test=split.test, seed=split.seed))
            train.add(kept[codes[-1] == 0], info, scaler)
    return {
        "stats": pd.concat(stats) if stats else pd.DataFrame(),
        "keys": np.concatenate(keys) if keys else None,
        "labels": np.concatenate(labels) if labels else None,
        "codes": None if exact else np.concatenate(codes) if codes else np.zeros(0, dtype=np.int8),
        "train": train,
    }


def fit_fragment(
    info: SourceInfo, fragment: Fragment, split: SplitConfig, scaler: str, codes: np.ndarray | None
) -> tuple[TrainStats, np.ndarray]:
    """The train split's statistics, each kept row's split given by ``codes`` or, when
    None, by its own hash; returns them with the codes."""
    train, offset, placed = TrainStats(), 0, []
    for batch in fragment_batches(info, fragment):
        kept = kept_rows(batch, info)
        if codes is None:
            placed.append(hash_split_codes(kept, val=split.val, test=split.test, seed=split.seed))
        else:
            placed.append(codes[offset : offset + len(kept)])
        train.add(kept[placed[-1] == 0], info, scaler)
        offset += len(kept)
    return train, np.concatenate(placed) if placed else np.zeros(0, dtype=np.int8)


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
    row's split) to ``folder/<split>/<name>``; the train rows of each batch in a seeded
    random order. Returns the rows per split."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray.data.extensions import ArrowTensorArray

    pre = Preprocessor.from_dict(state)
    rng = np.random.default_rng([split.seed, fragment.index])
    writers: dict[str, pq.ParquetWriter] = {}
    counts = dict.fromkeys(SPLITS, 0)
    offset = 0
    # Without rows to drop, the columns go to the transform as arrays, not a DataFrame.
    frames = info.missing == "drop"
    try:
        for batch in fragment_batches(info, fragment, frames=frames):
            kept = kept_rows(batch, info) if frames else batch
            n = len(kept[info.label_column])
            where = codes[offset : offset + n]
            offset += n
            if not n:
                continue
            x, y = pre.features(kept), pre.labels(kept[info.label_column])
            for i, split_name in enumerate(SPLITS):
                rows = np.flatnonzero(where == i)
                if split_name == "train":
                    rows = rng.permutation(rows)
                if not len(rows):
                    continue
                table = pa.table({FEATURES: ArrowTensorArray.from_numpy(x[rows]), LABEL: y[rows]})
                if split_name not in writers:
                    path = Path(folder) / split_name / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    # Dictionary encoding and statistics of feature tensors cost time
                    # and help no reader: splits are read whole.
                    writers[split_name] = pq.ParquetWriter(
                        str(path), table.schema, use_dictionary=[LABEL], write_statistics=False
                    )
                writers[split_name].write_table(table)
                counts[split_name] += len(rows)
    finally:
        for writer in writers.values():
            writer.close()
    return counts


def count_rows(info: SourceInfo, fragment: Fragment) -> int:
    return sum(len(b) for b in fragment_batches(info, fragment))


# A tabular input of one file up to this size is prepared in the driver: its one
# fragment gains nothing from a Ray task, which costs a worker process of its own
# (Python, pandas and pyarrow imports) and the round trips to it.
IN_DRIVER_BYTES = 16 << 20


def prepares_in_driver(info: SourceInfo) -> bool:
    """Whether :func:`prepare_tabular` prepares this input in this process rather than in
    Ray tasks: the bundled digits, or one Parquet, CSV, JSON lines or NumPy file of at
    most :data:`IN_DRIVER_BYTES`."""
    if info.format == "digits":
        return True
    return info.format != "images" and len(info.files) == 1 and info.bytes <= IN_DRIVER_BYTES


def worker_modules(info: SourceInfo) -> tuple[str, ...]:
    """What the Ray workers that prepare this input import (for a run to start them early,
    ``runtime.warm_workers``); none when it is prepared in the driver."""
    return () if prepares_in_driver(info) else (__name__,)


def _run(fn, calls: list[tuple], in_driver: bool = False) -> list[Any]:
    """``fn`` as a Ray task per argument tuple (or called here, ``in_driver``); a
    DataError raised in a task is raised here as itself, without Ray's traceback."""
    if in_driver:
        return [fn(*args) for args in calls]
    import ray

    remote = ray.remote(fn).options(num_cpus=1)
    try:
        return ray.get([remote.remote(*args) for args in calls])
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, DataError):
            raise e.cause from None
        raise


def _limit_by_counts(info: SourceInfo, fragments: list[Fragment], in_driver: bool) -> list[Fragment]:
    """data.limit over files whose row counts only reading tells: the first N rows."""
    counts = _run(count_rows, [(info, f) for f in fragments], in_driver)
    out, left = [], info.limit
    for f, n in zip(fragments, counts, strict=True):
        if left <= 0:
            break
        out.append(Fragment(len(out), f.path, f.row_groups, min(n, left), f.frame))
        left -= n
    return out


def exact_split_codes(
    keys: list[np.ndarray], labels: list[np.ndarray], split: SplitConfig
) -> list[np.ndarray]:
    """Every kept row's split, ranked within its class (or among all rows when the split
    is not stratified) by its seeded hash: the same rows per class as
    :func:`~trainflow.pipelines.data.assign_split` on each label group."""
    k = np.concatenate(keys)
    codes = np.zeros(len(k), dtype=np.int8)
    if split.stratify:
        groups, _ = pd.factorize(pd.Series(np.concatenate(labels)))
        members = np.argsort(groups, kind="stable")
        bounds = np.flatnonzero(np.diff(groups[members])) + 1
        parts = np.split(members, bounds)
    else:
        parts = [np.arange(len(k))]
    for rows in parts:
        codes[rows] = rank_split_codes(k[rows], val=split.val, test=split.test)
    return np.split(codes, np.cumsum([len(x) for x in keys])[:-1])


def prepare_tabular(
    info: SourceInfo, split: SplitConfig, cfg: PreprocessConfig, out: Path
) -> tuple[Preprocessor, dict[str, int], int]:
    """Check, split, fit and write a tabular input into the cache entry ``out``, all or
    nothing; returns the preprocessor, the rows per split and the rows dropped."""
    clock = time.perf_counter()
    in_driver = prepares_in_driver(info)
    fragments = plan_fragments(info)
    if info.limit is not None and info.format in ("csv", "json", "numpy"):
        fragments = _limit_by_counts(info, fragments, in_driver)
    if not fragments:
        raise DataError(f"data.source {info.source}: no rows")
    # Small inputs may be split exactly per class: their rows' hashes fit in the driver.
    candidate = small_input(info)
    scans = _run(scan_fragment, [(info, f, split, cfg.scaler, candidate) for f in fragments], in_driver)
    report = row_report(
        pd.concat([s["stats"] for s in scans if not s["stats"].empty] or [pd.DataFrame()]), info
    )
    dropped = report.missing_rows  # row_report let them through only for data.missing=drop
    classes = info.classes if info.classes is not None else report.labels
    exact = split_is_exact(info, report.rows - dropped)
    train = TrainStats()
    if candidate:
        # Exact: every row ranked within its class here; else (too many rows) by hash.
        given = [None] * len(fragments)
        if exact:
            given = exact_split_codes([s["keys"] for s in scans], [s["labels"] for s in scans], split)
        fits = _run(
            fit_fragment,
            [(info, f, split, cfg.scaler, c) for f, c in zip(fragments, given, strict=True)],
            in_driver,
        )
        codes = [placed for _, placed in fits]
        for stats, _ in fits:
            train.merge(stats)
    else:
        codes = [s["codes"] for s in scans]
        for s in scans:
            train.merge(s["train"])
    pre = train.preprocessor(info, classes, cfg)
    scanned = time.perf_counter() - clock
    # Fragments' files are named in a seeded random order: a reader of the train split
    # meets them shuffled even when the input was sorted (by label, say).
    names = np.random.default_rng(split.seed).permutation(len(fragments))
    with staging(out) as tmp:
        counts = dict.fromkeys(SPLITS, 0)
        calls = [
            (info, f, split, c, pre.to_dict(), str(tmp), f"part-{names[f.index]:05d}.parquet")
            for f, c in zip(fragments, codes, strict=True)
        ]
        for written in _run(write_fragment, calls, in_driver):
            for name, n in written.items():
                counts[name] += n
        finish_entry(tmp, pre, counts)
    log.info(
        "prepared %s rows of %s in %d fragments%s (%s split): checked and fitted in %.1f s, "
        "written in %.1f s",
        f"{report.rows - dropped:,}",
        info.source,
        len(fragments),
        " in the driver" if in_driver else "",
        "exact" if exact else "hashed",
        scanned,
        time.perf_counter() - clock - scanned,
    )
    return pre, counts, dropped
