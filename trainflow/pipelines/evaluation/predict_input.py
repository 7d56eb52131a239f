"""A batch prediction's input and output, checked in the driver before any Ray worker
starts: the input's files and columns (file metadata only, no rows), and an output folder
that is new. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads

from trainflow.config.sections import listed
from trainflow.pipelines.data.schema import DataError

# The files batch prediction reads, by suffix.
INPUT_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}


@dataclass(frozen=True)
class InputInfo:
    path: str
    format: str  # "parquet" | "csv"
    files: list[str]
    columns: list[str]


def inspect_input(path: str, input_columns: list[str]) -> InputInfo:
    """Check that the input exists and holds every column the model reads (``input_columns``:
    numeric and categorical, or the raw columns its ``preprocess.transform`` takes); read
    no rows."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"input {path}: no such file or folder")
    fmt, files = _list_files(p, path)
    try:
        schema = pads.dataset(files, format=fmt).schema
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"input {path}: cannot read as {fmt}: {e}") from None
    missing = [c for c in input_columns if c not in schema.names]
    if missing:
        raise DataError(
            f"input {path} lacks the feature column{'s' if len(missing) > 1 else ''} "
            f"{listed([repr(c) for c in missing])} that the model was trained on; its columns are: "
            f"{listed(schema.names, 20)}"
        )
    return InputInfo(str(p), fmt, files, list(schema.names))


def _list_files(p: Path, path: str) -> tuple[str, list[str]]:
    """One Parquet or CSV file, or a folder of files of one of those formats."""
    kinds = ", ".join(sorted(INPUT_SUFFIXES))
    if p.is_file():
        if p.suffix.lower() not in INPUT_SUFFIXES:
            raise DataError(f"input {path}: unsupported file type {p.suffix!r}; use one of {kinds}")
        return INPUT_SUFFIXES[p.suffix.lower()], [str(p)]
    files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith((".", "_")))
    found = {INPUT_SUFFIXES[f.suffix.lower()] for f in files if f.suffix.lower() in INPUT_SUFFIXES}
    if not found:
        raise DataError(f"input {path}: no {kinds} files in this folder")
    if len(found) > 1:
        raise DataError(f"input {path}: mixes {' and '.join(sorted(found))} files; keep one format")
    fmt = found.pop()
    return fmt, [str(f) for f in files if INPUT_SUFFIXES.get(f.suffix.lower()) == fmt]


def check_output(output: str) -> Path:
    out = Path(output).expanduser()
    if out.exists():
        raise DataError(f"output {output} already exists; choose a new folder or remove it")
    if out.suffix.lower() in INPUT_SUFFIXES:
        raise DataError(
            f"output {output}: give a folder (Parquet files are written into it), not a file name"
        )
    return out
