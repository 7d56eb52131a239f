"""What one pass over the rows learns, in objects that merge across batches and fragments:
the row checks' counts (:class:`RowCounts`) and the train split's statistics
(:class:`FitStats`), from which the fitted :class:`Preprocessor` comes.

Each worker adds its batches to its own objects; the driver merges them, in any order,
into what one pass over all rows would give.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from trainflow.config import PreprocessConfig
from trainflow.pipelines.data import transform as transforms
from trainflow.pipelines.data.missing import DROP_HINT, MISSING
from trainflow.pipelines.data.preprocess import MAX_VOCABULARY, Preprocessor, image_chunk_rows, image_features
from trainflow.pipelines.data.profile import Profile, profile_columns
from trainflow.pipelines.data.schema import IMAGE, DataError, SourceInfo

# A label with more distinct values than this is almost surely a regression target.
MAX_CLASSES = 1000


def plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def value_order(v: Any) -> tuple[str, Any]:
    """Sorts labels and categories: numbers as numbers, strings as strings."""
    return ("0" if isinstance(v, (bool, int, float)) else type(v).__name__, v)


@dataclass
class RowCounts:
    """Rows, rows with a missing value, per-column missing values and infinities, and the
    labels seen (up to MAX_CLASSES + 1)."""

    rows: int = 0
    missing_rows: int = 0
    missing: dict[str, int] = field(default_factory=dict)
    inf: dict[str, int] = field(default_factory=dict)
    labels: set = field(default_factory=set)

    def add(self, batch: pd.DataFrame, info: SourceInfo) -> None:
        checked = [info.label_column] if info.is_images else [*info.input_columns, info.label_column]
        regression = info.objective == "regression"
        numeric = set() if info.is_images else set(info.numeric_columns)
        if regression:
            numeric.add(info.label_column)
        self.rows += len(batch)
        # Column by column: a frame of the batch's missing flags would cost a copy of it.
        any_missing = np.zeros(len(batch), dtype=bool)
        for c in checked:
            values = batch[c]
            missing = _missing(values)
            n = int(np.count_nonzero(missing))
            self.missing[c] = self.missing.get(c, 0) + n
            if n:
                any_missing |= missing
            if c in numeric:
                self.inf[c] = self.inf.get(c, 0) + _infinities(values)
        self.missing_rows += int(np.count_nonzero(any_missing))
        for c, spec in info.arrays.items():
            # Each row's array of the one shape and kind (else ConfigError); of floats, finite.
            arr = transforms.stack(batch[c][batch[c].notna()], c, spec, info.transform)
            if arr.dtype.kind == "f":
                bad = ~np.isfinite(arr.reshape(len(arr), -1))
                self.inf[c] = self.inf.get(c, 0) + int(bad.any(axis=1).sum())
        if not regression and len(self.labels) <= MAX_CLASSES:
            self.labels.update(
                plain(v) for v in batch[info.label_column].dropna().unique()[: MAX_CLASSES + 1]
            )

    def merge(self, other: RowCounts) -> None:
        self.rows += other.rows
        self.missing_rows += other.missing_rows
        for mine, theirs in ((self.missing, other.missing), (self.inf, other.inf)):
            for c, n in theirs.items():
                mine[c] = mine.get(c, 0) + n
        self.labels |= other.labels

    @property
    def kept(self) -> int:
        """The rows that are split and trained on (data.missing=drop drops the others)."""
        return self.rows - self.missing_rows

    def sorted_labels(self) -> list[Any]:
        return sorted(self.labels, key=value_order)

    def check(self, info: SourceInfo) -> None:
        """The errors that would spoil training, each naming the column and how many rows."""
        src = info.source
        if self.rows == 0:
            raise DataError(f"data.source {src}: no rows")
        for c, n in self.inf.items():
            if n:
                what = "NaN or inf" if c in info.arrays else "inf"
                raise DataError(f"data.source {src}: column {c!r} holds {what} in {n} of {self.rows} rows")
        if self.missing_rows and info.missing == "fail":
            c, n = next((c, n) for c, n in self.missing.items() if n)
            raise DataError(
                f"data.source {src}: column {c!r} has {n} missing values ({MISSING}) in {self.rows} rows; "
                f"{DROP_HINT}"
            )
        if self.missing_rows == self.rows:
            raise DataError(f"data.source {src}: every one of its {self.rows} rows has a missing value")
        if info.objective == "regression":
            return
        labels = self.sorted_labels()
        if info.classes is not None:
            declared = {str(c) for c in info.classes}
            outside = [v for v in labels if str(v) not in declared]
            if outside:
                raise DataError(
                    f"data.label_column {info.label_column!r}: labels {outside[:5]} in {src} are outside "
                    f"data.classes {info.classes}; list them in data.classes, or remove those rows"
                )
        elif len(labels) > MAX_CLASSES:
            raise DataError(
                f"data.label_column {info.label_column!r} has more than {MAX_CLASSES} distinct values; "
                "a classifier label has fewer (set objective: regression to predict a number)"
            )
        if len(info.classes or labels) < 2:
            raise DataError(
                f"data.label_column {info.label_column!r} needs at least 2 classes, found {labels}"
            )


def _missing(values: pd.Series) -> np.ndarray:
    """Each value's missing flag (None, NaN or NA)."""
    if isinstance(values.dtype, np.dtype) and values.dtype.kind == "f":
        return np.isnan(values.to_numpy())
    return values.isna().to_numpy()


