"""What an input is, learned in the driver before any row is read: the source's kind and
files, its columns checked against the config, and a fingerprint.

:func:`inspect_source` reads only metadata (file listings, Parquet footers, the first
block of a CSV, NumPy headers), so a missing file, column or a wrong dtype fails before
any Ray worker starts; with a ``preprocess.transform``, the columns checked are its output
on the source's first rows (:mod:`trainflow.pipelines.data.transform`).
:func:`inspect_dataset` checks a ``ray.data.Dataset`` handed in from Python the same
way, by its schema. The rows themselves are read by
:mod:`trainflow.pipelines.data.readers` and checked while preparing
(:mod:`trainflow.pipelines.data.stats`).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads

from trainflow.config import ConfigError, DataConfig
from trainflow.config.sections import listed
from trainflow.pipelines.data import sources
from trainflow.pipelines.data import transform as transforms
from trainflow.pipelines.data.sources import SourceError

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger("trainflow")

TORCHVISION_PREFIX = "torchvision:"
DATASET = "ray.data.Dataset"  # the source named for a Dataset handed in from Python
IMAGE = "image"  # the image column of an image source
PATH = "path"  # an image folder's: each image's path, what the split hashes
INDEX = sources.TORCHVISION_INDEX  # a torchvision dataset's: each image's index, what the split hashes
# The formats whose rows are images: an image folder, and the Parquet a torchvision
# dataset is converted to (an image tensor, class name and index per row).
IMAGE_FORMATS = ("images", "image_parquet")


class DataError(SourceError):
    """Input data that cannot be trained on; the message names the file or column."""


@dataclass(frozen=True)
class SourceInfo:
    """What the driver learned about a source without reading its rows."""

    source: str
    # "builtin" | "parquet" | "csv" | "json" | "numpy" | "images" | "image_parquet" | "dataset"
    format: str
    files: list[str]  # paths on the source's filesystem
    label_column: str
    input_columns: list[str]  # every feature, numeric and categorical, in the model's order
    fingerprint: str
    limit: int | None = None  # read only the first N rows
    categorical_columns: list[str] = field(default_factory=list)
    classes: list[Any] | None = None  # declared in the config (or the image folders, the dataset's)
    missing: str = "fail"
    missing_labels: int = 0  # rows found without a label before the run: data.missing=drop drops them
    image_mode: str = "RGB"  # images: RGB or L, data.image_mode or the source's own
    objective: str = "classification"  # or regression: a numeric label, no classes
    location: str = ""  # where the files are: the source, or the torchvision Parquet folder
    bytes: int = 0  # the files' total size
    # A ray.data.Dataset handed in from Python (format "dataset"): read where it is, never
    # pickled into Ray tasks (the readers take its materialized blocks). Typed Any: a flow's
    # parameters hold a SourceInfo, and Prefect builds their model without Ray imported.
    dataset: Any = field(default=None, compare=False, repr=False)
    # preprocess.transform: applied to every batch of the source's rows as read; the
    # columns above are then its output's.
    transform: str | None = None
    # With a transform: the source's columns, which it is handed, and their Arrow types.
    raw_columns: dict[str, str] = field(default_factory=dict)
    # The transform's array columns: {"shape": [...], "dtype": ...} (transform.array_spec).
    arrays: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def numeric_columns(self) -> list[str]:
        return [c for c in self.input_columns if c not in self.categorical_columns and c not in self.arrays]

    @property
    def read_columns(self) -> list[str]:
        """The columns read from the source: the transform's raw columns, else the input
        columns and the label."""
        return list(self.raw_columns) if self.transform else [*self.input_columns, self.label_column]

    @property
    def width(self) -> int:
        """The numbers in one row's input columns (an array column counts each of its)."""
        return (
            len(self.input_columns)
            - len(self.arrays)
            + sum(transforms.width(a) for a in self.arrays.values())
        )

    @property
    def is_images(self) -> bool:
        return self.format in IMAGE_FORMATS


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _is_category(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_integer(t)
        or pa.types.is_boolean(t)
    )


