"""Preprocessing fitted on the train split only, applied to every split.

Tabular inputs are fitted and transformed by Ray tasks per fragment
(:mod:`trainflow.pipelines.tabular`); image folders by Ray Data's ``map_batches`` here.

The fitted state is plain JSON (:class:`Preprocessor`); it travels inside every
checkpoint, so evaluation and prediction apply exactly what training saw. Prepared
splits hold two columns: ``features`` (a float32 tensor per row) and ``label`` (the
class index).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from trainflow.config import PreprocessConfig, SplitConfig
from trainflow.files import publishing_folder
from trainflow.pipelines.data import (
    IMAGE,
    SPLITS,
    DataError,
    SourceInfo,
    _plain,
    check_rows,
    drop_missing,
    load_dataset,
    small_input,
    split_dataset,
    split_is_exact,
    value_order,
)

if TYPE_CHECKING:
    import ray.data

FEATURES = "features"
LABEL = "label"


# Categorical columns with more distinct values than this in the train split are refused:
# one-hot encoding them would make the model's input that wide.
MAX_VOCABULARY = 10_000


@dataclass
class Preprocessor:
    """The fitted state, plain JSON. The model's input for a row is: the numeric features
    scaled, then each categorical column one-hot (an unknown category: all zeros); for
    an image folder, the image resized, scaled to [0, 1], normalized per channel, flat."""

    feature_columns: list[str]  # numeric features, in the model's order
    label_column: str
    classes: list[Any]  # the model's output i is classes[i]
    standardize: bool = True  # whether numeric features are scaled as below
    mean: list[float] = field(default_factory=list)  # the offset: mean, or minimum for minmax
    std: list[float] = field(default_factory=list)  # the scale: std, or max - min for minmax
    scaler: str = "standard"  # standard | minmax | none
    categorical: dict[str, list[Any]] = field(default_factory=dict)  # column: vocabulary
    # Image folders: {"shape": [c, h, w], "mean": [...], "std": [...], "augment": bool}.
    image: dict[str, Any] | None = None

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

    @property
    def num_features(self) -> int:
        image = int(np.prod(self.image["shape"])) if self.image else 0
        return image + len(self.feature_columns) + sum(len(v) for v in self.categorical.values())

    def features(self, frame: pd.DataFrame | dict[str, np.ndarray]) -> np.ndarray:
        """The model's input for raw rows (a frame, or a dict of columns)."""
        needed = [*self.feature_columns, *self.categorical, *([IMAGE] if self.image else [])]
        missing = [c for c in needed if c not in frame]
        if missing:
            raise DataError(f"input lacks feature columns {', '.join(missing)} that the model was trained on")
        parts = []
        if self.image:
            parts.append(image_features(frame[IMAGE], self.image))
        if self.feature_columns:
            if self.standardize:
                # Centred in float64, then narrowed: a column far from zero (timestamps,
                # say) would lose its spread if cast to float32 first. Column by column
                # into one float32 block, a third of the time of a float64 matrix.
                rows = len(frame[self.feature_columns[0]])
                x = np.empty((len(self.feature_columns), rows), dtype=np.float32)
                for j, c in enumerate(self.feature_columns):
                    np.subtract(
                        np.asarray(frame[c], dtype=np.float64), self.mean[j], out=x[j], casting="same_kind"
                    )
                x /= np.asarray(self.std, dtype=np.float32)[:, None]
                x = np.ascontiguousarray(x.T)
            else:
                x = np.stack([np.asarray(frame[c], dtype=np.float32) for c in self.feature_columns], axis=1)
            parts.append(x)
        for column, vocabulary in self.categorical.items():
            parts.append(one_hot(np.asarray(frame[column]), vocabulary))
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def labels(self, values: pd.Series | np.ndarray) -> np.ndarray:
        """Class indices for raw label values; a value outside the classes is an error."""
        values = pd.Series(values) if not isinstance(values, pd.Series) else values
        if values.dtype == object and self.classes and isinstance(self.classes[0], str):
            values = values.astype(str)
        codes = pd.Categorical(values, categories=self.classes).codes.astype(np.int64)
        if (codes < 0).any():
            unknown = sorted(set(values[codes < 0].tolist()), key=str)[:5]
            raise DataError(
                f"column {self.label_column!r} holds labels {unknown} outside the classes {self.classes}"
            )
        return codes


