"""Sources into ``ray.data.Dataset``: schema checks, a fingerprint, a seeded split.

Tabular inputs are prepared by :mod:`trainflow.pipelines.tabular`, which reuses the row
checks and split codes here; image folders are prepared through the Datasets below,
which also read raw rows again (:func:`raw_split`, batch prediction).

:func:`inspect_source` reads only metadata in the driver (file listings, Parquet
footers, the first block of a CSV, NumPy headers), so a missing file, column or a
wrong dtype fails before any Ray worker starts. :func:`load_dataset` then reads
lazily, and :func:`check_rows` makes one streaming pass over the rows for what only
the rows can tell: missing values, NaN or inf, labels outside the classes, no rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads

from trainflow.config import DataConfig, SplitConfig
from trainflow.pipelines import sources
from trainflow.pipelines.sources import SourceError

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger("trainflow")

DIGITS = "builtin:digits"
TORCHVISION_PREFIX = "torchvision:"
SPLITS = ("train", "val", "test")
SPLIT_COLUMN = "__split"
IMAGE = "image"  # the image column of an image folder source
PATH = "path"  # each image's path: what the split hashes, dropped after the split
# A label with more distinct values than this is almost surely a regression target.
MAX_CLASSES = 1000
# Up to this many rows the split is exact per class (the rows' hashes are ranked in the
# driver, or a group-by holds a class in one task's memory); above it each row's split
# comes from a hash of its content alone, which streams in bounded memory and is
# stratified in expectation.
EXACT_SPLIT_ROWS = 1_000_000
# Inputs up to this size may be split exactly (above: by row hash whatever the row
# count); image folders this small are read once into Ray's object store while they are
# checked, split and fitted, larger ones stream from their files at each pass.
SMALL_INPUT_BYTES = 256 << 20


class DataError(SourceError):
    """Input data that cannot be trained on; the message names the file or column."""


@dataclass(frozen=True)
class SourceInfo:
    """What the driver learned about a source without reading its rows."""

    source: str
    format: str  # "digits" | "parquet" | "csv" | "json" | "numpy" | "images"
    files: list[str]  # paths on the source's filesystem
    label_column: str
    feature_columns: list[str]  # numeric and categorical, in the model's order
    fingerprint: str
    limit: int | None = None  # read only the first N rows
    categorical_columns: list[str] = field(default_factory=list)
    classes: list[Any] | None = None  # declared in the config (or the image folders)
    missing: str = "fail"
    image_mode: str = "RGB"
    location: str = ""  # where the files are: the source, or the torchvision Parquet folder
    bytes: int = 0  # the files' total size

    @property
    def numeric_columns(self) -> list[str]:
        return [c for c in self.feature_columns if c not in self.categorical_columns]


def _digits_frame() -> pd.DataFrame:
    from sklearn.datasets import load_digits

    digits = load_digits()
    frame = pd.DataFrame(
        digits.data.astype(np.float32), columns=[f"pixel_{i}" for i in range(digits.data.shape[1])]
    )
    frame["label"] = digits.target.astype(np.int64)
    return frame


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _is_category(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_integer(t)
        or pa.types.is_boolean(t)
    )


def _file_schema(listing: sources.Listing, path: str, source: str) -> pa.Schema:
    """One file's columns, from its metadata or first block; an unreadable file names itself."""
    try:
        if listing.format == "numpy":
            return sources.numpy_schema(listing.filesystem, path)[0]
        return pads.dataset(path, format=listing.format, filesystem=listing.filesystem).schema
    except (pa.ArrowException, OSError, ValueError, EOFError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        # Arrow wraps the cause in what it tried ("Error creating dataset ... Invalid: ");
        # the cause is what a user acts on.
        message = message.rsplit("Invalid: ", 1)[-1]
        raise DataError(f"data.source {source}: cannot read {path} as {listing.format}: {message}") from None


def _schema(listing: sources.Listing, source: str) -> pa.Schema:
    """The columns every file holds; a file that lacks one of the first file's fails."""
    first = _file_schema(listing, listing.files[0], source)
    for path in listing.files[1:]:
        schema = _file_schema(listing, path, source)
        missing = [c for c in first.names if c not in schema.names]
        if missing:
            raise DataError(
                f"data.source {source}: {path} lacks the columns {', '.join(missing)} "
                f"that {listing.files[0]} holds"
            )
    return first


def inspect_source(cfg: DataConfig, cache_root: Path | None = None) -> SourceInfo:
    """Check that the source exists and holds the configured columns with usable types;
    read no rows. ``cache_root`` holds torchvision downloads (default TRAINFLOW_HOME/cache)."""
    source, fmt, files, location, size = cfg.source, cfg.format, [], cfg.source, 0
    try:
        if source == DIGITS:
            import sklearn

            fmt = "digits"
            schema = pa.Schema.from_pandas(_digits_frame().head(1), preserve_index=False)
            fingerprint = hashlib.sha256(f"{DIGITS}|sklearn {sklearn.__version__}".encode()).hexdigest()[:16]
        elif source.startswith("builtin:"):
            raise DataError(f"data.source {source!r}: the only builtin source is {DIGITS}")
        else:
            if source.startswith(TORCHVISION_PREFIX):
                if cache_root is None:
                    from trainflow.runtime import workspace

                    cache_root = workspace().cache
                name = source.removeprefix(TORCHVISION_PREFIX)
                location = str(sources.torchvision_parquet(name, cache_root / "torchvision"))
                fmt = "parquet"
            listing = sources.list_source(location, fmt)
            fmt, files, size = listing.format, listing.files, sum(listing.sizes)
            fingerprint = sources.fingerprint(listing)
            if fmt == "images":
                schema = pa.schema([(IMAGE, pa.binary()), (cfg.label_column, pa.string())])
            else:
                schema = _schema(listing, source)
    except SourceError as e:
        raise DataError(str(e)) from None

    columns = schema.names
    if cfg.label_column not in columns:
        raise DataError(
            f"data.label_column {cfg.label_column!r} is not a column of {source}; "
            f"its columns are: {', '.join(columns)}"
        )
    features = cfg.feature_columns or [c for c in columns if c != cfg.label_column]
    missing = [c for c in [*features, *cfg.categorical_columns] if c not in columns]
    if missing:
        raise DataError(
            f"data.feature_columns: {', '.join(map(repr, missing))} not in {source}; "
            f"its columns are: {', '.join(columns)}"
        )
    if cfg.label_column in features:
        raise DataError(f"data.feature_columns must not hold the label column {cfg.label_column!r}")
    if not features:
        raise DataError(f"data.feature_columns: {source} has no column besides the label")
    if fmt != "images":
        _check_types(cfg, schema, features)
    classes = cfg.classes
    if fmt == "images":
        found = sorted({sources.image_label(f) for f in files})
        if classes is not None:
            outside = [c for c in found if c not in map(str, classes)]
            if outside:
                raise DataError(
                    f"data.classes: the image folders {outside} of {source} are not among "
                    f"the declared classes {classes}"
                )
            classes = [str(c) for c in classes]
        else:
            classes = found
    return SourceInfo(
        source=source,
        format=fmt,
        files=files,
        label_column=cfg.label_column,
        feature_columns=list(features),
        fingerprint=fingerprint,
        limit=cfg.limit,
        categorical_columns=list(cfg.categorical_columns),
        classes=list(classes) if classes is not None else None,
        missing=cfg.missing,
        image_mode=cfg.image_mode,
        location=location,
        bytes=size,
    )


def source_fingerprint(cfg: DataConfig, cache_root: Path) -> str:
    """What the input is now, without reading its schema: the files' fingerprint (the
    converted Parquet of a torchvision dataset, once there). Cheap enough to decide
    whether a cached inspection still holds."""
    if cfg.source == DIGITS or cfg.source.startswith("builtin:"):
        import sklearn

        return f"{cfg.source}|sklearn {sklearn.__version__}"
    location = cfg.source
    if cfg.source.startswith(TORCHVISION_PREFIX):
        location = str(cache_root / "torchvision" / f"{cfg.source.removeprefix(TORCHVISION_PREFIX)}.parquet")
        if not (Path(location) / "_done.json").is_file():
            return "torchvision: not converted yet"
    try:
        return sources.fingerprint(sources.list_source(location, cfg.format))
    except SourceError as e:
        return f"unreadable: {e}"  # inspect_source raises it with the details


def _check_types(cfg: DataConfig, schema: pa.Schema, features: list[str]) -> None:
    label_type = schema.field(cfg.label_column).type
    if not _is_category(label_type):
        raise DataError(
            f"data.label_column {cfg.label_column!r} in {cfg.source} is {label_type}; a class label "
            "must hold integers, strings or booleans"
        )
    if cfg.classes is not None:
        want = str if pa.types.is_string(label_type) or pa.types.is_large_string(label_type) else int
        wrong = [c for c in cfg.classes if not isinstance(c, want)]
        if wrong:
            raise DataError(
                f"data.classes {wrong} are not {want.__name__}s like the label column "
                f"{cfg.label_column!r} ({label_type})"
            )
    categorical = set(cfg.categorical_columns)
    not_numeric = [
        f"{c} ({schema.field(c).type})"
        for c in features
        if c not in categorical and not _is_numeric(schema.field(c).type)
    ]
    if not_numeric:
        raise DataError(
            f"data.feature_columns: {', '.join(not_numeric)} in {cfg.source} are not numeric; "
            "features must be int, float or bool columns (list the others in data.categorical_columns)"
        )
    not_category = [
        f"{c} ({schema.field(c).type})" for c in categorical if not _is_category(schema.field(c).type)
    ]
    if not_category:
        raise DataError(
            f"data.categorical_columns: {', '.join(not_category)} in {cfg.source} hold neither "
            "strings, integers nor booleans"
        )


def _filesystem(info: SourceInfo):
    return sources.resolve(info.location or info.source)[0]


def _label_from_path(batch: dict[str, np.ndarray], *, label_column: str) -> dict[str, np.ndarray]:
    paths = batch[PATH]
    return {IMAGE: batch[IMAGE], PATH: paths, label_column: np.array([sources.image_label(p) for p in paths])}


def _read_numpy(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    files = [sources.numpy_frame(b, p) for b, p in zip(batch["bytes"], batch["path"], strict=True)]
    return {column: np.concatenate([f[column] for f in files]) for column in files[0]}


def load_dataset(info: SourceInfo) -> ray.data.Dataset:
    """The source as a lazy Dataset: the feature columns and the label (image folders:
    ``image``, ``label`` and each image's ``path``)."""
    import ray.data

    columns = [*info.feature_columns, info.label_column]
    if info.format == "digits":
        ds = ray.data.from_pandas(_digits_frame()[columns])
    elif info.format == "images":
        ds = ray.data.read_images(
            info.files, filesystem=_filesystem(info), mode=info.image_mode, include_paths=True
        ).map_batches(_label_from_path, fn_kwargs={"label_column": info.label_column}, batch_format="numpy")
    elif info.format == "parquet":
        ds = ray.data.read_parquet(info.files, filesystem=_filesystem(info), columns=columns)
    elif info.format == "csv":
        ds = ray.data.read_csv(info.files, filesystem=_filesystem(info)).select_columns(columns)
    elif info.format == "json":
        ds = ray.data.read_json(info.files, filesystem=_filesystem(info)).select_columns(columns)
    elif info.format == "numpy":
        ds = (
            ray.data.read_binary_files(info.files, filesystem=_filesystem(info), include_paths=True)
            .map_batches(_read_numpy, batch_size=1, batch_format="numpy")
            .select_columns(columns)
        )
    else:
        raise DataError(f"data.format {info.format!r} is not a format trainflow reads")
    return ds.limit(info.limit) if info.limit else ds


# The row checks: one streaming pass, one small row of counts per block.


def batch_stats(batch: pd.DataFrame, *, features: list[str], numeric: list[str], label: str) -> pd.DataFrame:
    """Counts for one batch: rows, rows with a missing value, per-column nulls/NaN/inf, labels."""
    missing = batch[[*features, label]].isna()
    stats: dict[str, Any] = {"rows": len(batch), "missing_rows": int(missing.any(axis=1).sum())}
    for c in [*features, label]:
        stats[f"missing:{c}"] = int(missing[c].sum())
    for c in numeric:
        values = pd.to_numeric(batch[c], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        stats[f"inf:{c}"] = int(np.isinf(values).sum())
    labels = batch[label].dropna().unique().tolist()[: MAX_CLASSES + 1]
    stats["labels"] = json.dumps(sorted(map(_plain, labels), key=str))
    return pd.DataFrame([stats])


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def value_order(v: Any) -> tuple[str, Any]:
    """Sorts labels and categories: numbers as numbers, strings as strings."""
    return ("0" if isinstance(v, (bool, int, float)) else type(v).__name__, v)


@dataclass
class RowReport:
    rows: int
    missing_rows: int
    missing: dict[str, int]
    inf: dict[str, int]
    labels: list[Any]


def check_rows(ds: ray.data.Dataset, info: SourceInfo) -> RowReport:
    """Missing values, NaN or inf, labels, rows: one pass over the data on Ray, then the
    errors that would spoil training, each naming the column and how many rows."""
    features = [] if info.format == "images" else info.feature_columns
    numeric = [] if info.format == "images" else info.numeric_columns
    per_block = ds.map_batches(
        batch_stats,
        fn_kwargs={"features": features, "numeric": numeric, "label": info.label_column},
        batch_format="pandas",
        batch_size=None,
        zero_copy_batch=True,
    ).to_pandas()  # one row per block: a few numbers each
    return row_report(per_block, info)


def row_report(per_block: pd.DataFrame, info: SourceInfo) -> RowReport:
    """The counts of :func:`batch_stats`, one row per batch, summed; then the errors that
    would spoil training, each naming the column and how many rows."""
    features = [] if info.format == "images" else info.feature_columns
    numeric = [] if info.format == "images" else info.numeric_columns
    src = info.source
    if per_block.empty or int(per_block["rows"].sum()) == 0:
        raise DataError(f"data.source {src}: no rows")
    labels = sorted({v for cell in per_block["labels"] for v in json.loads(cell)}, key=value_order)
    report = RowReport(
        rows=int(per_block["rows"].sum()),
        missing_rows=int(per_block["missing_rows"].sum()),
        missing={c: int(per_block[f"missing:{c}"].sum()) for c in [*features, info.label_column]},
        inf={c: int(per_block[f"inf:{c}"].sum()) for c in numeric},
        labels=labels,
    )
    for c, n in report.inf.items():
        if n:
            raise DataError(f"data.source {src}: column {c!r} holds inf in {n} of {report.rows} rows")
    if report.missing_rows and info.missing == "fail":
        c, n = next((c, n) for c, n in report.missing.items() if n)
        raise DataError(
            f"data.source {src}: column {c!r} has {n} missing values (null or NaN) in {report.rows} rows; "
            "set data.missing=drop to drop such rows"
        )
    if report.missing_rows == report.rows:
        raise DataError(f"data.source {src}: every one of its {report.rows} rows has a missing value")
    if info.classes is not None:
        declared = {str(c) for c in info.classes}
        outside = [v for v in labels if str(v) not in declared]
        if outside:
            raise DataError(
                f"data.label_column {info.label_column!r}: labels {outside[:5]} in {src} are outside "
                f"data.classes {info.classes}"
            )
    elif len(labels) > MAX_CLASSES:
        raise DataError(
            f"data.label_column {info.label_column!r} has more than {MAX_CLASSES} distinct values; "
            "a classifier label has fewer"
        )
    if len(info.classes or labels) < 2:
        raise DataError(f"data.label_column {info.label_column!r} needs at least 2 classes, found {labels}")
    return report


def drop_missing(batch: pd.DataFrame, *, columns: list[str]) -> pd.DataFrame:
    return batch.dropna(subset=columns)


def class_values(ds: ray.data.Dataset, label_column: str) -> list[Any]:
    """The sorted distinct labels: index i of the model's output is class_values[i]."""
    values = ds.unique(label_column)
    if any(v is None or (isinstance(v, float) and np.isnan(v)) for v in values):
        raise DataError(f"data.label_column {label_column!r} has missing values")
    if len(values) < 2:
        raise DataError(f"data.label_column {label_column!r} needs at least 2 classes, found {values}")
    if len(values) > MAX_CLASSES:
        raise DataError(
            f"data.label_column {label_column!r} has {len(values)} distinct values; "
            f"a classifier label has at most {MAX_CLASSES}"
        )
    return sorted(_plain(v) for v in values)


def row_keys(batch: pd.DataFrame, seed: int) -> np.ndarray:
    """A seeded 64-bit hash of each row's content (its scalar columns: an image by its path)."""
    if batch.empty:
        return np.zeros(0, dtype=np.uint64)
    scalar = [c for c in batch.columns if batch[c].dtype != object or isinstance(batch[c].iloc[0], str)]
    rows = pd.util.hash_pandas_object(batch[scalar], index=False).to_numpy()
    salt = pd.util.hash_array(np.array([seed], dtype=np.int64))[0]
    # hash_array mixes the bits again, so each seed ranks the rows differently.
    return pd.util.hash_array(rows ^ salt)


def rank_split_codes(keys: np.ndarray, *, val: float, test: float) -> np.ndarray:
    """Split codes (0 train, 1 val, 2 test) for one group of rows from their seeded hashes:
    the lowest ``round(n * test)`` go to test, the next ``round(n * val)`` to val."""
    n = len(keys)
    order = np.argsort(keys, kind="stable")
    n_test, n_val = round(n * test), round(n * val)
    split = np.zeros(n, dtype=np.int8)
    split[order[:n_test]] = 2
    split[order[n_test : n_test + n_val]] = 1
    return split


def hash_split_codes(batch: pd.DataFrame, *, val: float, test: float, seed: int) -> np.ndarray:
    """Split codes from each row's own hash: no row depends on another, so it streams.

    Each class lands in each split in proportion, up to sampling noise (under 0.5% of a
    split's size for a class of 100,000 rows).
    """
    u = row_keys(batch, seed) / float(2**64)
    return np.where(u < test, 2, np.where(u < test + val, 1, 0)).astype(np.int8)


def assign_split(batch: pd.DataFrame, *, val: float, test: float, seed: int) -> pd.DataFrame:
    """Add SPLIT_COLUMN (0 train, 1 val, 2 test) by ranking rows on a seeded content hash.

    The order of rows does not matter, so the same data and seed give the same split
    however Ray blocks it. Called on one label group at a time, the split is stratified.
    """
    out = batch.copy()
    out[SPLIT_COLUMN] = rank_split_codes(row_keys(batch, seed), val=val, test=test)
    return out


def assign_split_by_hash(batch: pd.DataFrame, *, val: float, test: float, seed: int) -> pd.DataFrame:
    """Add SPLIT_COLUMN from each row's own hash (:func:`hash_split_codes`)."""
    out = batch.copy()
    out[SPLIT_COLUMN] = hash_split_codes(batch, val=val, test=test, seed=seed)
    return out


def split_dataset(
    ds: ray.data.Dataset, cfg: SplitConfig, label_column: str, *, exact: bool = True
) -> dict[str, ray.data.Dataset]:
    """Seeded train/val/test split, stratified by the label when the config says so.

    ``exact``: split each class exactly (a group-by; for up to EXACT_SPLIT_ROWS rows);
    otherwise every row is placed by its own hash, streaming in bounded memory.
    """
    kwargs = {"val": cfg.val, "test": cfg.test, "seed": cfg.seed}
    if not exact:
        marked = ds.map_batches(assign_split_by_hash, fn_kwargs=kwargs, batch_format="pandas")
    elif cfg.stratify:
        marked = ds.groupby(label_column).map_groups(assign_split, fn_kwargs=kwargs, batch_format="pandas")
        marked = marked.materialize()
    else:  # every row ranked against every other: one block
        marked = ds.repartition(1).map_batches(
            assign_split, fn_kwargs=kwargs, batch_format="pandas", batch_size=None
        )
        marked = marked.materialize()
    return {
        name: marked.filter(expr=f"{SPLIT_COLUMN} == {i}").drop_columns([SPLIT_COLUMN])
        for i, name in enumerate(SPLITS)
    }


def small_input(info: SourceInfo) -> bool:
    """Small enough to split exactly, if its rows are few enough (SMALL_INPUT_BYTES)."""
    return info.bytes <= SMALL_INPUT_BYTES


def split_is_exact(info: SourceInfo, kept_rows: int) -> bool:
    """Whether preparing this input splits it exactly per class, or places rows by hash."""
    return small_input(info) and kept_rows <= EXACT_SPLIT_ROWS


def raw_split(info: SourceInfo, cfg: SplitConfig, name: str, *, kept_rows: int) -> ray.data.Dataset:
    """The raw rows of one split as preparing the input placed them (``kept_rows``: the
    rows it kept, all of the splits'), read again from the source: for scoring another
    model on exactly this run's test rows with that model's own preprocessing."""
    ds = load_dataset(info)
    if info.missing == "drop":
        columns = [*([] if info.format == "images" else info.feature_columns), info.label_column]
        ds = ds.map_batches(drop_missing, fn_kwargs={"columns": columns}, batch_format="pandas")
    return split_dataset(ds, cfg, info.label_column, exact=split_is_exact(info, kept_rows))[name]
