"""A prepared cache entry: its key, its writing (staged in a temporary folder, published
by a rename when complete), and its reading.

An entry is a folder ``<cache>/<key>/`` holding one folder of Parquet files per split
(``train/``, ``val/``, ``test/``: columns ``features`` and ``label``),
``preprocessor.json`` and ``counts.json`` (the rows per split, written last: it marks
the entry finished).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainflow.config import PreprocessConfig, SplitConfig
from trainflow.files import publishing_folder
from trainflow.pipelines.data import DataError, SourceInfo
from trainflow.pipelines.preprocess import FEATURES, LABEL, Preprocessor
from trainflow.pipelines.split import SPLIT_NAMES

if TYPE_CHECKING:
    import ray.data

COUNTS = "counts.json"
PREPROCESSOR = "preprocessor.json"
# The modules whose code decides what an entry holds: an entry prepared by other code
# is not reused.
ENGINE_MODULES = ("data", "sources", "readers", "split", "stats", "preprocess", "entry", "prepare", "runner")


@dataclass
class PreparedEntry:
    path: Path
    preprocessor: Preprocessor
    counts: dict[str, int]
    key: str
    reused: bool
    dropped: int = 0  # rows dropped for a missing value (data.missing=drop)

    @classmethod
    def open(cls, path: Path, key: str, *, reused: bool = True, dropped: int = 0) -> PreparedEntry:
        """A finished entry, read from its folder."""
        pre = Preprocessor.load(path / PREPROCESSOR)
        return cls(path, pre, json.loads((path / COUNTS).read_text()), key, reused, dropped)

    def split_path(self, name: str) -> Path:
        return self.path / name

    def dataset(self, name: str) -> ray.data.Dataset:
        """One prepared split as a lazy Ray Dataset (``features``, ``label``): what training
        streams and batch evaluation reads."""
        import ray.data

        return ray.data.read_parquet(str(self.split_path(name)))


def code_version() -> str:
    """trainflow's version and a hash of the code that prepares data."""
    import importlib

    from trainflow import __version__

    h = hashlib.sha256(__version__.encode())
    for name in ENGINE_MODULES:
        h.update(Path(importlib.import_module(f"trainflow.pipelines.{name}").__file__).read_bytes())
    return h.hexdigest()[:16]


def cache_key(info: SourceInfo, split: SplitConfig, cfg: PreprocessConfig) -> str:
    """What a prepared entry depends on: the input, the columns, the split, the preprocessing
    and trainflow's code (a new release may prepare differently)."""
    parts = {
        "fingerprint": info.fingerprint,
        "format": info.format,
        "features": info.input_columns,
        "categorical": info.categorical_columns,
        "label": info.label_column,
        "classes": info.classes,
        "task": info.task,
        "missing": info.missing,
        "image_mode": info.image_mode,
        "limit": info.limit,
        "split": split.model_dump(),
        "preprocess": cfg.model_dump(),
        "code": code_version(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def finished_entry(cache_root: Path, key: str) -> PreparedEntry | None:
    """The entry for ``key`` when a run finished writing it (temporary folders never are)."""
    out = cache_root / key
    return PreparedEntry.open(out, key) if (out / COUNTS).is_file() else None


def staging(out_dir: Path):
    """A temporary folder beside the cache entry ``out_dir``, renamed to it when the block
    ends without error, else removed: a crash never leaves a partial entry that a later
    run reuses. An entry that another run finished first is kept."""
    return publishing_folder(out_dir, finished=lambda path: (path / COUNTS).is_file())


def finish_entry(tmp: Path, pre: Preprocessor, counts: dict[str, int]) -> None:
    """Refuse an empty split, then write what marks an entry finished: the preprocessor
    and the rows per split (``counts.json`` last)."""
    for name in SPLIT_NAMES:
        if not counts.get(name):
            raise DataError(f"the {name} split is empty; add rows or change data.split")
    pre.save(tmp / PREPROCESSOR)
    (tmp / COUNTS).write_text(json.dumps(counts))


def split_files(path: str | Path) -> list[Path]:
    """A prepared split's Parquet files, in name order."""
    return sorted(Path(path).glob("*.parquet"))


def split_rows(path: str | Path) -> int:
    """A prepared split's rows, from its files' footers."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in split_files(path))


def read_split_batches(path: str | Path, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """A prepared split's Parquet read in this process, as the numpy batches that
    ``map_batches`` and ``iter_batches`` give: ``{features, label}``; streamed, its files
    in name order, so that only a batch at a time is held."""
    import pyarrow.dataset as pads
    import ray.data  # noqa: F401  registers Ray's tensor type, the features column's type

    for path_ in split_files(path):
        for batch in pads.dataset(str(path_)).to_batches(columns=[FEATURES, LABEL], batch_size=batch_size):
            if batch.num_rows:
                yield {name: batch.column(name).to_numpy(zero_copy_only=False) for name in (FEATURES, LABEL)}
