"""Online serving: a registered model behind an HTTP endpoint on Ray Serve.

One Serve application, :func:`app`: a deployment (``ModelServer``) whose replicas each
hold a :class:`~trainflow.pipelines.models.checkpoint.Predictor` loaded from the registry, with
a FastAPI ingress:

- ``POST /predict``: ``{"rows": [{column: value}, ...]}`` or ``{"columns": {column:
  [...]}}`` for a model of table columns, ``{"images": [...]}`` (base64 PNG or JPEG, or
  nested lists of 0-255 integers, HxW or HxWxC) for a model of an image folder. The
  answer holds ``predictions`` (class values, or numbers for a regression),
  ``probabilities`` and ``classes`` for a classifier, and the ``model`` and ``version``
  that answered. The checkpoint's saved preprocessing applies, as in ``load_model``.
- ``GET /model`` (name, version, alias followed, task, classes, input columns or image
  shape, the gate's decision and test metrics), ``GET /healthz``, FastAPI's ``/docs``.

Requests are batched on each replica (``@serve.batch``): the rows of the requests that
arrive within ``batch_wait_s`` (2 ms) of the first go through the model in one pass,
up to ``batch_max_rows`` (1024) rows; a replica takes up to MAX_ONGOING_REQUESTS (64)
requests at once, so that under load they queue there, where they batch. Waiting costs
a lone request those 2 ms at most; under load the queue fills a batch before the wait
ends. A request holds at most
``max_rows`` (1024) rows or images and ``max_body_bytes`` (8 MiB) of body: more is a
413. Every malformed request is a 4xx whose JSON names the field (``{"error": ...,
"field": "rows[3].a"}``); the replica goes on serving.

A replica serving an alias (``digits``, ``digits@champion``) asks the registry every
``poll_interval_s`` (2 s) which version the alias points at. When it moved (the gate,
``trainflow models promote``, ``rollback``), the replica loads the new version beside
the old one, then swaps the reference: requests already in a batch finish on the old
version, every later batch runs on the new one, none is dropped. So a move is served
within the poll interval plus the new version's load (a fraction of a second for a
small model). A pinned version (``digits/3``) is never asked about again.

The replicas read the registry the driver reads: its TRAINFLOW_HOME and
MLFLOW_TRACKING_URI are handed to them. On a cluster of several machines that takes an
MLflow server (MLFLOW_TRACKING_URI), which every node reaches.
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' parameter types
# (``request: Request``) at run time, through Serve's ingress wrapper.
import asyncio
import base64
import binascii
import io
import json
import logging
import math
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from trainflow.cluster.checks import PreflightError
from trainflow.config import ConfigError
from trainflow.pipelines import registry
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.data.schema import IMAGE, DataError
from trainflow.pipelines.models.checkpoint import (
    SPEC,
    Predictor,
    load_checkpoint,
    model_actor_options,
    read_json,
)
from trainflow.ray_internals import local_cluster_resources
from trainflow.workspace import Workspace, workspace

log = logging.getLogger("trainflow.serving")

# Rows (or images) one request may hold, and the bytes of its body.
MAX_ROWS = 1024
MAX_BODY_BYTES = 8 << 20
# Pixels of one decoded image: a small compressed file may declare an enormous image.
MAX_IMAGE_PIXELS = 4096 * 4096
# A batch: at most this many rows through the model in one pass, formed from the requests
# that arrive within BATCH_WAIT_S of the first. At least MAX_ROWS, so a full request fits.
BATCH_MAX_ROWS = 1024
BATCH_WAIT_S = 0.002
# Requests a replica holds at once (in its batch queue and in the model): above the
# clients a batch gathers from (32 concurrent), so they queue in the replica, where they
# batch, rather than in Serve's proxy. Serve's default, 5, would cap a batch at 5 requests.
MAX_ONGOING_REQUESTS = 64
# With --max-replicas, Serve adds a replica while each holds more than this many requests
# on average, and removes one when they hold fewer (its autoscaling policy).
TARGET_ONGOING_REQUESTS = 16
# How often a replica asks the registry where its alias points.
POLL_INTERVAL_S = 2.0
APP_NAME = "trainflow"
# Serve's controller, proxy and replicas log every request and deployment step at INFO;
# the command prints its own lines.
QUIET_LOGS = {"log_level": "WARNING", "enable_access_log": False}


@dataclass(frozen=True)
class ServeSettings:
    """What each replica is told, besides the model: limits, batching, polling."""

    max_rows: int = MAX_ROWS
    max_body_bytes: int = MAX_BODY_BYTES
    batch_max_rows: int = BATCH_MAX_ROWS
    batch_wait_s: float = BATCH_WAIT_S
    poll_interval_s: float = POLL_INTERVAL_S

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.max_body_bytes < 1:
            raise ValueError("max_rows and max_body_bytes must be at least 1")
        if self.batch_max_rows < self.max_rows:
            raise ValueError(
                f"batch_max_rows {self.batch_max_rows} is below max_rows {self.max_rows}: "
                "a full request must fit in one batch"
            )
        if self.batch_wait_s < 0 or self.poll_interval_s <= 0:
            raise ValueError("batch_wait_s must be >= 0 and poll_interval_s > 0")


# --- requests: parsed and checked before they reach a batch --------------------------


class RequestError(Exception):
    """A request the model cannot answer: an HTTP status, the field at fault, what is wrong."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.status, self.field = status, field

    def response(self) -> JSONResponse:
        return JSONResponse({"error": str(self), "field": self.field}, status_code=self.status)


