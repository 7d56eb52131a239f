"""Sources into ``ray.data.Dataset``: schema checks, a fingerprint, a seeded split.

:func:`inspect_source` reads only file metadata in the driver, so a missing file or
column fails before any Ray worker starts. :func:`load_dataset` then reads lazily.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads

from trainflow.config import DataConfig, SplitConfig

if TYPE_CHECKING:
    import ray.data

DIGITS = "builtin:digits"
SPLITS = ("train", "val", "test")
SPLIT_COLUMN = "__split"
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
# A label with more distinct values than this is almost surely a regression target.
MAX_CLASSES = 1000


class DataError(ValueError):
    """Input data that cannot be trained on; the message names the file or column."""


@dataclass(frozen=True)
class SourceInfo:
    """What the driver learned about a source without reading its rows."""

    source: str
    format: str  # "digits" | "parquet" | "csv"
    files: list[str]
    label_column: str
    feature_columns: list[str]
    fingerprint: str
    limit: int | None = None  # read only the first N rows


def _digits_frame() -> pd.DataFrame:
    from sklearn.datasets import load_digits

    digits = load_digits()
    frame = pd.DataFrame(
        digits.data.astype(np.float32), columns=[f"pixel_{i}" for i in range(digits.data.shape[1])]
    )
    frame["label"] = digits.target.astype(np.int64)
    return frame


def _list_files(path: Path) -> tuple[str, list[str]]:
    if path.is_file():
        fmt = FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise DataError(
                f"data.source {path}: unsupported file type {path.suffix!r}; "
                f"use one of {', '.join(sorted(FORMATS))} or {DIGITS}"
            )
        return fmt, [str(path)]
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
    kinds = {FORMATS.get(p.suffix.lower()) for p in files}
    kinds.discard(None)
    if not kinds:
        raise DataError(f"data.source {path}: no {', '.join(sorted(FORMATS))} files in this folder")
    if len(kinds) > 1:
        raise DataError(f"data.source {path}: mixes {' and '.join(sorted(kinds))} files; keep one format")
    fmt = kinds.pop()
    return fmt, [str(p) for p in files if FORMATS.get(p.suffix.lower()) == fmt]


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _fingerprint(files: list[str]) -> str:
    h = hashlib.sha256()
    for f in files:
        st = Path(f).stat()
        h.update(f"{Path(f).resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def inspect_source(cfg: DataConfig) -> SourceInfo:
    """Check that the source exists and holds the configured columns; read no rows."""
    if cfg.source == DIGITS:
        import sklearn

        fmt, files = "digits", []
        schema = pa.Schema.from_pandas(_digits_frame().head(1), preserve_index=False)
        fingerprint = hashlib.sha256(f"{DIGITS}|sklearn {sklearn.__version__}".encode()).hexdigest()[:16]
    else:
        if cfg.source.startswith("builtin:"):
            raise DataError(f"data.source {cfg.source!r}: the only builtin source is {DIGITS}")
        path = Path(cfg.source).expanduser()
        if not path.exists():
            raise DataError(f"data.source {cfg.source}: no such file or folder")
        fmt, files = _list_files(path)
        try:
            schema = pads.dataset(files, format=fmt).schema
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"data.source {cfg.source}: cannot read as {fmt}: {e}") from None
        fingerprint = _fingerprint(files)

    columns = schema.names
    if cfg.label_column not in columns:
        raise DataError(
            f"data.label_column {cfg.label_column!r} is not a column of {cfg.source}; "
            f"its columns are: {', '.join(columns)}"
        )
    features = cfg.feature_columns or [c for c in columns if c != cfg.label_column]
    missing = [c for c in features if c not in columns]
    if missing:
        raise DataError(
            f"data.feature_columns: {', '.join(map(repr, missing))} not in {cfg.source}; "
            f"its columns are: {', '.join(columns)}"
        )
    if cfg.label_column in features:
        raise DataError(f"data.feature_columns must not hold the label column {cfg.label_column!r}")
    if not features:
        raise DataError(f"data.feature_columns: {cfg.source} has no column besides the label")
    not_numeric = [f"{c} ({schema.field(c).type})" for c in features if not _is_numeric(schema.field(c).type)]
    if not_numeric:
        raise DataError(
            f"data.feature_columns: {', '.join(not_numeric)} in {cfg.source} are not numeric; "
            "features must be int, float or bool columns (name the numeric ones in data.feature_columns)"
        )
    return SourceInfo(cfg.source, fmt, files, cfg.label_column, features, fingerprint, cfg.limit)


def load_dataset(info: SourceInfo) -> ray.data.Dataset:
    """The source as a lazy Dataset holding the feature columns and the label."""
    import ray.data

    columns = [*info.feature_columns, info.label_column]
    if info.format == "digits":
        ds = ray.data.from_pandas(_digits_frame()[columns])
    elif info.format == "parquet":
        ds = ray.data.read_parquet(info.files, columns=columns)
    else:
        ds = ray.data.read_csv(info.files).select_columns(columns)
    return ds.limit(info.limit) if info.limit else ds


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
    return sorted(v.item() if isinstance(v, np.generic) else v for v in values)


def _row_keys(batch: pd.DataFrame, seed: int) -> np.ndarray:
    """A seeded 64-bit hash of each row's content."""
    rows = pd.util.hash_pandas_object(batch, index=False).to_numpy()
    salt = pd.util.hash_array(np.array([seed], dtype=np.int64))[0]
    # hash_array mixes the bits again, so each seed ranks the rows differently.
    return pd.util.hash_array(rows ^ salt)


def assign_split(batch: pd.DataFrame, *, val: float, test: float, seed: int) -> pd.DataFrame:
    """Add SPLIT_COLUMN (0 train, 1 val, 2 test) by ranking rows on a seeded content hash.

    The order of rows does not matter, so the same data and seed give the same split
    however Ray blocks it. Called on one label group at a time, the split is stratified.
    """
    n = len(batch)
    order = np.argsort(_row_keys(batch, seed), kind="stable")
    n_test, n_val = round(n * test), round(n * val)
    split = np.zeros(n, dtype=np.int8)
    split[order[:n_test]] = 2
    split[order[n_test : n_test + n_val]] = 1
    out = batch.copy()
    out[SPLIT_COLUMN] = split
    return out


def split_dataset(ds: ray.data.Dataset, cfg: SplitConfig, label_column: str) -> dict[str, ray.data.Dataset]:
    """Seeded train/val/test split, stratified by the label when the config says so."""
    kwargs = {"val": cfg.val, "test": cfg.test, "seed": cfg.seed}
    if cfg.stratify:
        marked = ds.groupby(label_column).map_groups(assign_split, fn_kwargs=kwargs, batch_format="pandas")
    else:
        marked = ds.map_batches(assign_split, fn_kwargs=kwargs, batch_format="pandas")
    marked = marked.materialize()
    return {
        name: marked.filter(expr=f"{SPLIT_COLUMN} == {i}").drop_columns([SPLIT_COLUMN])
        for i, name in enumerate(SPLITS)
    }