# What pyarrow, NumPy and PIL raise for a file they cannot read as its format.
UNREADABLE = (pa.ArrowException, OSError, ValueError, EOFError)


def unreadable(source: str, path: str, fmt: str, error: Exception) -> DataError:
    """The one-line error for a file that cannot be read as ``fmt``, naming it and the cause."""
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    # Arrow wraps the cause in what it tried ("Error creating dataset ... Invalid: ");
    # the cause is what a user acts on.
    message = message.rsplit("Invalid: ", 1)[-1]
    return DataError(f"data.source {source}: cannot read {path} as {fmt}: {message}")


def filesystem(info: SourceInfo):
    """The pyarrow filesystem the source's files are on."""
    return sources.resolve(info.location or info.source)[0]


def _file_schema(listing: sources.Listing, path: str, source: str) -> pa.Schema:
    """One file's columns, from its metadata or first block; an unreadable file names itself."""
    try:
        if listing.format == "numpy":
            return sources.numpy_schema(listing.filesystem, path)[0]
        return pads.dataset(path, format=listing.format, filesystem=listing.filesystem).schema
    except UNREADABLE as e:
        raise unreadable(source, path, listing.format, e) from None


def _schema(listing: sources.Listing, source: str) -> pa.Schema:
    """The columns every file holds; a file that lacks one of the first file's fails."""
    first = _file_schema(listing, listing.files[0], source)
    for path in listing.files[1:]:
        schema = _file_schema(listing, path, source)
        missing = [c for c in first.names if c not in schema.names]
        if missing:
            raise DataError(
                f"data.source {source}: {path} lacks the columns {listed(missing)} "
                f"that {listing.files[0]} holds"
            )
    return first


def inspect_source(
    cfg: DataConfig,
    cache_root: Path | None = None,
    *,
    objective: str = "classification",
    transform: str | None = None,
) -> SourceInfo:
    """Check that the source exists and holds the configured columns with usable types
    for the ``objective``'s label; read no rows, but with a ``transform``
    (``preprocess.transform``) the source's first rows, on which it is tried: the columns
    checked are then its output's. ``cache_root`` holds torchvision downloads (default
    TRAINFLOW_HOME/cache)."""
    try:
        found = _read_metadata(cfg, cache_root)
    except SourceError as e:
        raise DataError(str(e)) from None
    images = found.format in IMAGE_FORMATS
    columns = found.schema
    arrays = {}
    if transform:
        if images:
            raise ConfigError(
                f"{transforms.FIELD} {transform}: applies to tables, not to {cfg.source}'s images"
            )
        columns, arrays = transformed_schema(transform, _first_rows(cfg, found), cfg.label_column)
    features = _check_columns(
        cfg, columns, cfg.source, objective, images=images, arrays=arrays, transform=transform
    )
    classes = _image_classes(cfg, found, objective) if images else cfg.classes
    return SourceInfo(
        source=cfg.source,
        format=found.format,
        files=found.files,
        label_column=cfg.label_column,
        input_columns=features,
        fingerprint=found.fingerprint,
        limit=cfg.limit,
        categorical_columns=list(cfg.categorical_columns),
        classes=list(classes) if classes is not None else None,
        missing=cfg.missing,
        image_mode=found.image_mode,
        objective=objective,
        location=found.location,
        bytes=found.bytes,
        transform=transform,
        raw_columns={f.name: str(f.type) for f in found.schema} if transform else {},
        arrays={c: arrays[c] for c in features if c in arrays},
    )