@dataclass
class Inputs:
    """One request's rows as the preprocessor reads them: a column (numbers, categories)
    or the list of images per input column."""

    columns: dict[str, Any]
    rows: int


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_body(body: bytes) -> dict[str, Any]:
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
        reads = "images" if pre.image else f"the columns {', '.join(pre.input_columns)}"
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
    expected = pre.input_columns
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
    expected = set(pre.input_columns)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise RequestError(422, f"rows[{i}]", "expected an object {column: value}")
        if row.keys() != expected:
            raise _column_mismatch(row, pre, f"rows[{i}]")
    return _typed(
        {c: [row[c] for row in rows] for c in pre.input_columns}, pre, lambda c, i: f"rows[{i}].{c}"
    )


def _from_columns(columns: Any, pre: Preprocessor, max_rows: int) -> Inputs:
    if not isinstance(columns, dict):
        raise RequestError(422, "columns", "expected an object {column: [values]}")
    if columns.keys() != set(pre.input_columns):
        raise _column_mismatch(columns, pre, "columns")
    lengths = {}
    for c in pre.input_columns:
        if not isinstance(columns[c], list):
            raise RequestError(422, f"columns.{c}", "expected a list of values")
        lengths[c] = len(columns[c])
    first = pre.input_columns[0]
    for c, n in lengths.items():
        if n != lengths[first]:
            raise RequestError(422, f"columns.{c}", f"{n} values, but columns.{first} has {lengths[first]}")
    _check_count(lengths[first], f"columns.{first}", max_rows)
    return _typed(dict(columns), pre, lambda c, i: f"columns.{c}[{i}]")


_NUMBERS = (int, float)
_CATEGORIES = (str, int, float, bool, type(None))


def _typed(columns: dict[str, list], pre: Preprocessor, where: Callable[[str, int], str]) -> Inputs:
    """Numeric columns as float64 arrays (a finite number each, not a bool or a string);
    categorical columns as they came (a category never seen, or null, encodes as zeros)."""
    out: dict[str, Any] = {}
    for c in pre.numeric_columns:
        values = columns[c]
        for i, v in enumerate(values):
            if type(v) not in _NUMBERS:  # bool is a subclass of int, and no number here
                raise RequestError(422, where(c, i), f"expected a number, got {json.dumps(v)[:40]}")
        try:
            out[c] = arr = np.asarray(values, dtype=np.float64)
        except OverflowError:  # an integer past float64's range
            arr = np.asarray([float(v) if abs(v) < 1e308 else math.inf for v in values])
        if not np.isfinite(arr).all():
            i = int(np.flatnonzero(~np.isfinite(arr))[0])
            raise RequestError(422, where(c, i), f"expected a finite number, got {values[i]}")
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


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with a 413 as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "body", f"{int(declared)} bytes, at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, "body", f"more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# --- the model a replica serves ------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """A loaded version and what ``GET /model`` says of it."""

    predictor: Predictor
    name: str
    version: str
    gate: dict[str, Any]
    metrics: dict[str, float]
    loaded_at: str

    @classmethod
    def load(cls, ws: Workspace, name: str, version: str) -> "Served":
        details = registry.version_details(ws, f"{name}/{version}")
        mv = registry.resolve(ws, f"{name}/{version}")
        predictor = load_checkpoint(registry.local_checkpoint(ws, mv))
        predictor.version = version
        gate = {key: _tag_value(value) for key, value in details["gate"].items()}
        return cls(predictor, name, version, gate, details["metrics"], _now())


