"""Reading an input's rows, fragment by fragment, in bounded memory.

A fragment is a slice of the input that one worker reads on its own:

- tables: a run of a Parquet file's row groups (about FRAGMENT_BYTES of rows), a CSV,
  JSON lines or NumPy file, or the bundled digits;
- image folders: IMAGE_FRAGMENT_FILES image files, decoded as ``ray.data.read_images``
  decodes them, each with its label (its folder's name) and its path;
- a converted torchvision dataset: one Parquet row group of images, each with its class
  name and its index;
- a ``ray.data.Dataset``: one of its materialized blocks.

:func:`plan_fragments` cuts the input in the driver (reading only Parquet footers);
:func:`fragment_batches` yields a fragment's rows a batch at a time, through the user's
``preprocess.transform`` when there is one, and names the file when one cannot be read.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from trainflow.pipelines.data import sources
from trainflow.pipelines.data import transform as transforms
from trainflow.pipelines.data.missing import blanks_as_null
from trainflow.pipelines.data.schema import (
    IMAGE,
    INDEX,
    PATH,
    UNREADABLE,
    DataError,
    SourceInfo,
    filesystem,
    unreadable,
)

TABLE_FORMATS = ("parquet", "csv", "json", "numpy", "builtin", "dataset")
# About this many bytes of decoded rows per fragment (Parquet row groups are grouped
# up to it); a CSV, JSON lines or NumPy file is one fragment whatever its size.
FRAGMENT_BYTES = 64 << 20
# Rows a worker holds at once: up to BATCH_ROWS, fewer for wide inputs, so that a
# batch's float64 features (scaled in float64) stay near BATCH_BYTES.
BATCH_ROWS = 65_536
BATCH_BYTES = 64 << 20
IMAGE_FRAGMENT_FILES = 1024
# Images a worker decodes at once: up to IMAGE_BATCH, fewer when their decoded pixels
# pass IMAGE_BATCH_BYTES (a batch of 224x224 RGB images holds about 100).
IMAGE_BATCH = 256
IMAGE_BATCH_BYTES = 16 << 20


@dataclass(frozen=True)
class Fragment:
    index: int
    path: str = ""  # on the source's filesystem; "" for the digits and a Dataset's blocks
    row_groups: tuple[int, ...] | None = None  # Parquet: these row groups only
    max_rows: int | None = None  # data.limit: read no more than this many rows
    frame: pd.DataFrame | None = field(default=None, repr=False, compare=False)  # digits: the rows
    files: tuple[str, ...] = ()  # image folders: these images
    block: Any = field(default=None, repr=False, compare=False)  # a Dataset's: an Arrow block's ref


def batch_rows(info: SourceInfo) -> int:
    if info.is_images:
        return IMAGE_BATCH
    return max(1024, min(BATCH_ROWS, BATCH_BYTES // (8 * (info.width + 1))))


def plan_fragments(info: SourceInfo) -> list[Fragment]:
    """The input cut into fragments, in the input's order (data.limit counts from the
    first row of the first file). Reads only Parquet footers; text files' row counts are
    unknown until read, so their data.limit is applied by :func:`limit_fragments`."""
    if info.format == "builtin":
        # Loaded here, where inspect_source imported scikit-learn, not in a worker.
        return [Fragment(0, max_rows=info.limit, frame=sources.BUILTINS[info.source]())]
    if info.format == "dataset":
        return [Fragment(i, block=ref) for i, ref in enumerate(info.dataset.to_arrow_refs())]
    if info.format == "images":
        files = info.files[: info.limit] if info.limit else info.files
        chunks = range(0, len(files), IMAGE_FRAGMENT_FILES)
        return [Fragment(i, files=tuple(files[s : s + IMAGE_FRAGMENT_FILES])) for i, s in enumerate(chunks)]
    if info.format not in ("parquet", "image_parquet"):
        return [Fragment(i, path) for i, path in enumerate(info.files)]
    import pyarrow.parquet as pq

    fs = filesystem(info)
    fragments: list[Fragment] = []
    left = info.limit
    for path in info.files:
        with fs.open_input_file(path) as f:
            meta = pq.ParquetFile(f).metadata
        groups: list[int] = []
        rows = size = 0
        for g in range(meta.num_row_groups):
            if left is not None and left <= 0:
                break
            group = meta.row_group(g)
            groups.append(g)
            rows = rows + group.num_rows
            size = size + group.total_byte_size
            if left is not None:
                left -= group.num_rows
            # Images: a row group each (their transform, not their reading, takes the time).
            if size >= FRAGMENT_BYTES or info.is_images:
                fragments.append(_parquet_fragment(len(fragments), path, groups, rows, left))
                groups = []
                rows = 0
                size = 0
        if groups:
            fragments.append(_parquet_fragment(len(fragments), path, groups, rows, left))
    return fragments


def _parquet_fragment(index: int, path: str, groups: list[int], rows: int, left: int | None) -> Fragment:
    # A negative ``left`` means the limit falls inside these row groups.
    cap = rows + left if left is not None and left < 0 else None
    return Fragment(index, path, tuple(groups), cap)


def needs_counts(info: SourceInfo) -> bool:
    """Whether data.limit needs each file's row count, which only reading tells."""
    return info.limit is not None and info.format in ("csv", "json", "numpy")