def transformed_schema(
    transform: str, sample: pd.DataFrame, label: str
) -> tuple[pa.Schema, dict[str, dict[str, Any]]]:
    """The columns of the transform's output on ``sample`` (an array column as a list of
    its numbers) and the spec of each array column."""
    out, arrays = transforms.check_sample(transform, sample, label)
    scalars = pa.Schema.from_pandas(out.drop(columns=list(arrays)), preserve_index=False)
    types = {f.name: f.type for f in scalars}
    for column, spec in arrays.items():
        types[column] = pa.list_(pa.from_numpy_dtype(spec["dtype"]))
    return pa.schema([(str(c), types[str(c)]) for c in out.columns]), arrays


def _first_rows(cfg: DataConfig, found: _Metadata) -> pd.DataFrame:
    """The first rows of the source's first file (at most data.limit), as the readers
    give them: what the transform is tried on before any worker starts."""
    rows = min(transforms.SAMPLE_ROWS, cfg.limit or transforms.SAMPLE_ROWS)
    if found.format == "builtin":
        return sources.BUILTINS[cfg.source]().head(rows)
    fs = sources.resolve(found.location)[0]
    path = found.files[0]
    try:
        if found.format == "numpy":
            with fs.open_input_stream(path) as f:
                return pd.DataFrame(sources.numpy_frame(f.read(), path)).head(rows)
        return pads.dataset(path, format=found.format, filesystem=fs).head(rows).to_pandas()
    except UNREADABLE as e:
        raise unreadable(cfg.source, path, found.format, e) from None


@dataclass(frozen=True)
class _Metadata:
    """What a source's metadata says, before its columns are checked against the config."""

    format: str
    schema: pa.Schema
    fingerprint: str
    location: str  # where the files are: the source, or the torchvision Parquet folder
    image_mode: str  # data.image_mode, else the source's own, else RGB
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    classes: list[Any] | None = None  # an image source's own: its folders, or the dataset's


def _read_metadata(cfg: DataConfig, cache_root: Path | None) -> _Metadata:
    """The source's format, columns and fingerprint, from metadata only; SourceError
    naming the source where it cannot be read."""
    if cfg.source in sources.BUILTINS:
        return _builtin_metadata(cfg)
    if cfg.source.startswith("builtin:"):
        raise DataError(f"data.source {cfg.source!r}: the builtin sources are {', '.join(sources.BUILTINS)}")
    return _file_metadata(cfg, cache_root)


def _builtin_metadata(cfg: DataConfig) -> _Metadata:
    """A builtin source's columns, from its first row; its fingerprint is sklearn's version."""
    import sklearn

    source = cfg.source
    schema = pa.Schema.from_pandas(sources.BUILTINS[source]().head(1), preserve_index=False)
    fingerprint = hashlib.sha256(f"{source}|sklearn {sklearn.__version__}".encode()).hexdigest()[:16]
    return _Metadata("builtin", schema, fingerprint, location=source, image_mode=cfg.image_mode or "RGB")


def _file_metadata(cfg: DataConfig, cache_root: Path | None) -> _Metadata:
    """A source of files (a torchvision dataset: its converted Parquet, made on first use):
    their listing, fingerprint and columns, and an image source's classes and mode."""
    source = cfg.source
    location = cfg.source
    fmt = cfg.format
    torchvision = source.startswith(TORCHVISION_PREFIX)
    if torchvision:
        if cache_root is None:
            from trainflow.workspace import workspace

            cache_root = workspace().cache
        name = source.removeprefix(TORCHVISION_PREFIX)
        location = str(sources.torchvision_parquet(name, cache_root / "torchvision"))
        fmt = "parquet"
    listing = sources.list_source(location, fmt)
    fmt = listing.format
    fingerprint = sources.fingerprint(listing)
    found = None
    image_mode = cfg.image_mode or "RGB"
    if torchvision:
        meta = sources.converted_meta(location)
        fmt = "image_parquet"
        found = meta["classes"]
        image_mode = cfg.image_mode or meta["mode"]
    elif fmt == "images":
        found = sorted({sources.image_label(f) for f in listing.files})
    if fmt in IMAGE_FORMATS:
        schema = pa.schema([(IMAGE, pa.binary()), (cfg.label_column, pa.string())])
    else:
        schema = _schema(listing, source)
    return _Metadata(fmt, schema, fingerprint, location, image_mode, listing.files, sum(listing.sizes), found)


