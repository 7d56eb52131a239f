"""Requests parsed and checked before they reach a batch: the body read within its limit,
its JSON, then its rows, columns or images against what the model reads (for a model
trained through a ``preprocess.transform``, the raw columns the transform takes, each of
its source's type). Every refusal is a :class:`RequestError` naming the field at fault."""

import base64
import binascii
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse

from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.data.schema import IMAGE
from trainflow.pipelines.serving.serve_settings import MAX_IMAGE_PIXELS


class RequestError(Exception):
    """A request the model cannot answer: an HTTP status, the field at fault, what is wrong."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.status = status
        self.field = field

    def response(self) -> JSONResponse:
        return JSONResponse({"error": str(self), "field": self.field}, status_code=self.status)


@dataclass
class Inputs:
    """One request's rows as the preprocessor reads them: a column (numbers, categories)
    or the list of images per input column."""

    columns: dict[str, Any]
    rows: int


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with a 413 as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "body", f"{int(declared)} bytes, at most {limit}")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, "body", f"more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_body(body: bytes) -> dict[str, Any]:
    """The body's JSON object; NaN and Infinity, which JSON does not allow, refused."""
    if not body.strip():
        raise RequestError(
            400, "body", 'empty; send a JSON object such as {"rows": [{"column": value, ...}]}'
        )
    try:
        payload = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise RequestError(400, "body", f"not valid JSON ({e})") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "body", "expected a JSON object with rows, columns or images")
    return payload


def parse_inputs(payload: dict[str, Any], pre: Preprocessor, max_rows: int) -> Inputs:
    """The request's rows, checked against what the model reads: every column there and no
    other, numbers where it reads numbers, decodable images of its channels."""
    kinds = ("images",) if pre.image else ("rows", "columns")
    unknown = [k for k in payload if k not in ("rows", "columns", "images")]
    if unknown:
        raise RequestError(422, unknown[0], f"unknown field; send one of {', '.join(kinds)}")
    given = [k for k in ("rows", "columns", "images") if k in payload]
    if len(given) != 1:
        raise RequestError(
            422, "body", f"send exactly one of {', '.join(kinds)}; got {', '.join(given) or 'none'}"
        )
    kind = given[0]
    if kind not in kinds:
        reads = "images" if pre.image else f"the columns {', '.join(pre.raw_columns)}"
        raise RequestError(422, kind, f"this model reads {reads}; send {' or '.join(kinds)}")
    if kind == "rows":
        return _from_rows(payload["rows"], pre, max_rows)
    if kind == "columns":
        return _from_columns(payload["columns"], pre, max_rows)
    return _from_images(payload["images"], pre, max_rows)


def _check_count(n: int, name: str, max_rows: int) -> None:
    if n == 0:
        raise RequestError(422, name, "empty; send at least one")
    if n > max_rows:
        raise RequestError(413, name, f"{n} given, at most {max_rows} per request")


def _column_mismatch(names, pre: Preprocessor, where: str) -> RequestError:
    expected = pre.raw_columns
    shown = ", ".join(expected[:10])
    if len(expected) > 10:
        shown += f", ... ({len(expected)} columns; GET /model lists them)"
    missing = [c for c in expected if c not in names]
    if missing:
        return RequestError(422, f"{where}.{missing[0]}", f"missing; the model reads the columns {shown}")
    extra = next(c for c in names if c not in expected)
    return RequestError(422, f"{where}.{extra}", f"not a column of the model; its columns are {shown}")


def _from_rows(rows: Any, pre: Preprocessor, max_rows: int) -> Inputs:
    if not isinstance(rows, list):
        raise RequestError(422, "rows", "expected a list of objects {column: value}")
    _check_count(len(rows), "rows", max_rows)
    expected = set(pre.raw_columns)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise RequestError(422, f"rows[{i}]", "expected an object {column: value}")
        if row.keys() != expected:
            raise _column_mismatch(row, pre, f"rows[{i}]")
    return _typed({c: [row[c] for row in rows] for c in pre.raw_columns}, pre, lambda c, i: f"rows[{i}].{c}")


def _from_columns(columns: Any, pre: Preprocessor, max_rows: int) -> Inputs:
    if not isinstance(columns, dict):
        raise RequestError(422, "columns", "expected an object {column: [values]}")
    if columns.keys() != set(pre.raw_columns):
        raise _column_mismatch(columns, pre, "columns")
    lengths = {}
    for c in pre.raw_columns:
        if not isinstance(columns[c], list):
            raise RequestError(422, f"columns.{c}", "expected a list of values")
        lengths[c] = len(columns[c])
    first = pre.raw_columns[0]
    for c, n in lengths.items():
        if n != lengths[first]:
            raise RequestError(422, f"columns.{c}", f"{n} values, but columns.{first} has {lengths[first]}")
    _check_count(lengths[first], f"columns.{first}", max_rows)
    return _typed(dict(columns), pre, lambda c, i: f"columns.{c}[{i}]")


_NUMBERS = (int, float)
_CATEGORIES = (str, int, float, bool, type(None))


