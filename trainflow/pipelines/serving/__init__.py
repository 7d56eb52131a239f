"""Online serving: a registered model behind an HTTP endpoint on Ray Serve.

One Serve application, :func:`app`: a deployment (``ModelServer``) whose replicas each hold
a :class:`~trainflow.pipelines.models.checkpoint.Predictor` loaded from the registry, behind
FastAPI: ``POST /predict`` (rows, columns or images), ``GET /model``, ``GET /healthz``, and
with ``shadow=`` ``GET /shadow`` and ``POST /feedback``. Requests are batched on each
replica; a malformed one is a 4xx naming the field; a replica serving an alias follows its
moves without dropping a request. docs/guides/serving.md says each in full.

By concern: ``serve_settings`` (limits, batching, polling), ``requests`` (a request's body,
checked), ``served`` (a loaded version, one pass over a batch), ``deployment``
(``ModelServer``, :func:`app`; Serve imports it by this path), ``server`` (the command's
checks, :func:`serve_until_stopped`) and ``shadow`` (a challenger answering off the
answers' path). The sample of requests each replica keeps for ``trainflow models drift``
is :mod:`trainflow.pipelines.drift.samples`."""

from trainflow.pipelines.serving.deployment import ModelServer, app
from trainflow.pipelines.serving.requests import Inputs, RequestError, parse_body, parse_inputs, read_body
from trainflow.pipelines.serving.serve_settings import (
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
from trainflow.pipelines.serving.served import Served, answer
from trainflow.pipelines.serving.server import check_fits, check_port, model_kind, serve_until_stopped

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