def _image_classes(cfg: DataConfig, found: _Metadata, objective: str) -> list[Any]:
    """An image source's classes: the declared ones (data.classes), which must hold every
    class the source labels its images with, else the source's own."""
    what = "the image folders" if found.format == "images" else "the classes"
    if objective == "regression":
        raise DataError(
            f"objective: regression needs a numeric label column; {what} of {cfg.source} "
            "label each image by its class name (use objective: classification)"
        )
    if cfg.classes is None:
        return found.classes
    outside = [c for c in found.classes if c not in map(str, cfg.classes)]
    if outside:
        raise DataError(
            f"data.classes: {what} {outside} of {cfg.source} are not among the declared classes {cfg.classes}"
        )
    return [str(c) for c in cfg.classes]


def inspect_dataset(
    ds: ray.data.Dataset, cfg: DataConfig, *, objective: str = "classification", transform: str | None = None
) -> SourceInfo:
    """A ``ray.data.Dataset`` as a source (``cfg.source`` is not read): its schema checked as a
    table's is (with a ``transform``, its output's on the first rows), then the Dataset
    materialized once into Ray's object store, whose blocks the engine reads. Its
    fingerprint is new on every call: what a Dataset yields cannot be told without reading
    it all, so an entry prepared from one is never reused."""
    import ray.data

    if not isinstance(ds, ray.data.Dataset):
        raise DataError(f"a dataset source must be a ray.data.Dataset, not {type(ds).__name__}")
    found = ds.schema()
    if found is None:
        raise DataError(f"the {DATASET} source has no rows")
    types = [t if isinstance(t, pa.DataType) else pa.from_numpy_dtype(t) for t in found.types]
    raw = schema = pa.schema(list(zip(found.names, types, strict=True)))
    arrays = {}
    if transform:
        schema, arrays = transformed_schema(
            transform, ds.limit(transforms.SAMPLE_ROWS).to_pandas(), cfg.label_column
        )
    features = _check_columns(
        cfg, schema, DATASET, objective, images=False, arrays=arrays, transform=transform
    )
    ds = (ds if transform else ds.select_columns([*features, cfg.label_column])).materialize()
    return SourceInfo(
        source=DATASET,
        format="dataset",
        files=[],
        label_column=cfg.label_column,
        input_columns=features,
        fingerprint=f"dataset-{uuid.uuid4().hex[:16]}",
        limit=cfg.limit,
        categorical_columns=list(cfg.categorical_columns),
        classes=list(cfg.classes) if cfg.classes is not None else None,
        missing=cfg.missing,
        objective=objective,
        bytes=ds.size_bytes(),
        dataset=ds,
        transform=transform,
        raw_columns={f.name: str(f.type) for f in raw} if transform else {},
        arrays={c: arrays[c] for c in features if c in arrays},
    )


def _check_columns(
    cfg: DataConfig,
    schema: pa.Schema,
    source: str,
    objective: str,
    *,
    images: bool,
    arrays: dict[str, Any] | None = None,
    transform: str | None = None,
) -> list[str]:
    """The input columns, in the model's order, after checking that the label and every
    configured column are there with usable types (``arrays``: a transform's array
    columns, each of numbers)."""
    columns = schema.names
    if cfg.label_column not in columns:
        raise DataError(
            f"data.label_column {cfg.label_column!r} is not a column of {source}; "
            f"its columns are: {listed(columns, 20)}"
        )
    features = cfg.feature_columns or [c for c in columns if c != cfg.label_column]
    missing = [c for c in [*features, *cfg.categorical_columns] if c not in columns]
    if missing:
        raise DataError(
            f"data.feature_columns: {listed([repr(c) for c in missing])} not in {source}; "
            f"its columns are: {listed(columns, 20)}"
        )
    if cfg.label_column in features:
        raise DataError(f"data.feature_columns must not hold the label column {cfg.label_column!r}")
    if not features:
        raise DataError(f"data.feature_columns: {source} has no column besides the label")
    if not images:
        _check_label(cfg, schema, source, objective)
        _check_features(cfg, schema, features, source, arrays or {}, transform)
    return list(features)