def _typed(columns: dict[str, list], pre: Preprocessor, where: Callable[[str, int], str]) -> Inputs:
    """Numeric columns as float64 arrays (a finite number each, not a bool or a string);
    categorical columns as they came (a category never seen, or null, encodes as zeros).
    A transform's raw columns by their source's types (:func:`_typed_raw`)."""
    if pre.transform:
        return _typed_raw(columns, pre, where)
    out: dict[str, Any] = {c: _numbers(columns[c], c, where) for c in pre.numeric_columns}
    for c in pre.categorical:
        values = columns[c]
        for i, v in enumerate(values):
            if not isinstance(v, _CATEGORIES):
                raise RequestError(
                    422,
                    where(c, i),
                    f"expected a category (string, number or null), got {json.dumps(v)[:40]}",
                )
        out[c] = np.asarray(values, dtype=object)
    return Inputs(out, len(columns[pre.input_columns[0]]))


def _numbers(values: list, c: str, where: Callable[[str, int], str]) -> np.ndarray:
    """A column of finite numbers (not bools, not strings) as float64."""
    for i, v in enumerate(values):
        if type(v) not in _NUMBERS:  # bool is a subclass of int, and no number here
            raise RequestError(422, where(c, i), f"expected a number, got {json.dumps(v)[:40]}")
    try:
        arr = np.asarray(values, dtype=np.float64)
    except OverflowError:  # an integer past float64's range
        arr = np.asarray([float(v) if abs(v) < 1e308 else math.inf for v in values])
    if not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise RequestError(422, where(c, i), f"expected a finite number, got {values[i]}")
    return arr


def _typed_raw(columns: dict[str, list], pre: Preprocessor, where: Callable[[str, int], str]) -> Inputs:
    """The raw columns a model's transform takes, by the Arrow type each had in the
    source: numbers as float64 (integers as int64), strings as strings (text, for a text
    model); any other type as it came, for the transform to read."""
    out: dict[str, Any] = {}
    for c in pre.raw_columns:
        kind = pre.transform["columns"][c]
        values = columns[c]
        if kind.startswith(("int", "uint")) and all(type(v) is int for v in values):
            out[c] = np.asarray(values, dtype=np.int64)
        elif kind.startswith(("int", "uint", "double", "float", "halffloat")):
            out[c] = _numbers(values, c, where)
        elif kind in ("string", "large_string"):
            wrong = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if wrong is not None:
                got = json.dumps(values[wrong])[:40]
                raise RequestError(422, where(c, wrong), f"expected a string, got {got}")
            out[c] = np.asarray(values, dtype=object)
        else:
            out[c] = np.asarray(values + [None], dtype=object)[:-1]  # one object per row, lists too
    return Inputs(out, len(columns[pre.raw_columns[0]]))


def _from_images(images: Any, pre: Preprocessor, max_rows: int) -> Inputs:
    if not isinstance(images, list):
        raise RequestError(422, "images", "expected a list of base64 PNG/JPEG strings or nested arrays")
    _check_count(len(images), "images", max_rows)
    channels = int(pre.image["shape"][0])
    return Inputs(
        {IMAGE: [_image(item, channels, f"images[{i}]") for i, item in enumerate(images)]}, len(images)
    )


def _image(item: Any, channels: int, where: str) -> np.ndarray:
    """One image as the model's image folder gave it: HxW (one channel) or HxWxC uint8."""
    if isinstance(item, str):
        return _decoded(item, channels, where)
    if not isinstance(item, list):
        raise RequestError(
            422, where, "expected a base64 PNG/JPEG string or a nested array of 0-255 integers"
        )
    try:
        arr = np.asarray(item)
    except ValueError:
        raise RequestError(422, where, "not a rectangular array (rows of unequal length)") from None
    if arr.dtype.kind not in "iu" or arr.size == 0 or arr.min() < 0 or arr.max() > 255:
        raise RequestError(422, where, "expected integers 0-255 (uint8 pixels)")
    if channels == 1 and arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    shape_ok = arr.ndim == 2 if channels == 1 else arr.ndim == 3 and arr.shape[2] == channels
    if not shape_ok:
        wanted = "HxW (or HxWx1)" if channels == 1 else f"HxWx{channels}"
        raise RequestError(
            422, where, f"an array of shape {list(arr.shape)}; the model reads {wanted} images"
        )
    if arr.shape[0] * arr.shape[1] > MAX_IMAGE_PIXELS:
        raise RequestError(413, where, f"{arr.shape[0]}x{arr.shape[1]} pixels, at most {MAX_IMAGE_PIXELS}")
    return arr.astype(np.uint8)


def _decoded(text: str, channels: int, where: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    if text.startswith("data:") and "," in text:  # a data URL: data:image/png;base64,....
        text = text.split(",", 1)[1]
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(422, where, "not valid base64") from None
    try:
        with Image.open(io.BytesIO(raw)) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise RequestError(413, where, f"{width}x{height} pixels, at most {MAX_IMAGE_PIXELS}")
            # The mode the image folder was read in: L for one channel, RGB for three.
            mode = "L" if channels == 1 else "RGB"
            return np.asarray(img if img.mode == mode else img.convert(mode))
    except RequestError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise RequestError(422, where, f"not a decodable PNG or JPEG image ({e})") from None
