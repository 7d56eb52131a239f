"""What the train split looked like, saved with every model: the reference that drift is
measured against (:mod:`trainflow.pipelines.drift.compare`).

A :class:`Profile` holds, per numeric column (and a regression's label), a bounded
sample of the train split's values: the rows with the :data:`PROFILE_ROWS` smallest
pseudo-random keys, a uniform sample that merges across batches and fragments, in any
order, into what one pass over every row would keep. Per categorical column (and a
classifier's label) it holds the count of each value. It is built in the same pass as
the fitted statistics (:class:`~trainflow.pipelines.data.stats.FitStats`), written as
``profile.json`` into the prepared entry, and copied into the best checkpoint of every
run trained on it (:func:`attach`), so a registered version carries it.

An image's pixels and a transform's array columns are not profiled: the label is.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from trainflow.files import join, read_text, write_text
from trainflow.pipelines.data.schema import SourceInfo

PROFILE = "profile.json"
# The sampled rows kept: enough for a two-sample KS test and a ten-bin PSI to tell a
# shift of a few percent of a column's spread, and few enough that a checkpoint stays small.
PROFILE_ROWS = 1000
FORMAT = 1


def profile_columns(info: SourceInfo) -> tuple[list[str], list[str]]:
    """The columns a profile samples (numeric) and counts (categorical), the label
    among them by the objective."""
    numeric = [] if info.is_images else list(info.numeric_columns)
    categorical = [] if info.is_images else list(info.categorical_columns)
    (numeric if info.objective == "regression" else categorical).append(info.label_column)
    return numeric, categorical


def sample_keys(values: np.ndarray) -> np.ndarray:
    """A pseudo-random 64-bit key per row of ``values``, seeded by their bytes column by
    column: the same batch read again gets the same keys, and equal rows get different ones."""
    # A frame's columns arrive column-major: their bytes are checksummed where they lie.
    columns = values.T if values.flags.f_contiguous else np.ascontiguousarray(values.T)
    seed = zlib.crc32(columns)
    return np.random.default_rng(seed).integers(
        0, np.iinfo(np.uint64).max, len(values), dtype=np.uint64, endpoint=True
    )


@dataclass
class Profile:
    """A mergeable profile of rows: their count, a bounded sample of the numeric
    columns' values, the counts of the categorical columns' values."""

    rows: int = 0
    numeric: list[str] = field(default_factory=list)
    keys: np.ndarray | None = None  # the sampled rows' keys
    values: np.ndarray | None = None  # float64 [sampled rows, numeric columns]
    counts: dict[str, dict[Any, int]] = field(default_factory=dict)  # column: value: rows

    def add(
        self, frame: pd.DataFrame, numeric: list[str], categorical: list[str], taken: np.ndarray | None = None
    ) -> None:
        """Rows of ``frame``; ``taken``: float64 values of the first of ``numeric``, taken
        from it already (they are kept as they are, not changed)."""
        if not len(frame):
            return
        self.rows += len(frame)
        if numeric:
            self.numeric = list(numeric)
            values = taken
            done = 0 if taken is None else taken.shape[1]
            if done < len(numeric):
                rest = frame[numeric[done:]].to_numpy(dtype=np.float64, na_value=np.nan)
                values = rest if taken is None else np.hstack([taken, rest])
            self._keep(sample_keys(values), values)
        for c in categorical:
            mine = self.counts.setdefault(c, {})
            for value, n in frame[c].dropna().value_counts(sort=False).items():
                value = value.item() if isinstance(value, np.generic) else value
                mine[value] = mine.get(value, 0) + int(n)

    def merge(self, other: Profile) -> None:
        self.rows += other.rows
        if other.keys is not None:
            self.numeric = other.numeric
            self._keep(other.keys, other.values)
        for c, theirs in other.counts.items():
            mine = self.counts.setdefault(c, {})
            for value, n in theirs.items():
                mine[value] = mine.get(value, 0) + n

    def _keep(self, keys: np.ndarray, values: np.ndarray) -> None:
        """The rows of the PROFILE_ROWS smallest keys among the kept ones and these."""
        if self.keys is not None and len(self.keys) == PROFILE_ROWS:
            # Full: only a row whose key is below the largest kept one can enter.
            entering = keys < self.keys.max()
            keys = keys[entering]
            values = values[entering]
        if self.keys is not None:
            keys = np.concatenate([self.keys, keys])
            values = np.concatenate([self.values, values])
        if len(keys) > PROFILE_ROWS:
            smallest = np.argpartition(keys, PROFILE_ROWS - 1)[:PROFILE_ROWS]
            keys = keys[smallest]
            values = values[smallest]
        self.keys = keys
        self.values = values

    def to_dict(self, label: str | None = None) -> dict[str, Any]:
        """The profile as ``profile.json`` holds it: per numeric column its sampled values
        (sorted, to 7 significant digits), per categorical column its values and counts."""
        sampled = self.values if self.values is not None else np.zeros((0, len(self.numeric)))
        counts = {}
        for c, seen in self.counts.items():
            values = sorted(seen, key=_value_order)
            counts[c] = {"values": values, "counts": [seen[v] for v in values]}
        return {
            "format": FORMAT,
            "rows": self.rows,
            "sample_rows": len(sampled),
            "label": label,
            "numeric": {c: _short(np.sort(sampled[:, j])) for j, c in enumerate(self.numeric)},
            "categorical": counts,
        }


def _value_order(v: Any) -> tuple[str, Any]:
    """Numbers as numbers, strings as strings (as the fitted classes are sorted)."""
    return ("0" if isinstance(v, (bool, int, float)) else type(v).__name__, v)


def _short(values: np.ndarray) -> list[float | int]:
    """Finite values to 7 significant digits (whole numbers as integers): a sample's
    JSON at a few characters a value."""
    out: list[float | int] = []
    for value in values[np.isfinite(values)].tolist():
        v = float(f"{value:.7g}")
        out.append(int(v) if v.is_integer() and abs(v) < 2**53 else v)
    return out


def frame_profile(frame: pd.DataFrame, numeric: list[str], categorical: list[str]) -> dict[str, Any]:
    """The profile of any rows, of the columns named (those the frame holds): what new
    data or served requests are compared with a model's profile as."""
    numeric = [c for c in numeric if c in frame]
    categorical = [c for c in categorical if c in frame]
    profile = Profile()
    profile.add(frame, numeric, categorical)
    return profile.to_dict()


def save(folder: str, profile: dict[str, Any]) -> None:
    write_text(join(folder, PROFILE), json.dumps(profile, separators=(",", ":")))


def load(folder: str) -> dict[str, Any] | None:
    """The profile saved in a prepared entry or checkpoint folder; None when it has none
    (a model registered before profiles were saved)."""
    text = read_text(join(folder, PROFILE))
    return None if text is None else json.loads(text)


def attach(entry: str, checkpoint: str) -> None:
    """Copy a prepared entry's profile into a checkpoint folder trained on it, where the
    registry's copy of the checkpoint takes it along."""
    text = read_text(join(entry, PROFILE))
    if text is not None:
        write_text(join(checkpoint, PROFILE), text)