def limit_fragments(info: SourceInfo, fragments: list[Fragment], counts: list[int]) -> list[Fragment]:
    """The fragments holding the first data.limit rows, given each one's row count."""
    out = []
    left = info.limit
    for f, n in zip(fragments, counts, strict=True):
        if left <= 0:
            break
        out.append(replace(f, index=len(out), max_rows=min(n, left)))
        left -= n
    return out


def count_rows(info: SourceInfo, fragment: Fragment) -> int:
    return sum(len(b) for b in fragment_batches(info, fragment, raw=True))


def fragment_batches(
    info: SourceInfo, fragment: Fragment, *, frames: bool = True, raw: bool = False
) -> Iterator[pd.DataFrame | dict[str, np.ndarray]]:
    """The fragment's rows (the input columns and the label; images: ``image``, ``path``
    and the label), at most :func:`batch_rows` at a time: DataFrames, or with
    ``frames=False`` a dict of column arrays (no copy into pandas' blocks); a file that
    cannot be read is a DataError naming it. With a transform, its output's columns, or
    with ``raw`` the source's columns it is handed (DataFrames, whatever ``frames``)."""
    left = fragment.max_rows
    where = fragment.path or info.source
    try:
        for batch in _read(info, fragment):
            if left is not None:
                if left <= 0:
                    return
                batch = batch.iloc[:left] if isinstance(batch, pd.DataFrame) else batch.slice(0, left)
                left -= len(batch)
            if info.transform:
                frame = batch if isinstance(batch, pd.DataFrame) else batch.to_pandas()
                frame = frame.reset_index(drop=True)
                out = frame if raw else transformed(info, frame)
                yield out if frames or raw else {c: out[c].to_numpy() for c in out.columns}
            elif isinstance(batch, pd.DataFrame):
                yield batch if frames else {c: batch[c].to_numpy() for c in batch.columns}
            else:
                # A block per column: the frame holds views of Arrow's buffers, where
                # pandas' one block per dtype would copy the batch into fresh pages.
                yield batch.to_pandas(split_blocks=True) if frames else _arrays(batch)
    except DataError:
        raise
    except UNREADABLE as e:
        raise unreadable(info.source, where, info.format, e) from None