def one_hot(values: np.ndarray, vocabulary: list[Any]) -> np.ndarray:
    """One column per category; a category outside the vocabulary (or missing) is all zeros."""
    codes = pd.Categorical(values, categories=vocabulary).codes
    out = np.zeros((len(values), len(vocabulary)), dtype=np.float32)
    known = codes >= 0
    out[np.flatnonzero(known), codes[known]] = 1.0
    return out


def _image_pipeline(image: dict[str, Any]):
    import torch
    from torchvision.transforms import v2

    c, h, w = image["shape"]
    return v2.Compose(
        [
            v2.Resize((h, w), antialias=True),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(image["mean"], image["std"]),
        ]
    )


def _as_chw(img: np.ndarray):
    import torch

    t = torch.from_numpy(np.array(img))  # a copy: Ray hands over read-only arrays
    return t.unsqueeze(0) if t.ndim == 2 else t.permute(2, 0, 1)


def image_features(images, image: dict[str, Any]) -> np.ndarray:
    """Images (HxWxC or HxW uint8 arrays) resized, scaled, normalized and flattened."""
    transform = _image_pipeline(image)
    channels = image["shape"][0]
    out = []
    for img in images:
        t = _as_chw(np.asarray(img))
        if t.shape[0] != channels:
            raise DataError(f"an image has {t.shape[0]} channels, the model was trained on {channels}")
        out.append(transform(t).reshape(-1).numpy())
    return np.stack(out) if out else np.zeros((0, int(np.prod(image["shape"]))), dtype=np.float32)


def image_channel_sums(batch: dict[str, np.ndarray], *, shape: list[int]) -> pd.DataFrame:
    """Per-channel pixel sums and squared sums of a batch of images after resizing to [0, 1]."""
    raw = {"shape": shape, "mean": [0.0] * shape[0], "std": [1.0] * shape[0]}
    x = image_features(batch[IMAGE], raw).reshape(len(batch[IMAGE]), shape[0], -1).astype(np.float64)
    row = {"pixels": x.shape[0] * x.shape[2]}
    for ch in range(shape[0]):
        row[f"sum:{ch}"] = float(x[:, ch].sum())
        row[f"sq:{ch}"] = float((x[:, ch] ** 2).sum())
    return pd.DataFrame([row])