def source_fingerprint(cfg: DataConfig, cache_root: Path) -> str:
    """What the input is now, without reading its schema: the files' fingerprint (the
    converted Parquet of a torchvision dataset, once there). Cheap enough to decide
    whether a cached inspection still holds."""
    if cfg.source.startswith("builtin:"):
        import sklearn

        return f"{cfg.source}|sklearn {sklearn.__version__}"
    location = cfg.source
    if cfg.source.startswith(TORCHVISION_PREFIX):
        location = str(cache_root / "torchvision" / f"{cfg.source.removeprefix(TORCHVISION_PREFIX)}.parquet")
        if sources.converted_meta(location) is None:
            return "torchvision: not converted yet"
    try:
        return sources.fingerprint(sources.list_source(location, cfg.format))
    except SourceError as e:
        return f"unreadable: {e}"  # inspect_source raises it with the details


def _check_label(cfg: DataConfig, schema: pa.Schema, source: str, objective: str) -> None:
    """The label's type fits the objective, and data.classes the label's type."""
    label_type = schema.field(cfg.label_column).type
    if objective == "regression":
        if not (pa.types.is_integer(label_type) or pa.types.is_floating(label_type)):
            raise DataError(
                f"data.label_column {cfg.label_column!r} in {source} is {label_type}; a regression "
                "label must hold numbers (ints or floats), or set objective: classification"
            )
    elif not _is_category(label_type):
        raise DataError(
            f"data.label_column {cfg.label_column!r} in {source} is {label_type}; a class label "
            "must hold integers, strings or booleans"
        )
    if cfg.classes is not None:
        want = str if pa.types.is_string(label_type) or pa.types.is_large_string(label_type) else int
        wrong = [c for c in cfg.classes if not isinstance(c, want)]
        if wrong:
            raise DataError(
                f"data.classes {wrong} are not {want.__name__}s like the label column "
                f"{cfg.label_column!r} ({label_type})"
            )


def _check_features(
    cfg: DataConfig,
    schema: pa.Schema,
    features: list[str],
    source: str,
    arrays: dict[str, Any],
    transform: str | None,
) -> None:
    """Every feature is a number, a category listed in data.categorical_columns, or an
    array column of the transform's."""
    categorical = set(cfg.categorical_columns)
    as_arrays = [c for c in categorical if c in arrays]
    if as_arrays:
        raise ConfigError(
            f"data.categorical_columns: {', '.join(map(repr, as_arrays))} hold arrays from "
            f"{transforms.FIELD} {transform}; an array column is numbers, not a category"
        )
    not_numeric = [
        f"{c} ({schema.field(c).type})"
        for c in features
        if c not in categorical and c not in arrays and not _is_numeric(schema.field(c).type)
    ]
    if not_numeric and transform:
        raise ConfigError(
            f"{transforms.FIELD} {transform} leaves the columns {', '.join(not_numeric)}, neither numbers "
            "nor arrays of numbers; drop them in the transform, or list them in data.categorical_columns"
        )
    if not_numeric:
        raise DataError(
            f"data.feature_columns: {listed(not_numeric)} in {source} are not numeric; "
            "features must be int, float or bool columns (list the others in data.categorical_columns)"
        )
    not_category = [
        f"{c} ({schema.field(c).type})" for c in categorical if not _is_category(schema.field(c).type)
    ]
    if not_category:
        raise DataError(
            f"data.categorical_columns: {listed(not_category)} in {source} hold neither "
            "strings, integers nor booleans"
        )