def _tag_value(text: str) -> Any:
    """A gate tag as the JSON value it was written from: MLflow keeps tags as strings."""
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    try:
        return float(text)
    except ValueError:
        return text


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _merged(batch: list[Inputs]) -> dict[str, Any]:
    if len(batch) == 1:
        return batch[0].columns
    return {
        c: (
            sum((b.columns[c] for b in batch), [])
            if c == IMAGE
            else np.concatenate([b.columns[c] for b in batch])
        )
        for c in batch[0].columns
    }


def answer(served: Served, batch: list[Inputs]) -> list[dict[str, Any] | RequestError]:
    """One pass of the model over a batch of requests, split back into one answer each.
    A batch the model refuses (a request checked against a version that has since been
    swapped for one reading other columns) is answered request by request, so only the
    request at fault gets the error."""
    try:
        predictions, proba = served.predictor.predict_with_proba(_merged(batch))
    except (DataError, ValueError, TypeError) as e:
        if len(batch) == 1:
            return [RequestError(422, "body", str(e))]
        return [answer(served, [one])[0] for one in batch]
    out: list[dict[str, Any] | RequestError] = []
    start = 0
    for inputs in batch:
        stop = start + inputs.rows
        one: dict[str, Any] = {
            "model": served.name,
            "version": served.version,
            "predictions": predictions[start:stop].tolist(),
        }
        if proba is not None:
            one["probabilities"] = proba[start:stop].tolist()
            one["classes"] = list(served.predictor.classes)
        out.append(one)
        start = stop
    return out


class _NoBatchSizeWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "is larger than `max_ongoing_requests`" not in record.getMessage()


def _rows_in(batch: list[Inputs]) -> int:
    return sum(inputs.rows for inputs in batch)


_PREDICT_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "rows": {"type": "array", "items": {"type": "object"}},
                        "columns": {"type": "object", "additionalProperties": {"type": "array"}},
                        "images": {"type": "array", "items": {}},
                    },
                },
                "examples": {
                    "rows": {"value": {"rows": [{"a": 0.5, "b": -1.0}]}},
                    "columns": {"value": {"columns": {"a": [0.5, 1.0], "b": [-1.0, 2.0]}}},
                    "images": {"value": {"images": ["<base64 PNG>"]}},
                },
            }
        },
    }
}

api = FastAPI(
    title="trainflow model server",
    description="A registered trainflow model: POST /predict, GET /model, GET /healthz.",
)


