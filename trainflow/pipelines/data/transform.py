"""A user's batch transform, ``preprocess.transform: package.module:name``, and the array
columns it may make.

``fn(batch: pandas.DataFrame) -> pandas.DataFrame`` is called on a sample in the driver
before any worker starts (:func:`check_sample`, from ``schema.inspect_source``), on every
batch of a table's rows inside the preparation's passes (``readers``), and on the raw rows
a model trained through it predicts on (``Preprocessor.model_inputs``). It returns one row
per row it is handed, in order. Its columns are numbers, categories, or fixed-length
numeric arrays: a list or array per row (token ids, an embedding, a time window), of one
shape and one kind, integers or floats, in every row (:func:`stack`).

Every failure is one line, a ConfigError naming the field, the callable and what is wrong.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainflow.config import ConfigError
from trainflow.pipelines.data import tokenizer
from trainflow.pipelines.hooks import call_hook, describe, load_hook

FIELD = "preprocess.transform"
# The transform is tried on this many of the source's first rows before any worker starts.
SAMPLE_ROWS = 64
# The prepared splits' own columns (preprocess.FEATURES and LABEL): no array column may
# take their names, since each array column is prepared as a column of its own name.
RESERVED = ("features", "label")


def load(path: str):
    """The transform ``path`` names, imported here (ConfigError naming the field if not);
    a tokenizer's reference gives the tokenizer (:mod:`.tokenizer`)."""
    if tokenizer.is_reference(path):
        try:
            return tokenizer.load(path)
        except Exception as e:
            folder = tokenizer.settings(path)["folder"]
            raise ConfigError(
                f"preprocess.tokenizer {folder}: does not load: {type(e).__name__}: {_first(e)}"
            ) from None
    return load_hook(FIELD, path)


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def named(path: str) -> tuple[str, str]:
    """The field and value a message names for the transform ``path``."""
    if tokenizer.is_reference(path):
        return "preprocess.tokenizer", tokenizer.settings(path)["folder"]
    return FIELD, path


def code_hash(path: str) -> str:
    """A hash of the source of the module that defines the transform: part of a prepared
    entry's key (a changed transform prepares again), and saved with the model. A
    tokenizer's: the hash of its files."""
    if tokenizer.is_reference(path):
        return tokenizer.identity(path)
    load(path)
    file = getattr(sys.modules[path.partition(":")[0]], "__file__", None)
    code = Path(file).read_bytes() if file and Path(file).is_file() else path.encode()
    return hashlib.sha256(code).hexdigest()[:16]


def apply(path: str, batch: pd.DataFrame, *, label: str | None = None) -> pd.DataFrame:
    """The transform's output for ``batch``, checked: a DataFrame of one row per row of
    ``batch`` that holds the ``label`` column (when given: the rows a model trains on)."""
    out = call_hook(*named(path), load(path), batch)
    if not isinstance(out, pd.DataFrame):
        raise ConfigError(f"{FIELD} {path} returned {describe(out)}, not a pandas DataFrame")
    if len(out) != len(batch):
        raise ConfigError(
            f"{FIELD} {path} returned {len(out)} rows for {len(batch)}; it must return one row "
            "per row it is handed, in order"
        )
    if label is not None and label not in out.columns:
        raise ConfigError(
            f"{FIELD} {path}: its output lacks the label column {label!r} (data.label_column); "
            f"its columns are: {', '.join(map(str, out.columns))}"
        )
    return out.reset_index(drop=True)


def check_sample(path: str, sample: pd.DataFrame, label: str) -> tuple[pd.DataFrame, dict[str, dict]]:
    """The transform tried on the source's first rows, as preparation calls it (with the
    label) and as prediction does (without it, when the label is a column of the source):
    its output and the spec of each of its array columns (:func:`array_spec`)."""
    out = apply(path, sample.reset_index(drop=True), label=label)
    if label in sample.columns:
        apply(path, sample.drop(columns=[label]).reset_index(drop=True))
    arrays = {}
    for column in out.columns:
        spec = array_spec(out[column], str(column), path)
        if spec is not None:
            arrays[str(column)] = spec
    return out, arrays


def is_array(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def array_spec(values: pd.Series, column: str, path: str) -> dict[str, Any] | None:
    """``{"shape": [...], "dtype": ...}`` of an array column of the transform's output,
    None for a column of scalars: integers keep their dtype (token ids stay int64);
    floats and booleans are prepared as float32."""
    if values.dtype.kind in "iufbmM" or not len(values):
        return None
    kept = values[values.notna()]
    if not len(kept) or not is_array(kept.iloc[0]):
        return None
    if column in RESERVED:
        raise ConfigError(
            f"{FIELD} {path}: its array column {column!r} takes a name the prepared splits keep "
            f"for their own ({', '.join(RESERVED)}); rename it"
        )
    arr = _stacked(kept, column, path)
    if arr.dtype.kind not in "iufb":
        raise ConfigError(
            f"{FIELD} {path}: its column {column!r} holds arrays of {arr.dtype}, not numbers; "
            "arrays must hold integers or floats"
        )
    dtype = arr.dtype.name if arr.dtype.kind in "iu" else "float32"
    return {"shape": list(arr.shape[1:]), "dtype": dtype}


def _stacked(values: pd.Series, column: str, path: str) -> np.ndarray:
    """The rows' arrays as one array; ConfigError naming the column when their shapes differ."""
    cells = [np.asarray(v) for v in values]
    shapes = sorted({c.shape for c in cells})
    if len(shapes) > 1:
        shown = ", ".join(str(list(s)) for s in shapes[:4])
        raise ConfigError(
            f"{FIELD} {path}: its column {column!r} holds arrays of shapes {shown}; every row's "
            "array must have one shape (pad or cut them to one length)"
        )
    if not cells:
        return np.zeros((0, 0))
    return np.stack(cells)


def stack(values: pd.Series | np.ndarray, column: str, spec: dict[str, Any], path: str) -> np.ndarray:
    """A batch's array column as one ``[rows, *shape]`` array of its spec's dtype;
    ConfigError naming the column when a row's shape or kind differs from the spec's
    (found on the sample), since the model is built for that one."""
    values = values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
    arr = _stacked(values, column, path)
    shape = list(spec["shape"])
    dtype = np.dtype(spec["dtype"])
    if len(values) and list(arr.shape[1:]) != shape:
        raise ConfigError(
            f"{FIELD} {path}: its column {column!r} holds arrays of shape {list(arr.shape[1:])} "
            f"here and {shape} in the source's first rows; every row's array must have one shape"
        )
    if len(values) and dtype.kind in "iu" and arr.dtype.kind not in "iu":
        raise ConfigError(
            f"{FIELD} {path}: its column {column!r} holds {arr.dtype} here and integers in the "
            "source's first rows; give it one kind"
        )
    if not len(values):
        return np.zeros((0, *shape), dtype=dtype)
    return arr.astype(dtype, copy=False)


def width(spec: dict[str, Any]) -> int:
    """The numbers in one row of an array column of this spec."""
    return int(np.prod(spec["shape"], dtype=np.int64))