def augment_batch(batch: dict[str, np.ndarray], *, shape: list[int]) -> dict[str, np.ndarray]:
    """Train-only augmentation of prepared image rows: a random crop (the image padded by an
    eighth of its side) and a random horizontal flip, drawn per image."""
    import torch
    from torchvision.transforms import v2

    c, h, w = shape
    transform = v2.Compose([v2.RandomCrop((h, w), padding=max(1, h // 8)), v2.RandomHorizontalFlip()])
    x = torch.from_numpy(np.ascontiguousarray(batch[FEATURES], dtype=np.float32)).reshape(-1, c, h, w)
    out = torch.stack([transform(img) for img in x]) if len(x) else x
    return {FEATURES: out.reshape(len(x), -1).numpy(), LABEL: batch[LABEL]}


def augment_dataset(ds: ray.data.Dataset, preprocessor: dict[str, Any]) -> ray.data.Dataset:
    """The prepared train split, augmented anew on every pass when the preprocessor says so."""
    image = preprocessor.get("image")
    if not image or not image.get("augment"):
        return ds
    return ds.map_batches(augment_batch, fn_kwargs={"shape": image["shape"]}, batch_format="numpy")


def transform_batch(
    batch: pd.DataFrame | dict[str, np.ndarray], *, state: dict[str, Any]
) -> dict[str, np.ndarray]:
    """One batch of raw rows into ``{features, label}``; a pure function of the state."""
    pre = Preprocessor.from_dict(state)
    return {FEATURES: pre.features(batch), LABEL: pre.labels(batch[pre.label_column])}


def fit_preprocessor(
    train: ray.data.Dataset,
    *,
    numeric: list[str],
    categorical: list[str],
    label_column: str,
    classes: list[Any],
    cfg: PreprocessConfig,
    image_channels: int | None = None,
) -> Preprocessor:
    """Statistics from the train split alone, each in a streaming pass of Ray Data."""
    scale = cfg.scaler != "none"
    pre = Preprocessor(list(numeric), label_column, list(classes), scale, scaler=cfg.scaler)
    if scale and numeric:
        from ray.data.aggregate import Max, Mean, Min, Std

        if cfg.scaler == "standard":
            aggs = [Mean(c, alias_name=f"lo:{c}") for c in numeric]
            aggs += [Std(c, ddof=0, alias_name=f"hi:{c}") for c in numeric]
        else:
            aggs = [Min(c, alias_name=f"lo:{c}") for c in numeric]
            aggs += [Max(c, alias_name=f"hi:{c}") for c in numeric]
        stats = train.aggregate(*aggs)
        pre.mean = [float(stats[f"lo:{c}"]) for c in numeric]
        spread = [float(stats[f"hi:{c}"]) for c in numeric]
        if cfg.scaler == "minmax":
            spread = [hi - lo for hi, lo in zip(spread, pre.mean, strict=True)]
        # A constant column (std or range 0) is shifted but not scaled.
        pre.std = [s or 1.0 for s in spread]
    if categorical:
        per_block = train.map_batches(
            categories, fn_kwargs={"columns": categorical}, batch_format="pandas", batch_size=None
        ).to_pandas()  # one small row per block
        for column in categorical:
            values = {v for cell in per_block[column] for v in json.loads(cell)}
            if len(values) > MAX_VOCABULARY:
                raise DataError(
                    f"data.categorical_columns: {column!r} has {len(values)} categories in the train "
                    f"split; at most {MAX_VOCABULARY} are one-hot encoded"
                )
            pre.categorical[column] = sorted(values, key=value_order)
    if image_channels is not None:
        pre.image = _fit_image(train, cfg, image_channels)
    return pre


def categories(batch: pd.DataFrame, *, columns: list[str]) -> pd.DataFrame:
    """The distinct values of each categorical column in a batch, as JSON lists."""
    row = {}
    for c in columns:
        values = [_plain(v) for v in batch[c].dropna().unique()[: MAX_VOCABULARY + 1]]
        row[c] = json.dumps(values)
    return pd.DataFrame([row])


def _fit_image(train: ray.data.Dataset, cfg: PreprocessConfig, channels: int) -> dict[str, Any]:
    if cfg.image_size is not None:
        h, w = cfg.image_size
    else:
        first = np.asarray(train.take(1)[0][IMAGE])
        h, w = first.shape[:2]
    shape = [channels, int(h), int(w)]
    image = {"shape": shape, "mean": [0.0] * channels, "std": [1.0] * channels, "augment": cfg.augment}
    if cfg.scaler == "standard":
        sums = train.map_batches(
            image_channel_sums, fn_kwargs={"shape": shape}, batch_format="numpy", batch_size=256
        ).to_pandas()  # one small row per batch
        n = float(sums["pixels"].sum())
        mean = [float(sums[f"sum:{ch}"].sum()) / n for ch in range(channels)]
        var = [float(sums[f"sq:{ch}"].sum()) / n - m * m for ch, m in enumerate(mean)]
        image["mean"] = mean
        image["std"] = [float(np.sqrt(v)) if v > 1e-12 else 1.0 for v in var]
    return image


def transform_dataset(ds: ray.data.Dataset, pre: Preprocessor) -> ray.data.Dataset:
    return ds.map_batches(
        transform_batch,
        fn_kwargs={"state": pre.to_dict()},
        batch_format="numpy" if pre.image else "pandas",
    )


def write_prepared(
    splits: dict[str, ray.data.Dataset], pre: Preprocessor, out_dir: Path, *, seed: int, shuffle: bool = True
) -> dict[str, int]:
    """Write every transformed split as Parquet into ``out_dir``, all or nothing (see
    :func:`staging`). The train split is shuffled once here (sources often arrive sorted
    by label): all of it when ``shuffle``, else only the order of its blocks, which streams.
    """
    with staging(out_dir) as tmp:
        counts = {}
        for name in SPLITS:
            ds = transform_dataset(splits[name], pre)
            if name == "train":
                ds = ds.random_shuffle(seed=seed) if shuffle else ds.randomize_block_order(seed=seed)
            ds.write_parquet(str(tmp / name))
            counts[name] = split_rows(tmp / name)
        finish_entry(tmp, pre, counts)
    return counts


def staging(out_dir: Path):
    """A temporary folder beside the cache entry ``out_dir``, renamed to it when the block
    ends without error, else removed: a crash never leaves a partial entry that a later
    run reuses. An entry that another run finished first is kept."""
    return publishing_folder(out_dir, finished=lambda path: (path / "counts.json").is_file())


def finish_entry(tmp: Path, pre: Preprocessor, counts: dict[str, int]) -> None:
    """Refuse an empty split, then write what marks an entry finished: the preprocessor
    and the rows per split (``counts.json`` last)."""
    for name in SPLITS:
        if not counts.get(name):
            raise DataError(f"the {name} split is empty; add rows or change data.split")
    pre.save(tmp / "preprocessor.json")
    (tmp / "counts.json").write_text(json.dumps(counts))


def _parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


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


def split_files(path: str | Path) -> list[Path]:
    """A prepared split's Parquet files, in name order."""
    return sorted(Path(path).glob("*.parquet"))


def split_rows(path: str | Path) -> int:
    """A prepared split's rows, from its files' footers."""
    return sum(_parquet_rows(p) for p in split_files(path))


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
    dropped: int = 0  # rows dropped for a missing value (data.missing=drop)


def code_version() -> str:
    """trainflow's version and a hash of the code that prepares data: an entry prepared by
    other code is not reused."""
    from trainflow import __version__
    from trainflow.pipelines import data, sources, tabular

    h = hashlib.sha256(__version__.encode())
    for module in (data, sources, tabular):
        h.update(Path(module.__file__).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def cache_key(info: SourceInfo, split: SplitConfig, cfg: PreprocessConfig) -> str:
    """What a prepared entry depends on: the input, the columns, the split, the preprocessing
    and trainflow's code (a new release may prepare differently)."""
    parts = {
        "fingerprint": info.fingerprint,
        "format": info.format,
        "features": info.feature_columns,
        "categorical": info.categorical_columns,
        "label": info.label_column,
        "classes": info.classes,
        "missing": info.missing,
        "image_mode": info.image_mode,
        "limit": info.limit,
        "split": split.model_dump(),
        "preprocess": cfg.model_dump(),
        "code": code_version(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def finished_entry(cache_root: Path, key: str) -> Path | None:
    """The entry for ``key`` when a run finished writing it (temporary folders never are)."""
    out = cache_root / key
    return out if (out / "counts.json").is_file() else None


def prepare(info: SourceInfo, split: SplitConfig, cfg: PreprocessConfig, cache_root: Path) -> PreparedEntry:
    """Check the rows, split, fit on train, transform and write every split; or reuse a
    finished entry with the same key. Tabular inputs go through Ray tasks per fragment
    (:mod:`trainflow.pipelines.tabular`); image folders through Ray Data, below."""
    key = cache_key(info, split, cfg)
    out = cache_root / key
    if finished_entry(cache_root, key):
        pre, counts = read_prepared(out)
        return PreparedEntry(out, pre, counts, key, reused=True)
    if info.format != "images":
        from trainflow.pipelines.tabular import prepare_tabular

        pre, counts, dropped = prepare_tabular(info, split, cfg, out)
        return PreparedEntry(out, pre, counts, key, reused=False, dropped=dropped)
    ds = load_dataset(info)
    if small_input(info):
        ds = ds.materialize()  # one read for every pass below
    report = check_rows(ds, info)
    dropped = report.missing_rows  # check_rows let them through only for data.missing=drop
    if dropped:
        columns = [*([] if info.format == "images" else info.feature_columns), info.label_column]
        ds = ds.map_batches(drop_missing, fn_kwargs={"columns": columns}, batch_format="pandas")
    classes = info.classes if info.classes is not None else report.labels
    small = split_is_exact(info, report.rows - dropped)
    splits = split_dataset(ds, split, info.label_column, exact=small)
    pre = fit_preprocessor(
        splits["train"],
        numeric=[] if info.format == "images" else info.numeric_columns,
        categorical=info.categorical_columns,
        label_column=info.label_column,
        classes=classes,
        cfg=cfg,
        image_channels=(3 if info.image_mode == "RGB" else 1) if info.format == "images" else None,
    )
    counts = write_prepared(splits, pre, out, seed=split.seed, shuffle=small)
    return PreparedEntry(out, pre, counts, key, reused=False, dropped=dropped)
