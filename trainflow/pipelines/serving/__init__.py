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
- With ``shadow=`` (``--shadow challenger``), every answer carries an ``id``; ``GET
  /shadow`` compares the two models' answers, ``POST /feedback`` scores them on labels.
- ``GET /model`` (name, version, alias followed, task, classes, input columns or image
  shape, the gate's decision and test metrics), ``GET /healthz``, FastAPI's ``/docs``.

Requests are batched on each replica (``@serve.batch``): the rows of the requests that
arrive within ``batch_wait_s`` (2 ms) of the first go through the model in one pass,
up to ``batch_max_rows`` (1024) rows; a replica takes up to MAX_ONGOING_REQUESTS (64)
requests at once, so that under load they queue there, where they batch. Waiting costs
a lone request those 2 ms at most; under load the queue fills a batch before the wait
ends. A request holds at most ``max_rows`` (1024) rows or images and ``max_body_bytes``
(8 MiB) of body: more is a 413. Every malformed request is a 4xx whose JSON names the
field (``{"error": ..., "field": "rows[3].a"}``); the replica goes on serving.

A replica serving an alias (``digits``, ``digits@champion``) asks the registry every
``poll_interval_s`` (2 s) which version the alias points at. When it points elsewhere
(the gate, ``trainflow models promote``, ``rollback``), the replica loads the new
version beside the old one, then swaps the reference: requests already in a batch
finish on the old version, every later batch runs on the new one, none is dropped. So a
move is served within the poll interval plus the time the new version takes to load. A
pinned version (``digits/3``) is never asked about again.

The replicas read the registry the driver reads: its TRAINFLOW_HOME and
MLFLOW_TRACKING_URI are handed to them. On a cluster of several machines that takes an
MLflow server (MLFLOW_TRACKING_URI), which every node reaches.

By concern: ``settings`` (the defaults of the limits, batching and polling;
``ServeSettings``), ``requests`` (a request's body, rows, columns or images, checked:
``RequestError``, ``Inputs``), ``served`` (a loaded version, and one pass of it over a
batch), ``deployment`` (``ModelServer`` and :func:`app`), ``server`` (the command's
checks and :func:`serve_until_stopped`) and ``sampled`` (the sample of the rows each
replica answered, under ``serving/<name>/`` of the model's ``storage`` or of
TRAINFLOW_HOME, which ``trainflow models drift`` scores) and ``shadow`` (a challenger
that also answers every request, off the answer's path: ``GET /shadow``, ``POST
/feedback``). Ray Serve's replicas import ``ModelServer`` from ``deployment``, by its
module path.
"""

from trainflow.pipelines.serving.deployment import ModelServer, app
from trainflow.pipelines.serving.requests import Inputs, RequestError, parse_body, parse_inputs, read_body
from trainflow.pipelines.serving.served import Served, answer
from trainflow.pipelines.serving.server import check_fits, check_port, model_kind, serve_until_stopped
from trainflow.pipelines.serving.settings import (
    APP_NAME,
    BATCH_MAX_ROWS,
    BATCH_WAIT_S,
    MAX_BODY_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_ONGOING_REQUESTS,
    MAX_ROWS,
    POLL_INTERVAL_S,
    QUIET_LOGS,
    TARGET_ONGOING_REQUESTS,
    ServeSettings,
)

__all__ = [
    "APP_NAME",
    "BATCH_MAX_ROWS",
    "BATCH_WAIT_S",
    "MAX_BODY_BYTES",
    "MAX_IMAGE_PIXELS",
    "MAX_ONGOING_REQUESTS",
    "MAX_ROWS",
    "POLL_INTERVAL_S",
    "QUIET_LOGS",
    "TARGET_ONGOING_REQUESTS",
    "Inputs",
    "ModelServer",
    "RequestError",
    "ServeSettings",
    "Served",
    "answer",
    "app",
    "check_fits",
    "check_port",
    "model_kind",
    "parse_body",
    "parse_inputs",
    "read_body",
    "serve_until_stopped",
]
