"""Missing values, defined once: a null, a NaN, and in a CSV a blank cell (empty, or only
whitespace), which Arrow reads as a string like any other.

:func:`blanks_as_null` makes a CSV batch's blank cells null as the readers read it, so
that a blank label is never a class. :func:`check_labels` reads the label column of a
table source in the driver, before any Ray worker starts: missing labels fail the run
(or, under ``data.missing: drop``, are counted to be dropped) and labels outside
``data.classes`` fail it, each naming the column and how many rows. Features are checked
as the rows are prepared (:mod:`trainflow.pipelines.data.stats`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from trainflow.config.sections import listed
from trainflow.pipelines.data import sources
from trainflow.pipelines.data.schema import UNREADABLE, DataError, SourceInfo, filesystem, unreadable

# Sources up to this size have their label column read before the run starts; a larger
# one is checked as its rows are prepared, with the same messages.
SCAN_BYTES = 256 << 20
SCANNED_FORMATS = ("parquet", "csv", "json", "numpy")
MISSING = "blank, null or NaN"  # how a message names what counts as missing
DROP_HINT = "set data.missing=drop to drop such rows"


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _blank_as_null(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    blank = pc.equal(pc.utf8_trim_whitespace(column), "")
    if not pc.any(blank).as_py():
        return column
    return pc.if_else(blank, pa.scalar(None, column.type), column)


def blanks_as_null(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` (a CSV's) with every blank cell of its text columns null."""
    if not any(_is_text(f.type) for f in batch.schema):
        return batch
    columns = [_blank_as_null(c) if _is_text(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def check_labels(info: SourceInfo) -> int | None:
    """Read the label column of ``info`` (a table of files up to SCAN_BYTES, without a
    ``preprocess.transform``) and return how many rows lack a label, which
    ``data.missing: drop`` drops; DataError when any does under ``data.missing: fail``, or
    when a label is outside ``data.classes``. None: a source not read here."""
    labels = _label_column(info)
    if labels is None:
        return None
    src = info.source
    label = info.label_column
    missing = labels.null_count
    if pa.types.is_floating(labels.type):
        missing += pc.sum(pc.is_nan(labels)).as_py() or 0
    if missing and info.missing == "fail":
        raise DataError(
            f"data.source {src}: column {label!r} has {missing} missing values ({MISSING}) in "
            f"{len(labels)} rows; {DROP_HINT}"
        )
    if missing == len(labels):
        raise DataError(f"data.source {src}: column {label!r} has no label in any of its {len(labels)} rows")
    if info.classes is not None and info.objective != "regression":
        outside = _outside(labels, info.classes)
        if outside:
            raise DataError(
                f"data.label_column {label!r}: {sum(outside.values())} rows of {src} hold labels "
                f"{listed([repr(v) for v in outside], 5)} outside data.classes {info.classes}; "
                "list them in data.classes, or remove those rows"
            )
    return missing


def _label_column(info: SourceInfo) -> pa.ChunkedArray | None:
    """The label column's values (the first data.limit rows), blank CSV cells null; None
    for a source that is not read here."""
    if info.format not in SCANNED_FORMATS or info.transform or info.bytes > SCAN_BYTES:
        return None
    fs = filesystem(info)
    try:
        if info.format == "numpy":
            table = pa.concat_tables(
                pa.table({info.label_column: sources.numpy_frame(_read(fs, p), p)[info.label_column]})
                for p in info.files
            )
        else:
            import pyarrow.dataset as pads

            dataset = pads.dataset(info.files, format=info.format, filesystem=fs)
            columns = [info.label_column]
            table = dataset.head(info.limit, columns=columns) if info.limit else dataset.to_table(columns)
    except UNREADABLE as e:
        raise unreadable(info.source, info.source, info.format, e) from None
    labels = table.column(info.label_column)[: info.limit or len(table)]
    return _blank_as_null(labels) if info.format == "csv" and _is_text(labels.type) else labels


def _read(fs, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def _outside(labels: pa.ChunkedArray, classes: list[Any]) -> dict[Any, int]:
    """The labels that are not among ``classes`` (compared as text, as the checks of the
    prepared rows compare them), each with its rows."""
    declared = {str(c) for c in classes}
    counts = pc.value_counts(labels.drop_null()).to_pylist()
    return {
        c["values"]: c["counts"]
        for c in counts
        if str(c["values"]) not in declared and c["values"] == c["values"]  # NaN: missing, not a class
    }