def _infinities(values: pd.Series) -> int:
    """How many of a numeric column's values are infinite: none of integers or booleans."""
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "iub":
        return 0
    if isinstance(values.dtype, np.dtype) and values.dtype.kind == "f":
        return int(np.count_nonzero(np.isinf(values.to_numpy())))
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    return int(np.count_nonzero(np.isinf(numbers)))


def float_arrays(info: SourceInfo) -> dict[str, dict[str, Any]]:
    """The array columns of floats, scaled as the numeric columns are; integer arrays
    (token ids) pass through as they are."""
    return {c: spec for c, spec in info.arrays.items() if np.dtype(spec["dtype"]).kind == "f"}


def kept_rows(batch: pd.DataFrame, info: SourceInfo) -> pd.DataFrame:
    """The rows that are split and trained on: all, or for data.missing=drop those
    without a missing value (any other missing value fails the checks)."""
    if info.missing != "drop" or info.is_images:
        return batch
    return batch.dropna(subset=[*info.input_columns, info.label_column])


@dataclass
class FitStats:
    """What fitting needs of the train split: per numeric column the count, mean and sum
    of squared deviations (Chan's parallel update, stable where sums of squares are not)
    or the minimum and maximum; the categories of each categorical column; for images
    the per-channel sums of pixels (resized to ``image_shape``, in [0, 1]) and of their
    squares; for a regression the label's mean and sum of squared deviations; and the
    train split's :class:`Profile`, which drift is measured against."""

    rows: int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    categories: dict[str, set] = field(default_factory=dict)
    pixels: int = 0
    channel_sums: np.ndarray | None = None
    channel_squares: np.ndarray | None = None
    label_mean: float = 0.0
    label_m2: float = 0.0
    profile: Profile = field(default_factory=Profile)

    def add(self, frame: pd.DataFrame, info: SourceInfo, scaler: str, image_shape: list[int] | None = None):
        if not len(frame):
            return
        numeric = [] if info.is_images else info.numeric_columns
        # The numeric columns as one float64 matrix, taken once for the profile and the moments.
        x = frame[numeric].to_numpy(dtype=np.float64, na_value=np.nan) if numeric else None
        self.profile.add(frame, *profile_columns(info), taken=x)
        if info.is_images:
            if scaler == "standard":
                self._add_images(frame[IMAGE], image_shape)
        else:
            self._add_numeric(frame, info, scaler, x)
            for c in info.categorical_columns:
                values = self.categories.setdefault(c, set())
                if len(values) <= MAX_VOCABULARY:
                    values.update(plain(v) for v in frame[c].dropna().unique()[: MAX_VOCABULARY + 1])
        if info.objective == "regression":
            y = np.asarray(frame[info.label_column], dtype=np.float64)
            mean = float(y.mean())
            self._merge_label(len(y), mean, float(((y - mean) ** 2).sum()))
        self.rows += len(frame)

    def _add_numeric(self, frame: pd.DataFrame, info: SourceInfo, scaler: str, x: np.ndarray | None) -> None:
        """The numeric columns' statistics (``x``: their values, not changed here), then
        each number of the float array columns'."""
        floats = float_arrays(info)
        if not (x is not None or floats) or scaler == "none":
            return
        parts = [x] if x is not None else []
        for c, spec in floats.items():
            arr = transforms.stack(frame[c], c, spec, info.transform)
            parts.append(arr.reshape(len(arr), -1).astype(np.float64))
        x = parts[0] if len(parts) == 1 else np.hstack(parts)
        if scaler == "standard":
            mean = x.mean(axis=0)
            deviations = x - mean
            self._merge_moments(len(x), mean, np.square(deviations, out=deviations).sum(axis=0))
        else:
            self._merge_range(x.min(axis=0), x.max(axis=0))

    def _add_images(self, images, shape: list[int]) -> None:
        raw = {"shape": shape, "mean": [0.0] * shape[0], "std": [1.0] * shape[0]}
        images = list(images)
        step = image_chunk_rows(shape)
        for start in range(0, len(images), step):
            x = image_features(images[start : start + step], raw).reshape(-1, shape[0], np.prod(shape[1:]))
            sums = x.sum(axis=(0, 2), dtype=np.float64)
            squares = np.square(x, out=x).sum(axis=(0, 2), dtype=np.float64)
            self._merge_channels(x.shape[0] * x.shape[2], sums, squares)

    def merge(self, other: FitStats) -> None:
        self.profile.merge(other.profile)
        if other.mean is not None:
            self._merge_moments(other.rows, other.mean, other.m2)
        if other.lo is not None:
            self._merge_range(other.lo, other.hi)
        if other.channel_sums is not None:
            self._merge_channels(other.pixels, other.channel_sums, other.channel_squares)
        for c, values in other.categories.items():
            self.categories.setdefault(c, set()).update(values)
        if other.rows:
            self._merge_label(other.rows, other.label_mean, other.label_m2)
        self.rows += other.rows

    def _merge_moments(self, n: int, mean: np.ndarray, m2: np.ndarray) -> None:
        if self.mean is None:
            self.mean = mean
            self.m2 = m2
            return
        total = self.rows + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.rows * n / total)

    def _merge_label(self, n: int, mean: float, m2: float) -> None:
        # Chan's update, as _merge_moments; self.rows is the rows merged so far.
        total = self.rows + n
        delta = mean - self.label_mean
        self.label_mean += delta * n / total
        self.label_m2 += m2 + delta**2 * self.rows * n / total

    def _merge_range(self, lo: np.ndarray, hi: np.ndarray) -> None:
        self.lo = lo if self.lo is None else np.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else np.maximum(self.hi, hi)

    def _merge_channels(self, pixels: int, sums: np.ndarray, squares: np.ndarray) -> None:
        if self.channel_sums is None:
            self.pixels = pixels
            self.channel_sums = sums
            self.channel_squares = squares
            return
        self.pixels += pixels
        self.channel_sums = self.channel_sums + sums
        self.channel_squares = self.channel_squares + squares

    def preprocessor(
        self,
        info: SourceInfo,
        classes: list[Any],
        cfg: PreprocessConfig,
        image_shape: list[int] | None = None,
    ) -> Preprocessor:
        """The fitted state. A constant column or channel (std or range 0) is shifted but
        not scaled."""
        if self.rows == 0:
            raise DataError("the train split is empty; add rows or change data.split")
        numeric = [] if info.is_images else info.numeric_columns
        pre = Preprocessor(
            list(numeric), info.label_column, list(classes), scaler=cfg.scaler, objective=info.objective
        )
        if info.objective == "regression":
            # The label is always standardized: a loss over raw units (prices, say) would
            # need a learning rate per dataset.
            pre.label_offset = self.label_mean
            pre.label_scale = float(np.sqrt(self.label_m2 / self.rows)) or 1.0
        pre.arrays = {c: dict(spec) for c, spec in info.arrays.items()}
        if cfg.scaler != "none" and (numeric or float_arrays(info)):
            if cfg.scaler == "standard":
                offset = self.mean
                spread = np.sqrt(self.m2 / self.rows)
            else:
                offset = self.lo
                spread = self.hi - self.lo
            offset = [float(v) for v in offset]
            spread = [float(v) or 1.0 for v in spread]
            pre.offset = offset[: len(numeric)]
            pre.scale = spread[: len(numeric)]
            start = len(numeric)
            for c, spec in float_arrays(info).items():  # each float array's numbers follow, in order
                end = start + transforms.width(spec)
                pre.arrays[c].update(offset=offset[start:end], scale=spread[start:end])
                start = end
        if info.transform:
            pre.transform = {
                "path": info.transform,
                "hash": transforms.code_hash(info.transform),
                "columns": dict(info.raw_columns),
            }
        for c in info.categorical_columns:
            values = self.categories.get(c, set())
            if len(values) > MAX_VOCABULARY:
                raise DataError(
                    f"data.categorical_columns: {c!r} has more than {MAX_VOCABULARY} categories in the "
                    "train split; fewer are one-hot encoded"
                )
            pre.categorical[c] = sorted(values, key=value_order)
        if info.is_images:
            pre.image = self._image_state(image_shape, cfg)
        return pre

    def _image_state(self, shape: list[int], cfg: PreprocessConfig) -> dict[str, Any]:
        channels = shape[0]
        image = {"shape": shape, "mean": [0.0] * channels, "std": [1.0] * channels, "augment": cfg.augment}
        if cfg.image_mean is not None:
            image["mean"] = list(cfg.image_mean)
            image["std"] = list(cfg.image_std)
        elif cfg.scaler == "standard" and self.pixels:
            mean = self.channel_sums / self.pixels
            var = self.channel_squares / self.pixels - mean**2
            image["mean"] = [float(m) for m in mean]
            image["std"] = [float(np.sqrt(v)) if v > 1e-12 else 1.0 for v in var]
        return image