def transformed(info: SourceInfo, frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of the source through the transform: its output's input columns and label,
    a row per row of ``frame``, in order."""
    return transforms.apply(info.transform, frame, label=info.label_column)[
        [*info.input_columns, info.label_column]
    ]


# The record batches each fragment's first pass read, for the passes after it while they
# run one after another in one process (:func:`remembered`), up to REMEMBER_BYTES in all.
REMEMBER_BYTES = 512 << 20


@dataclass
class _Remembered:
    batches: dict[tuple, list] = field(default_factory=dict)
    bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


_remembered: ContextVar[_Remembered | None] = ContextVar("trainflow_batches", default=None)


@contextmanager
def remembered() -> Iterator[None]:
    """Within the block, a fragment of a Parquet, CSV or JSON lines input read again is
    answered from memory, up to :data:`REMEMBER_BYTES` of decoded rows; forgotten when the
    block ends. A fragment is known by its file, row groups and columns."""
    token = _remembered.set(_Remembered())
    try:
        yield
    finally:
        _remembered.reset(token)


def _read(info: SourceInfo, fragment: Fragment) -> Iterator[Any]:
    """Arrow record batches, or DataFrames (digits, NumPy, images), of the fragment; from
    memory within :func:`remembered` when an earlier pass read them."""
    memo = _remembered.get()
    if memo is None or info.format not in ("parquet", "csv", "json"):
        yield from _read_source(info, fragment)
        return
    key = (info.source, fragment.path, fragment.row_groups, tuple(info.read_columns))
    if key in memo.batches:
        yield from memo.batches[key]
        return
    batches: list | None = []
    size = 0
    for batch in _read_source(info, fragment):
        size += batch.nbytes
        # Past what is left of the budget the fragment is not kept, nor held while read
        # (a CSV file is one fragment whatever its size).
        if batches is not None and memo.bytes + size <= REMEMBER_BYTES:
            batches.append(batch)
        else:
            batches = None
        yield batch
    # Kept only once read to its end: a reader that stopped early saw part of it.
    with memo.lock:
        if batches is not None and memo.bytes + size <= REMEMBER_BYTES:
            memo.batches[key] = batches
            memo.bytes += size


def _read_source(info: SourceInfo, fragment: Fragment) -> Iterator[Any]:
    columns = info.read_columns
    rows = batch_rows(info)
    if fragment.frame is not None:
        yield fragment.frame[columns]
        return
    if fragment.block is not None:
        import ray

        yield from ray.get(fragment.block).select(columns).to_batches(max_chunksize=rows)
        return
    fs = filesystem(info)
    if info.format == "images":
        yield from _image_files(info, fs, fragment.files)
    elif info.format == "image_parquet":
        yield from _image_rows(info, fs, fragment)
    elif info.format == "parquet":
        import pyarrow.parquet as pq

        with fs.open_input_file(fragment.path) as f:
            groups = list(fragment.row_groups) if fragment.row_groups is not None else None
            yield from pq.ParquetFile(f).iter_batches(batch_size=rows, row_groups=groups, columns=columns)
    elif info.format == "csv":
        import pyarrow.csv as pacsv

        # The column types inspect_source checked (inferred from the file's first block):
        # a later value that does not parse as its column's type fails naming the file.
        types = _text_schema(fs, fragment.path, "csv")
        with fs.open_input_stream(fragment.path) as f:
            reader = pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(block_size=16 << 20),
                convert_options=pacsv.ConvertOptions(
                    include_columns=columns, column_types={c: types.field(c).type for c in columns}
                ),
            )
            for batch in reader:
                yield from _rebatch(blanks_as_null(batch), rows)
    elif info.format == "json":
        import pyarrow.json as pajson

        types = _text_schema(fs, fragment.path, "json")
        with fs.open_input_stream(fragment.path) as f:
            reader = pajson.open_json(
                f,
                read_options=pajson.ReadOptions(block_size=16 << 20),
                parse_options=pajson.ParseOptions(explicit_schema=types),
            )
            for batch in reader:
                yield from _rebatch(batch.select(columns), rows)
    elif info.format == "numpy":
        with fs.open_input_stream(fragment.path) as f:
            frame = pd.DataFrame(sources.numpy_frame(f.read(), fragment.path))[columns]
        for start in range(0, len(frame), rows):
            yield frame.iloc[start : start + rows]
    else:
        raise DataError(
            f"data.format {info.format!r}: not a format trainflow reads ({', '.join(TABLE_FORMATS)})"
        )


def _image_files(info: SourceInfo, fs, paths: tuple[str, ...]) -> Iterator[pd.DataFrame]:
    """Images decoded as ``ray.data.read_images(mode=...)`` decodes them, with their
    labels and paths, in batches of at most IMAGE_BATCH images and about IMAGE_BATCH_BYTES
    of pixels; a file PIL cannot read is a DataError naming it."""
    from PIL import Image, UnidentifiedImageError

    images = []
    held = []
    size = 0
    for path in paths:
        with fs.open_input_file(path) as f:
            data = f.read()
        try:
            image = Image.open(io.BytesIO(data))
            if image.mode != info.image_mode:
                image = image.convert(info.image_mode)
            images.append(np.asarray(image))
        except (UnidentifiedImageError, OSError) as e:
            raise unreadable(info.source, path, "an image", e) from None
        held.append(path)
        size += images[-1].nbytes
        if len(images) >= IMAGE_BATCH or size >= IMAGE_BATCH_BYTES:
            yield _image_frame(images, {PATH: held}, info)
            images = []
            held = []
            size = 0
    if images:
        yield _image_frame(images, {PATH: held}, info)


def _image_frame(images: list[np.ndarray], columns: dict[str, Any], info: SourceInfo) -> pd.DataFrame:
    column = np.empty(len(images), dtype=object)  # one array per row, whatever their shapes
    for i, image in enumerate(images):
        column[i] = image
    frame = pd.DataFrame({IMAGE: column, **columns})
    return image_labels(frame, label_column=info.label_column) if PATH in columns else frame


def _image_rows(info: SourceInfo, fs, fragment: Fragment) -> Iterator[pd.DataFrame]:
    """A converted torchvision dataset's rows (:func:`sources.torchvision_parquet`): each
    image as a uint8 array in ``data.image_mode``, its class name and its index."""
    import pyarrow.parquet as pq
    import ray.data  # noqa: F401  registers Ray's tensor type, the image column's type

    columns = [sources.TORCHVISION_IMAGE, sources.TORCHVISION_LABEL, INDEX]
    with fs.open_input_file(fragment.path) as f:
        parquet = pq.ParquetFile(f)
        shape = parquet.schema_arrow.field(sources.TORCHVISION_IMAGE).type.shape
        rows = max(1, min(IMAGE_BATCH, IMAGE_BATCH_BYTES // max(1, int(np.prod(shape)))))
        for batch in parquet.iter_batches(
            batch_size=rows, row_groups=list(fragment.row_groups), columns=columns
        ):
            images = batch.column(sources.TORCHVISION_IMAGE).to_numpy(zero_copy_only=False)
            yield _image_frame(
                [_in_mode(image, info.image_mode) for image in images],
                {
                    INDEX: batch.column(INDEX).to_numpy(),
                    info.label_column: batch.column(sources.TORCHVISION_LABEL).to_numpy(zero_copy_only=False),
                },
                info,
            )


def _in_mode(image: np.ndarray, mode: str) -> np.ndarray:
    """A dataset's image (grayscale [H, W] or RGB [H, W, 3]) in ``mode``, converted as PIL
    converts a file's."""
    if (image.ndim == 2) == (mode == "L"):
        return image
    from PIL import Image

    return np.asarray(Image.fromarray(image).convert(mode))


def image_labels(batch: pd.DataFrame, *, label_column: str) -> pd.DataFrame:
    """Image rows with their label: the name of the folder each image sits in."""
    return batch.assign(**{label_column: [sources.image_label(p) for p in batch[PATH]]})


def _arrays(batch) -> dict[str, np.ndarray]:
    return {name: batch.column(name).to_numpy(zero_copy_only=False) for name in batch.schema.names}


def _text_schema(fs, path: str, fmt: str):
    import pyarrow.dataset as pads

    return pads.dataset(path, format=fmt, filesystem=fs).schema


def _rebatch(batch, rows: int):
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)