@serve.deployment(ray_actor_options={"num_cpus": 1})
@serve.ingress(api)
class ModelServer:
    """A replica: one loaded version, swapped for the alias's new version when it moves."""

    def __init__(self, uri: str, home: str, tracking_uri: str | None, settings: ServeSettings):
        # Serve compares the batch's size, counted here in rows, with max_ongoing_requests,
        # counted in requests, and warns that batches stay below it: they do not.
        logging.getLogger("ray.serve").addFilter(_NoBatchSizeWarning())
        # The registry the driver reads, whatever this worker's environment says.
        if tracking_uri:
            os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
        else:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self._ws = Workspace(Path(home))
        self._uri = uri
        self._alias = registry.followed_alias(uri)
        self._settings = settings
        mv = registry.resolve(self._ws, uri)
        self._served = Served.load(self._ws, mv.name, str(mv.version))
        self._checked_at: str | None = _now()
        self._follow_error: str | None = None
        self._predict_batch.set_max_batch_size(settings.batch_max_rows)
        self._predict_batch.set_batch_wait_timeout_s(settings.batch_wait_s)
        self._stop = threading.Event()
        if self._alias is not None:
            threading.Thread(target=self._follow, name="trainflow-follow-alias", daemon=True).start()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    def _follow(self) -> None:
        """Every poll interval: where does the alias point? Load a new version whole, then
        swap it in; a failure keeps the current version serving and is shown in /model."""
        while not self._stop.wait(self._settings.poll_interval_s):
            try:
                mv = registry.resolve(self._ws, self._uri)
                if str(mv.version) != self._served.version:
                    new = Served.load(self._ws, mv.name, str(mv.version))
                    old, self._served = self._served.version, new
                    log.warning("%s: now serving version %s (was %s)", self._uri, new.version, old)
                self._checked_at, self._follow_error = _now(), None
            except Exception as e:  # the registry unreachable, a checkpoint refused: keep serving
                error = f"{type(e).__name__}: {e}"
                if isinstance(e, (ImportError, ConfigError)):
                    # The model could not be built here: the replicas carry the module of
                    # the version served at start only (model.kind: package.module:callable).
                    error += "; restart the server to serve a version built from another module"
                if error != self._follow_error:  # once per failure, not every poll
                    log.warning("%s: cannot follow the alias: %s", self._uri, error)
                self._follow_error = error

    @serve.batch(max_batch_size=BATCH_MAX_ROWS, batch_wait_timeout_s=BATCH_WAIT_S, batch_size_fn=_rows_in)
    async def _predict_batch(self, batch: list[Inputs]) -> list[dict[str, Any] | RequestError]:
        # Off the event loop, which meanwhile takes in the requests of the next batch.
        return await asyncio.to_thread(answer, self._served, batch)

    @api.post("/predict", openapi_extra=_PREDICT_DOC)
    async def predict(self, request: Request) -> JSONResponse:
        """Predictions for rows, columns or images (see the examples)."""
        try:
            payload = parse_body(await read_body(request, self._settings.max_body_bytes))
            inputs = parse_inputs(payload, self._served.predictor.preprocessor, self._settings.max_rows)
            result = await self._predict_batch(inputs)
        except RequestError as e:
            return e.response()
        if isinstance(result, RequestError):
            return result.response()
        return JSONResponse(result)

    @api.get("/model")
    def model(self) -> JSONResponse:
        """The version serving, the alias it follows, what it reads, its gate decision."""
        served = self._served
        pre = served.predictor.preprocessor
        info: dict[str, Any] = {
            "name": served.name,
            "version": served.version,
            "uri": self._uri,
            "alias": self._alias,
            "task": pre.task,
            "classes": list(pre.classes),
        }
        if pre.image:
            info["image"] = {"shape": list(pre.image["shape"]), "input": "images"}
        else:
            info["input_columns"] = pre.input_columns
        info |= {
            "gate": served.gate,
            "metrics": served.metrics,
            "loaded_at": served.loaded_at,
            "checked_at": self._checked_at if self._alias else None,
            "follow_error": self._follow_error,
            "poll_interval_s": self._settings.poll_interval_s if self._alias else None,
            "limits": {"max_rows": self._settings.max_rows, "max_body_bytes": self._settings.max_body_bytes},
            "batching": {
                "max_rows": self._settings.batch_max_rows,
                "wait_s": self._settings.batch_wait_s,
            },
        }
        return JSONResponse(info)

    @api.get("/healthz")
    def healthz(self) -> dict[str, str]:
        return {"status": "ok", "model": self._served.name, "version": self._served.version}


def app(
    model: str,
    *,
    replicas: int = 1,
    max_replicas: int | None = None,
    cpus_per_replica: float = 1.0,
    settings: ServeSettings | None = None,
    ws: Workspace | None = None,
) -> serve.Application:
    """The Serve application for ``serve.run``: ``model`` (``NAME``, ``NAME@ALIAS``,
    ``NAME/VERSION``) behind the HTTP API above, on ``replicas`` replicas of
    ``cpus_per_replica`` CPUs each, or with ``max_replicas`` from one up to that many as
    the load asks (Serve's autoscaling, TARGET_ONGOING_REQUESTS per replica). An unknown
    model, version or alias is a RegistryError here, before any replica starts."""
    if replicas < 1 or (max_replicas is not None and max_replicas < 1):
        raise ValueError(f"replicas and max_replicas must be at least 1, got {replicas}, {max_replicas}")
    import ray

    ws = ws or workspace()
    folder = registry.local_checkpoint(ws, registry.resolve(ws, model))
    # A user's model (model.kind: package.module:callable) brings its module to the
    # replicas, which the cluster's workers need not have: the module of the version
    # served at the start (a later version the alias moves to must use the same one).
    # Shipped with the replicas when Ray is connected already; else serve_until_stopped's
    # session ships it with the job, whose runtime_env the replicas inherit.
    actor_options = {
        "num_cpus": cpus_per_replica,
        **(model_actor_options(str(folder)) if ray.is_initialized() else {}),
    }
    scaling: dict[str, Any] = {"num_replicas": replicas}
    if max_replicas is not None:
        scaling = {
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": max_replicas,
                "target_ongoing_requests": TARGET_ONGOING_REQUESTS,
            }
        }
    return ModelServer.options(
        **scaling,
        ray_actor_options=actor_options,
        max_ongoing_requests=MAX_ONGOING_REQUESTS,
    ).bind(model, str(ws.home), os.environ.get("MLFLOW_TRACKING_URI"), settings or ServeSettings())


