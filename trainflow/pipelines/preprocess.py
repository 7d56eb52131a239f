"""Preprocessing fitted on the train split only, applied to every split with map_batches.

The fitted state is plain JSON (:class:`Preprocessor`); it travels inside every
checkpoint, so evaluation and prediction apply exactly what training saw. Prepared
splits hold two columns: ``features`` (a float32 tensor per row) and ``label`` (the
class index).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from trainflow.config import PreprocessConfig, SplitConfig
from trainflow.pipelines.data import SPLITS, DataError, SourceInfo, class_values, load_dataset, split_dataset

if TYPE_CHECKING:
    import ray.data

FEATURES = "features"
LABEL = "label"


@dataclass
class Preprocessor:
    feature_columns: list[str]
    label_column: str
    classes: list[Any]  # the model's output i is classes[i]
    standardize: bool = True
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Preprocessor:
        return cls(**state)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> Preprocessor:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def features(self, frame: pd.DataFrame) -> np.ndarray:
        """The model's input for a frame holding the feature columns."""
        missing = [c for c in self.feature_columns if c not in frame.columns]
        if missing:
            raise DataError(f"input lacks feature columns {', '.join(missing)} that the model was trained on")
        x = frame[self.feature_columns].to_numpy(dtype=np.float32, copy=True)
        if self.standardize:
            x -= np.asarray(self.mean, dtype=np.float32)
            x /= np.asarray(self.std, dtype=np.float32)
        return x

    def labels(self, values: pd.Series) -> np.ndarray:
        """Class indices for raw label values; a value outside the classes is an error."""
        codes = pd.Categorical(values, categories=self.classes).codes.astype(np.int64)
        if (codes < 0).any():
            unknown = sorted(set(values[codes < 0].tolist()), key=str)[:5]
            raise DataError(
                f"column {self.label_column!r} holds labels {unknown} outside the classes {self.classes}"
            )
        return codes


def transform_batch(batch: pd.DataFrame, *, state: dict[str, Any]) -> dict[str, np.ndarray]:
    """One batch of raw rows into ``{features, label}``; a pure function of the state."""
    pre = Preprocessor.from_dict(state)
    return {FEATURES: pre.features(batch), LABEL: pre.labels(batch[pre.label_column])}


def fit_preprocessor(
    train: ray.data.Dataset,
    feature_columns: list[str],
    label_column: str,
    classes: list[Any],
    standardize: bool,
) -> Preprocessor:
    """Statistics from the train split alone, in one streaming pass of Ray Data."""
    pre = Preprocessor(list(feature_columns), label_column, list(classes), standardize)
    if standardize:
        from ray.data.aggregate import Mean, Std

        aggs = [Mean(c, alias_name=f"mean:{c}") for c in feature_columns]
        aggs += [Std(c, ddof=0, alias_name=f"std:{c}") for c in feature_columns]
        stats = train.aggregate(*aggs)
        pre.mean = [float(stats[f"mean:{c}"]) for c in feature_columns]
        # A constant column (std 0) is centred but not scaled.
        pre.std = [float(stats[f"std:{c}"]) or 1.0 for c in feature_columns]
    return pre


def transform_dataset(ds: ray.data.Dataset, pre: Preprocessor) -> ray.data.Dataset:
    return ds.map_batches(transform_batch, fn_kwargs={"state": pre.to_dict()}, batch_format="pandas")


def write_prepared(
    splits: dict[str, ray.data.Dataset], pre: Preprocessor, out_dir: Path, *, seed: int
) -> dict[str, int]:
    """Write every transformed split as Parquet into ``out_dir``, all or nothing.

    The files go to a temporary folder beside ``out_dir`` that is renamed when every
    split is written, so a crash never leaves a partial entry that a later run reuses.
    The train split is shuffled once here: sources often arrive sorted by label.
    """
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        counts = {}
        for name in SPLITS:
            ds = transform_dataset(splits[name], pre)
            if name == "train":
                ds = ds.random_shuffle(seed=seed)
            ds.write_parquet(str(tmp / name))
            counts[name] = sum(_parquet_rows(p) for p in (tmp / name).glob("*.parquet"))
            if counts[name] == 0:
                raise DataError(f"the {name} split is empty; add rows or change data.split")
        pre.save(tmp / "preprocessor.json")
        (tmp / "counts.json").write_text(json.dumps(counts))
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not out_dir.exists():
                raise
            # Another run finished the same entry first; keep theirs.
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return counts


def _parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def read_prepared(out_dir: Path) -> tuple[Preprocessor, dict[str, int]]:
    """A finished cache entry: its preprocessor and split sizes."""
    return (
        Preprocessor.load(out_dir / "preprocessor.json"),
        json.loads((out_dir / "counts.json").read_text()),
    )


@dataclass
class PreparedEntry:
    path: Path
    preprocessor: Preprocessor
    counts: dict[str, int]
    key: str
    reused: bool


def cache_key(info: SourceInfo, split: SplitConfig, cfg: PreprocessConfig) -> str:
    """What a prepared entry depends on: the input, the columns, the split, the preprocessing
    and trainflow's version (a new release may prepare differently)."""
    from trainflow import __version__

    parts = {
        "fingerprint": info.fingerprint,
        "features": info.feature_columns,
        "label": info.label_column,
        "limit": info.limit,
        "split": split.model_dump(),
        "preprocess": cfg.model_dump(),
        "version": __version__,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def prepare(info: SourceInfo, split: SplitConfig, cfg: PreprocessConfig, cache_root: Path) -> PreparedEntry:
    """Split, fit on train, transform and write every split, or reuse a finished entry."""
    key = cache_key(info, split, cfg)
    out = cache_root / key
    if (out / "counts.json").is_file():
        pre, counts = read_prepared(out)
        return PreparedEntry(out, pre, counts, key, reused=True)
    ds = load_dataset(info)
    classes = class_values(ds, info.label_column)
    splits = split_dataset(ds, split, info.label_column)
    pre = fit_preprocessor(splits["train"], info.feature_columns, info.label_column, classes, cfg.standardize)
    counts = write_prepared(splits, pre, out, seed=split.seed)
    return PreparedEntry(out, pre, counts, key, reused=False)
