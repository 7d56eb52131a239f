"""A prepared cache entry: its key, its writing (staged in a temporary folder, published
by a rename when complete), and its reading.

An entry is a folder ``<cache>/<key>/`` holding one folder of Parquet files per split
(``train/``, ``val/``, ``test/``: columns ``features`` and ``label``, and a column per
array column of a ``preprocess.transform``'s output),
``preprocessor.json``, ``profile.json`` (the train split's profile, which drift is
measured against) and ``counts.json`` (the rows per split, written last: it marks the
entry finished).

The cache is a local folder (every node of a cluster mounts it at the same path) or a
URI (``s3://``, ``gs://``, ...: every process reaches it through pyarrow). An object
store cannot rename a folder, so there an entry is written into
``<cache>/<key>/attempt-<id>/`` and published by ``<cache>/<key>/published``, one
object naming that folder, written last.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainflow.config import PreprocessConfig, SplitConfig
from trainflow.files import (
    filesystem,
    is_uri,
    join,
    published_attempt,
    publishing_attempt,
    publishing_folder,
    read_text,
    write_text,
)
from trainflow.pipelines.data import profile as profiles
from trainflow.pipelines.data import tensors
from trainflow.pipelines.data import transform as transforms
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.data.schema import DataError, SourceInfo
from trainflow.pipelines.data.split import SPLIT_NAMES
from trainflow.ray_internals import switches
from trainflow.version import __version__

if TYPE_CHECKING:
    import ray.data

COUNTS = "counts.json"
PREPROCESSOR = "preprocessor.json"
PUBLISHED = "published"  # on a URI cache: names the entry's finished attempt folder


@dataclass
class PreparedEntry:
    path: str  # a local folder or a URI
    preprocessor: Preprocessor
    counts: dict[str, int]
    key: str
    reused: bool
    dropped: int = 0  # rows dropped for a missing value (data.missing=drop)

    @classmethod
    def open(cls, path: str, key: str, *, reused: bool = True, dropped: int = 0) -> PreparedEntry:
        """A finished entry, read from its folder."""
        pre = Preprocessor.load(join(path, PREPROCESSOR))
        return cls(str(path), pre, json.loads(read_text(join(path, COUNTS))), key, reused, dropped)

    def with_run(self, *, reused: bool, dropped: int) -> PreparedEntry:
        return replace(self, reused=reused, dropped=dropped)

    def split_path(self, name: str) -> str:
        return join(self.path, name)

    def dataset(self, name: str) -> ray.data.Dataset:
        return split_dataset(self.split_path(name))


def split_dataset(location: str) -> ray.data.Dataset:
    """One prepared split as a lazy Ray Dataset (``features``, ``label``): what training
    streams and batch evaluation reads. The filesystem is resolved here and handed to
    Ray Data, so a URI's options (its query) reach every reader.

    Read with Ray Data's first Parquet datasource, which reads the files' footers once,
    here: Ray 2.60's default lists them, on actors it starts, at every execution, so at
    every epoch of a streamed split (benchmarks/results.md, training throughput)."""
    import ray.data

    fs, path = filesystem(location)
    files = len(split_files(location)[1])
    with switches.parquet_datasource_v1():
        # A read task per file, whose block Ray Data hands to the decode below in the same
        # task; a file's rows split into more blocks would cost the decode a task each.
        ds = ray.data.read_parquet(path, filesystem=fs, override_num_blocks=max(files, 1))
    return ds.map_batches(tensors.to_ray, batch_format="pyarrow", batch_size=None, zero_copy_batch=True)


def code_version() -> str:
    """trainflow's version and a hash of the code that prepares data: every module of
    this package."""
    h = hashlib.sha256(__version__.encode())
    for module in sorted(Path(__file__).parent.glob("*.py")):
        h.update(module.read_bytes())
    return h.hexdigest()[:16]


# Preprocessing fields that arrived after entries were first keyed.
_ADDED = ("tokenizer", "image_mean", "image_std")


def cache_key(info: SourceInfo, split: SplitConfig, cfg: PreprocessConfig) -> str:
    """What a prepared entry depends on: the input, the columns, the split, the preprocessing
    (a transform's code too: a changed transform prepares again) and trainflow's code (a
    new release may prepare differently)."""
    parts = {
        "fingerprint": info.fingerprint,
        "format": info.format,
        "features": info.input_columns,
        "categorical": info.categorical_columns,
        "label": info.label_column,
        "classes": info.classes,
        "task": info.objective,  # its name before objective: an entry's key is spelled as it was
        "missing": info.missing,
        "image_mode": info.image_mode,
        "limit": info.limit,
        "split": split.model_dump(),
        # Fields added since, while unset, are left out: the same data keeps its entry.
        "preprocess": cfg.model_dump(exclude={k for k in _ADDED if getattr(cfg, k) is None}),
        "code": code_version(),
    }
    if info.transform:  # the user's transform, or the tokenizer's reference
        parts["transform"] = transforms.code_hash(info.transform)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def finished_entry(cache_root: str | Path, key: str) -> PreparedEntry | None:
    """The entry for ``key`` when a run finished writing it (temporary folders never are)."""
    out = join(cache_root, key)
    if is_uri(out):
        folder = published_attempt(out, PUBLISHED)
        return PreparedEntry.open(folder, key) if folder else None
    return PreparedEntry.open(out, key) if Path(out, COUNTS).is_file() else None


@contextmanager
def staging(out: str) -> Iterator[str]:
    """Where to write the cache entry ``out``: a temporary folder beside it, renamed to it
    when the block ends without error, else removed (on a URI, a new attempt folder
    published when complete): a crash never leaves a partial entry that a later run
    reuses. An entry that another run finished first is kept."""
    if is_uri(out):
        with publishing_attempt(out, PUBLISHED) as folder:
            yield folder
        return
    with publishing_folder(out, finished=lambda path: (path / COUNTS).is_file()) as folder:
        yield str(folder)


def finish_entry(
    folder: str, pre: Preprocessor, counts: dict[str, int], profile: dict[str, Any] | None = None
) -> None:
    """Refuse an empty split, then write what marks an entry finished: the preprocessor,
    the train split's profile (``profile.json``) and the rows per split (``counts.json`` last)."""
    for name in SPLIT_NAMES:
        if not counts.get(name):
            raise DataError(f"the {name} split is empty; add rows or change data.split")
    pre.save(join(folder, PREPROCESSOR))
    if profile is not None:
        profiles.save(folder, profile)
    write_text(join(folder, COUNTS), json.dumps(counts))


def split_files(location: str | Path):
    """A prepared split's filesystem and its Parquet files' paths on it, in name order."""
    import pyarrow.fs

    fs, path = filesystem(location)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    parquet = (i.path for i in infos if i.type == pyarrow.fs.FileType.File and i.path.endswith(".parquet"))
    return fs, sorted(parquet)


def split_rows(location: str | Path) -> int:
    """A prepared split's rows, from its files' footers."""
    import pyarrow.parquet as pq

    fs, files = split_files(location)
    return sum(pq.ParquetFile(fs.open_input_file(p)).metadata.num_rows for p in files)


def split_bytes(location: str | Path) -> int:
    """A prepared split's size on storage."""
    fs, files = split_files(location)
    return sum(i.size for i in fs.get_file_info(files)) if files else 0


def read_split_batches(location: str | Path, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """A prepared split's Parquet read in this process, as the numpy batches that
    ``map_batches`` and ``iter_batches`` give: ``{features, label}`` and a transform's
    array columns; streamed, its files in name order, so that only a batch at a time is held."""
    import pyarrow.dataset as pads

    fs, files = split_files(location)
    for path_ in files:
        parquet = pads.dataset(path_, filesystem=fs)
        for batch in parquet.to_batches(batch_size=batch_size):
            if batch.num_rows:
                yield tensors.to_numpy(batch)


def read_split(location: str | Path) -> dict[str, np.ndarray]:
    """A whole prepared split in memory: ``{features, label}`` and a transform's array
    columns, each one array (a tensor column of its shape per row)."""
    batches = list(read_split_batches(location, batch_size=1 << 20))
    if not batches:
        raise DataError(f"{location}: no prepared rows")
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