# --- the command's checks and its serving loop ---------------------------------------


def model_kind(model: str, ws: Workspace | None = None) -> str:
    """The ``model.kind`` of the version ``model`` names (``NAME``, ``NAME@ALIAS``, ``NAME/VERSION``)."""
    ws = ws or workspace()
    return read_json(registry.local_checkpoint(ws, registry.resolve(ws, model)), SPEC)["kind"]


def check_port(host: str, port: int) -> None:
    """PreflightError when ``host:port`` cannot be listened on (in use, not an address here)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise PreflightError(f"--host {host}: not an address of this machine ({e})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Serve's HTTP server does
        try:
            s.bind(address)
        except OSError as e:
            raise PreflightError(
                f"cannot listen on {host}:{port}: {e.strerror}; choose another --port"
            ) from None


def check_fits(
    replicas: int, cpus_per_replica: float, ray_address: str | None = None, flag: str = "--replicas"
) -> None:
    """PreflightError when the local cluster the command would start cannot hold the
    replicas: Serve would wait for them forever. A cluster elsewhere (``ray_address``,
    RAY_ADDRESS) is Serve's to schedule on."""
    if ray_address or os.environ.get("RAY_ADDRESS"):
        return
    cpus = (local_cluster_resources() or {}).get("CPU")
    if cpus is not None and replicas * cpus_per_replica > cpus + 1e-9:
        raise PreflightError(
            f"{flag} {replicas} x {cpus_per_replica:g} CPU = {replicas * cpus_per_replica:g} CPUs, "
            f"the local Ray cluster on this machine would have {cpus:g}: lower {flag}"
        )


def serve_until_stopped(
    application: serve.Application,
    *,
    host: str,
    port: int,
    on_ready: Callable[[str], None],
    ray_address: str | None = None,
    stop_after_s: float | None = None,
    model_kind: str | None = None,
) -> None:
    """Start Ray (a local cluster, or the one at ``ray_address`` or RAY_ADDRESS) and
    Serve listening on ``host:port``, run ``application`` and block until SIGINT or
    SIGTERM (or ``stop_after_s`` after it is ready); then take the application down, and
    Serve with the local cluster. ``on_ready`` gets the URL. ``model_kind``: the served
    model's (:func:`model_kind`), whose module, for a user's model, the session ships
    and, on a cluster started elsewhere, checks there with the versions."""
    import time

    from trainflow.cluster.checks import check_shipped
    from trainflow.cluster.session import ray_session
    from trainflow.config import PipelineConfig

    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    model = {"model": {"kind": model_kind}} if model_kind else {}
    session = PipelineConfig(ray={"address": ray_address}, **model)
    with ray_session(session):
        check_shipped(log, module=session.model.user_module)
        # Installed after ray.init, whose own SIGTERM handler would abort the process; only
        # the main thread may install them (elsewhere, the caller's own handling stands).
        stop = threading.Event()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {
                sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
            }
        try:
            serve.start(http_options={"host": host, "port": port}, logging_config=QUIET_LOGS)
            try:
                serve.run(application, name=APP_NAME, route_prefix="/", logging_config=QUIET_LOGS)
                on_ready(f"http://{_url_host(host)}:{port}")
                until = None if stop_after_s is None else time.monotonic() + stop_after_s
                while not stop.wait(0.5 if until is None else max(0.0, min(0.5, until - time.monotonic()))):
                    if until is not None and time.monotonic() >= until:
                        break
            finally:
                # The application drains (requests in flight are answered) and stops; a
                # cluster elsewhere keeps Serve for its other applications, a local one
                # ends with the session, Serve's controller and proxy with it.
                serve.delete(APP_NAME)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
