"""Preprocessing: the fitted state (:class:`Preprocessor`, plain JSON) and the pure
functions that apply it to raw rows.

The state is fitted on the train split alone (:mod:`trainflow.pipelines.data.stats`) and
travels inside every checkpoint, so evaluation and prediction apply exactly what
training saw. Prepared splits hold ``features`` (a float32 tensor per row: the numeric
columns, the categorical ones one-hot, or the image) and ``label`` (the class index; for
a regression, the label scaled as the numeric features are, by statistics of the train
split). A ``preprocess.transform``'s array columns are each a column of their own name
beside them (:meth:`Preprocessor.inputs`), and ``features`` is left out when nothing
else is read. The transform's reference travels in the state too: prediction hands it
the raw columns (:meth:`Preprocessor.model_inputs`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from trainflow.config.sections import listed
from trainflow.files import is_uri, read_text, write_text
from trainflow.pipelines.data import tokenizer
from trainflow.pipelines.data import transform as transforms
from trainflow.pipelines.data.schema import IMAGE, DataError

if TYPE_CHECKING:
    import ray.data
    import torch

log = logging.getLogger("trainflow")

FEATURES = "features"
LABEL = "label"
# Categorical columns with more distinct values than this in the train split are refused:
# one-hot encoding them would make the model's input that wide.
MAX_VOCABULARY = 10_000
# The keys an older trainflow wrote (checkpoints registered then must keep loading):
# the numeric columns, the scaler's offset (mean, or minimum under minmax) and scale
# (std, or range), and the objective.
_OLD_KEYS = {"feature_columns": "numeric_columns", "mean": "offset", "std": "scale", "task": "objective"}
# Images are transformed this many bytes of float32 output at a time (some ten thousand
# 28x28 grayscale images, about fifty 224x224 RGB ones), so a batch of large images
# never needs its whole float copy at once.
IMAGE_CHUNK_BYTES = 32 << 20


@dataclass
class Preprocessor:
    """The fitted state, plain JSON. The model's input for a row is: the numeric columns
    scaled (``(x - offset) / scale``), then each categorical column one-hot (an unknown
    category: all zeros); for images (an image folder, a torchvision dataset), the image
    resized, scaled to [0, 1], normalized per channel, flat."""

    numeric_columns: list[str]  # in the model's order; the categorical columns follow
    label_column: str
    classes: list[Any]  # the model's output i is classes[i]
    offset: list[float] = field(default_factory=list)  # per numeric column: mean, or minimum (minmax)
    scale: list[float] = field(default_factory=list)  # per numeric column: std, or max - min (minmax)
    scaler: str = "standard"  # standard | minmax | none (offset and scale empty)
    categorical: dict[str, list[Any]] = field(default_factory=dict)  # column: vocabulary
    # Images: {"shape": [c, h, w], "mean": [...], "std": [...], "augment": bool}.
    image: dict[str, Any] | None = None
    objective: str = "classification"  # or regression: classes empty, the label a number
    # Regression: the label is trained on as (y - label_offset) / label_scale (the train
    # split's mean and std), and predictions are unscaled back.
    label_offset: float = 0.0
    label_scale: float = 1.0
    # A transform's array columns: {"shape", "dtype"}, and for floats under a scaler the
    # "offset" and "scale" of each of their numbers. Integer arrays keep their dtype.
    arrays: dict[str, dict[str, Any]] = field(default_factory=dict)
    # preprocess.transform: {"path": package.module:name, "hash": its module's code,
    # "columns": the source's columns it is handed, with their Arrow types}.
    transform: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The state as JSON holds it; without a transform, as a trainflow before
        transforms wrote it (no ``arrays``, no ``transform``)."""
        state = asdict(self)
        for key in ("arrays", "transform"):
            if not state[key]:
                del state[key]
        return state

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Preprocessor:
        """The state as :meth:`to_dict` writes it, or as an older trainflow wrote it: 0.1.0
        (before ``numeric_columns``, ``offset`` and ``scale``), or any before ``objective``
        (``task``)."""
        state = {_OLD_KEYS.get(k, k): v for k, v in state.items()}
        if not state.pop("standardize", True):
            state["offset"] = []
            state["scale"] = []
            state["scaler"] = "none"
        return cls(**state)

    def save(self, path: str | Path) -> None:
        """Write it as JSON at ``path``, a local file or a URI."""
        write_text(path, json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> Preprocessor:
        """The state saved at ``path``; a checkpoint's tokenizer, named relative to its
        folder, is found there."""
        text = read_text(path)
        if text is None:
            raise FileNotFoundError(f"no preprocessor at {path}")
        pre = cls.from_dict(json.loads(text))
        if pre.transform and tokenizer.is_reference(pre.transform["path"]) and not is_uri(str(path)):
            pre.transform["path"] = tokenizer.located(pre.transform["path"], Path(path).parent)
        return pre

    @property
    def input_columns(self) -> list[str]:
        """Every column the model reads from a prepared row: numeric, categorical, a
        transform's arrays, the image."""
        return [*self.numeric_columns, *self.categorical, *self.arrays, *([IMAGE] if self.image else [])]

    @property
    def raw_columns(self) -> list[str]:
        """The columns a prediction's rows hold: the source's columns the transform is
        handed (but the label), else the input columns."""
        if not self.transform:
            return self.input_columns
        return [c for c in self.transform["columns"] if c != self.label_column]

    @property
    def layout(self) -> dict[str, dict[str, Any]] | None:
        """The prepared inputs by name, each ``{"shape": [...], "dtype": ...}`` per row, in
        the prepared splits' order: ``features`` when anything but arrays is read, then each
        array column. None without array columns: ``features`` alone, the model's one input."""
        if not self.arrays:
            return None
        flat = self.num_features - sum(transforms.width(spec) for spec in self.arrays.values())
        out = {FEATURES: {"shape": [flat], "dtype": "float32"}} if flat else {}
        return out | {c: {"shape": list(s["shape"]), "dtype": s["dtype"]} for c, s in self.arrays.items()}

    @property
    def is_regression(self) -> bool:
        return self.objective == "regression"

    @property
    def num_outputs(self) -> int:
        """The model's outputs: one per class, or one number for a regression."""
        return 1 if self.is_regression else len(self.classes)

    def unscale(self, y: np.ndarray) -> np.ndarray:
        """A regression's outputs (or prepared labels) in the label's own units."""
        return np.asarray(y, dtype=np.float64) * self.label_scale + self.label_offset

    @property
    def chunk_rows(self) -> int | None:
        """Rows transformed at a time: for images, IMAGE_CHUNK_BYTES of output; else all."""
        return image_chunk_rows(self.image["shape"]) if self.image else None

    @property
    def num_features(self) -> int:
        """The numbers of a row's inputs, flat: the model's input width."""
        image = int(np.prod(self.image["shape"])) if self.image else 0
        arrays = sum(transforms.width(spec) for spec in self.arrays.values())
        return image + len(self.numeric_columns) + sum(len(v) for v in self.categorical.values()) + arrays

    def model_inputs(self, frame: pd.DataFrame | dict[str, Any]) -> np.ndarray | dict[str, np.ndarray]:
        """The model's input for raw rows (a frame, or a dict of columns), through the
        transform when there is one: ``features`` alone, or every input by name."""
        if self.transform:
            missing = [c for c in self.raw_columns if c not in frame]
            if missing:
                field, value = transforms.named(self.transform["path"])
                raise DataError(
                    f"input lacks the columns {', '.join(map(repr, missing))} that the model's "
                    f"{field} {value} takes"
                )
            frame = transforms.apply(
                self.transform["path"], pd.DataFrame({c: frame[c] for c in self.raw_columns})
            )
        inputs = self.inputs(frame)
        return inputs[FEATURES] if self.layout is None else inputs

    def inputs(self, frame: pd.DataFrame | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The prepared inputs of rows of the input columns, by name (:attr:`layout`)."""
        names = _names(frame)
        missing = [c for c in self.input_columns if c not in names]
        if missing:
            raise DataError(f"input lacks feature columns {listed(missing)} that the model was trained on")
        out = {FEATURES: self.features(frame)} if self.layout is None or FEATURES in self.layout else {}
        for column, spec in self.arrays.items():
            out[column] = self._array(frame[column], column, spec)
        return out

    def _array(self, values, column: str, spec: dict[str, Any]) -> np.ndarray:
        """An array column as its prepared array: integers as they are, floats scaled
        number by number when the scaler fitted them."""
        x = transforms.stack(values, column, spec, self.transform["path"] if self.transform else "")
        if "offset" not in spec or not len(x):
            return x
        # Centred in float64, then narrowed, as the numeric columns are.
        flat = (x.reshape(len(x), -1).astype(np.float64) - spec["offset"]) / np.asarray(spec["scale"])
        return flat.astype(np.float32).reshape(x.shape)

    def features(self, frame: pd.DataFrame | dict[str, np.ndarray]) -> np.ndarray:
        """The ``features`` input for rows of the input columns (a frame, or a dict of
        columns): the numeric columns scaled, the categorical ones one-hot, or the image."""
        names = _names(frame)
        missing = [c for c in self.input_columns if c not in names and c not in self.arrays]
        if missing:
            raise DataError(f"input lacks feature columns {listed(missing)} that the model was trained on")
        parts = []
        if self.image:
            parts.append(image_features(frame[IMAGE], self.image))
        if self.numeric_columns:
            parts.append(self._numeric(frame))
        for column, vocabulary in self.categorical.items():
            parts.append(one_hot(np.asarray(frame[column]), vocabulary))
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def _numeric(self, frame: pd.DataFrame | dict[str, np.ndarray]) -> np.ndarray:
        columns = self.numeric_columns
        if isinstance(frame, pd.DataFrame):
            block = frame[columns]
            # float32 columns are taken as they are: the subtraction below widens them itself.
            narrow = all(dtype == np.float32 for dtype in block.dtypes)
            return self._numeric_block(block.to_numpy() if narrow else block.to_numpy(dtype=np.float64))
        if not self.offset:
            return np.stack([np.asarray(frame[c], dtype=np.float32) for c in columns], axis=1)
        # Centred in float64, then narrowed: a column far from zero (timestamps, say)
        # would lose its spread if cast to float32 first. Column by column into one
        # float32 block, which costs less than a float64 matrix.
        x = np.empty((len(columns), len(frame[columns[0]])), dtype=np.float32)
        for j, c in enumerate(columns):
            np.subtract(np.asarray(frame[c], dtype=np.float64), self.offset[j], out=x[j], casting="same_kind")
        x /= np.asarray(self.scale, dtype=np.float32)[:, None]
        return np.ascontiguousarray(x.T)

    def _numeric_block(self, block: np.ndarray) -> np.ndarray:
        """The numeric columns of a frame, taken in one pass (a column at a time costs a
        frame's index lookup each), scaled as :meth:`_numeric` scales them: centred in
        float64 straight into the float32 result, with no float64 matrix between (a new
        matrix of a batch's size costs its pages' first touch)."""
        if not self.offset:
            return block.astype(np.float32)
        x = np.empty(block.shape, dtype=np.float32)
        np.subtract(block, np.asarray(self.offset, dtype=np.float64), out=x, casting="same_kind")
        x /= np.asarray(self.scale, dtype=np.float32)
        return x

    def labels(self, values: pd.Series | np.ndarray) -> np.ndarray:
        """Class indices for raw label values, a value outside the classes an error; for a
        regression, the values scaled (float32)."""
        if self.is_regression:
            y = np.asarray(values, dtype=np.float64)
            return ((y - self.label_offset) / self.label_scale).astype(np.float32)
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


def image_chunk_rows(shape: list[int]) -> int:
    """Images transformed at once into ``shape``: IMAGE_CHUNK_BYTES of float32 output."""
    return max(1, IMAGE_CHUNK_BYTES // (4 * int(np.prod(shape))))


def _as_chw(img, channels: int):
    """One image as a [C, H, W] uint8 tensor: an HxW or HxWxC array, or a PNG or JPEG
    file's bytes (decoded, in the mode of ``channels``: L for 1, RGB for 3)."""
    import torch

    if isinstance(img, (bytes, bytearray, memoryview)):
        import io

        from PIL import Image, UnidentifiedImageError

        try:
            img = Image.open(io.BytesIO(img)).convert("L" if channels == 1 else "RGB")
        except (UnidentifiedImageError, OSError) as e:
            raise DataError(f"an image's bytes are not an image PIL reads: {e}") from None
    t = torch.from_numpy(np.array(img, dtype=np.uint8))  # a copy: Ray hands over read-only arrays
    if t.ndim not in (2, 3):
        raise DataError(
            f"an image has shape {list(t.shape)}; give [H, W] or [H, W, C] pixels, or a file's bytes"
        )
    t = t.unsqueeze(0) if t.ndim == 2 else t.permute(2, 0, 1)
    if t.shape[0] != channels:
        raise DataError(f"an image has {t.shape[0]} channels, the model was trained on {channels}")
    return t


def image_features(images, image: dict[str, Any]) -> np.ndarray:
    """Images (HxWxC or HxW uint8 arrays, or encoded PNG/JPEG bytes) resized, scaled,
    normalized and flattened; images of one size are transformed together, at most
    :func:`image_chunk_rows` at a time."""
    import torch

    transform = _image_pipeline(image)
    channels = image["shape"][0]
    chunk = image_chunk_rows(image["shape"])
    out = np.empty((len(images), int(np.prod(image["shape"]))), dtype=np.float32)
    run: list[torch.Tensor] = []  # consecutive images of one size, not yet transformed
    done = 0
    for img in images:
        t = _as_chw(img, channels)
        if run and (t.shape != run[0].shape or len(run) == chunk):
            out[done : done + len(run)] = transform(torch.stack(run)).reshape(len(run), -1).numpy()
            done = done + len(run)
            run = []
        run.append(t)
    if run:
        out[done:] = transform(torch.stack(run)).reshape(len(run), -1).numpy()
    return out


def augment_images(x: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Train-only augmentation of prepared image rows (``x``: one flattened image per row,
    ``shape``: channels, height, width): a random crop (the image padded by an eighth of
    its side) and a random horizontal flip, drawn per image from torch's generator."""
    import torch
    from torchvision.transforms import v2

    c, h, w = shape
    transform = v2.Compose([v2.RandomCrop((h, w), padding=max(1, h // 8)), v2.RandomHorizontalFlip()])
    images = x.reshape(-1, c, h, w)
    out = torch.stack([transform(img) for img in images]) if len(images) else images
    return out.reshape(len(x), -1)


def augment_batch(batch: dict[str, np.ndarray], *, shape: list[int]) -> dict[str, np.ndarray]:
    """:func:`augment_images` of a batch of prepared rows, as Ray Data maps a streamed
    train split."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(batch[FEATURES], dtype=np.float32))
    return {FEATURES: augment_images(x, shape).numpy(), LABEL: batch[LABEL]}


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


def _names(frame: pd.DataFrame | dict[str, Any]) -> Any:
    """What ``in`` asks of the frame's columns: a set of a frame's (its index's own test
    converts the whole index per frame), the dict itself."""
    return set(frame.columns) if isinstance(frame, pd.DataFrame) else frame
