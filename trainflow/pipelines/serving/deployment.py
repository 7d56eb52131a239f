"""The Serve application: ``ModelServer``, the deployment whose replicas each serve one
loaded version behind a FastAPI ingress, batch the requests, follow an alias and keep a
sample of the rows they answer, for drift (:mod:`trainflow.pipelines.drift.samples`); and
:func:`app`, which binds it to a model for ``serve.run``."""

# No ``from __future__ import annotations``: FastAPI reads the routes' parameter types
# (``request: Request``) at run time, through Serve's ingress wrapper.
import asyncio
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from trainflow.config import ConfigError
from trainflow.pipelines.drift.samples import SAVE_EVERY_S, RequestSample, samples_folder
from trainflow.pipelines.models.checkpoint import model_actor_options
from trainflow.pipelines.registry import versions
from trainflow.pipelines.serving.requests import Inputs, RequestError, parse_body, parse_inputs, read_body
from trainflow.pipelines.serving.serve_settings import (
    BATCH_MAX_ROWS,
    BATCH_WAIT_S,
    MAX_ONGOING_REQUESTS,
    TARGET_ONGOING_REQUESTS,
    ServeSettings,
)
from trainflow.pipelines.serving.served import Served, answer, now, use_registry
from trainflow.pipelines.serving.shadow import Shadowing, ShadowServer, parse_feedback, shadow_uri
from trainflow.workspace import Workspace, workspace

log = logging.getLogger("trainflow.serving")


class _NoBatchSizeWarning(logging.Filter):
    """Drops Serve's warning that a batch's size is above ``max_ongoing_requests``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is larger than `max_ongoing_requests`" not in record.getMessage()


def _rows_in(batch: list[Inputs]) -> int:
    """A batch's size for ``@serve.batch``: its rows, not its requests."""
    return sum(inputs.rows for inputs in batch)


# POST /predict's body as /docs shows it: rows, columns or images, an example of each.
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

    def __init__(
        self,
        uri: str,
        home: str,
        tracking_uri: str | None,
        settings: ServeSettings,
        shadow: tuple[str, DeploymentHandle] | None = None,
    ):
        # Serve compares the batch's size, counted here in rows, with max_ongoing_requests,
        # counted in requests, and warns that batches stay below it: they do not.
        logging.getLogger("ray.serve").addFilter(_NoBatchSizeWarning())
        use_registry(tracking_uri)
        self._ws = Workspace(Path(home))
        self._uri = uri
        self._alias = versions.followed_alias(uri)
        self._settings = settings
        mv = versions.resolve(self._ws, uri)
        self._served = Served.load(self._ws, mv.name, str(mv.version))
        # What it was asked, for `trainflow models drift` (requests of an alias's every version).
        self._sample = RequestSample(
            samples_folder(self._ws, mv.name, self._served.predictor.config.get("storage"))
        )
        self._checked_at: str | None = now()
        self._follow_error: str | None = None
        # The challenger's replica, handed the requests this one answered (``--shadow``).
        self._shadow = Shadowing(*shadow) if shadow else None
        self._predict_batch.set_max_batch_size(settings.batch_max_rows)
        self._predict_batch.set_batch_wait_timeout_s(settings.batch_wait_s)
        self._stop = threading.Event()
        if self._alias is not None:
            threading.Thread(target=self._follow, name="trainflow-follow-alias", daemon=True).start()
        threading.Thread(target=self._save_sample, name="trainflow-save-sample", daemon=True).start()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    def _follow(self) -> None:
        """Every poll interval: where does the alias point? Load a new version whole, then
        swap it in; a failure keeps the current version serving and is shown in /model."""
        while not self._stop.wait(self._settings.poll_interval_s):
            try:
                mv = versions.resolve(self._ws, self._uri)
                if str(mv.version) != self._served.version:
                    new = Served.load(self._ws, mv.name, str(mv.version))
                    old = self._served.version
                    self._served = new
                    log.warning("%s: now serving version %s (was %s)", self._uri, new.version, old)
                self._checked_at = now()
                self._follow_error = None
            except Exception as e:  # the registry unreachable, a checkpoint refused: keep serving
                error = f"{type(e).__name__}: {e}"
                if isinstance(e, (ImportError, ConfigError)):
                    # The model could not be built here: the replicas carry the module of
                    # the version served at start only (model.kind: package.module:callable).
                    error += "; restart the server to serve a version built from another module"
                if error != self._follow_error:  # logged when the error changes, not every poll
                    log.warning("%s: cannot follow the alias: %s", self._uri, error)
                self._follow_error = error

    @serve.batch(max_batch_size=BATCH_MAX_ROWS, batch_wait_timeout_s=BATCH_WAIT_S, batch_size_fn=_rows_in)
    async def _predict_batch(self, batch: list[Inputs]) -> list[dict[str, Any] | RequestError]:
        # Off the event loop, which meanwhile takes in the requests of the next batch.
        return await asyncio.to_thread(self._answer, batch)

    def _answer(self, batch: list[Inputs]) -> list[dict[str, Any] | RequestError]:
        """The batch's answers; the rows of those answered go to the request sample."""
        served = self._served
        start = time.perf_counter()
        answers = answer(served, batch)
        if self._shadow is not None:
            took = time.perf_counter() - start
            for one in answers:
                if isinstance(one, dict):
                    one["id"] = uuid.uuid4().hex  # what POST /feedback names
            self._shadow.offer(served, batch, answers, took)
        for inputs, one in zip(batch, answers, strict=True):
            if not isinstance(one, RequestError):
                self._sample.add(inputs.columns, inputs.rows, served.version)
        return answers

    def _save_sample(self) -> None:
        """Every SAVE_EVERY_S, the request sample written when it has changed: off the
        requests' path."""
        while not self._stop.wait(SAVE_EVERY_S):
            try:
                self._sample.save_if_changed()
            except OSError as e:  # a full disk: the sample is an aid, serving goes on
                log.warning("cannot save the request sample to %s: %s", self._sample.path, e)

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
            "objective": pre.objective,
            "task": pre.objective,  # its old name, still answered in this release
            "classes": list(pre.classes),
        }
        if pre.image:
            info["image"] = {"shape": list(pre.image["shape"]), "input": "images"}
        else:
            info["input_columns"] = pre.raw_columns  # what a request sends: a transform's raw columns
        info |= {
            "gate": served.gate,
            "metrics": served.metrics,
            "loaded_at": served.loaded_at,
            "checked_at": self._checked_at if self._alias else None,
            "follow_error": self._follow_error,
            "poll_interval_s": self._settings.poll_interval_s if self._alias else None,
            "shadow": None if self._shadow is None else {"uri": self._shadow.uri},
            "limits": {"max_rows": self._settings.max_rows, "max_body_bytes": self._settings.max_body_bytes},
            "batching": {
                "max_rows": self._settings.batch_max_rows,
                "wait_s": self._settings.batch_wait_s,
            },
        }
        return JSONResponse(info)

    @api.get("/shadow")
    async def shadow(self) -> JSONResponse:
        """The champion's answers beside the shadowed challenger's, per pair of versions."""
        if self._shadow is None:
            return RequestError(
                404, "shadow", "this server shadows no challenger; serve with --shadow ALIAS"
            ).response()
        return JSONResponse(await self._shadow.handle.summary.remote())

    @api.post("/feedback")
    async def feedback(self, request: Request) -> JSONResponse:
        """Labels for a shadowed answer's rows (``{"id": ..., "labels": [...]}``), scored
        against both models' answers; the pair's comparison back."""
        try:
            if self._shadow is None:
                raise RequestError(
                    404, "shadow", "this server shadows no challenger; serve with --shadow ALIAS"
                )
            payload = parse_body(await read_body(request, self._settings.max_body_bytes))
            scored = await self._shadow.handle.feedback.remote(*parse_feedback(payload))
        except RequestError as e:
            return e.response()
        if isinstance(scored, str):
            field, message = scored.split(": ", 1)
            return RequestError(422, field, message).response()
        return JSONResponse(scored)

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
    shadow: str | None = None,
) -> serve.Application:
    """The Serve application for ``serve.run``: ``model`` (``NAME``, ``NAME@ALIAS``,
    ``NAME/VERSION``) behind :class:`ModelServer`'s HTTP API, on ``replicas`` replicas of
    ``cpus_per_replica`` CPUs each, or with ``max_replicas`` from one up to that many as
    the load asks (Serve's autoscaling, TARGET_ONGOING_REQUESTS per replica). An unknown
    model, version or alias is a RegistryError here, before any replica starts.
    ``shadow``: an alias (``challenger``) or version of the same model that also answers
    every request, off the answer's path (``shadow.py``)."""
    if replicas < 1 or (max_replicas is not None and max_replicas < 1):
        raise ValueError(f"replicas and max_replicas must be at least 1, got {replicas}, {max_replicas}")
    import ray

    ws = ws or workspace()
    served = versions.resolve(ws, model)
    folder = versions.local_checkpoint(ws, served)
    # A user's model module goes to the replicas: the one of the version served at the start
    # (a version the alias moves to must use the same). Shipped with the replicas when Ray
    # is connected already; else with serve_until_stopped's job, which the replicas inherit.
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
    settings = settings or ServeSettings()
    tracking = os.environ.get("MLFLOW_TRACKING_URI")
    shadowing = _shadow_app(ws, served.name, shadow, cpus_per_replica, settings) if shadow else None
    return ModelServer.options(
        **scaling,
        ray_actor_options=actor_options,
        max_ongoing_requests=MAX_ONGOING_REQUESTS,
    ).bind(model, str(ws.home), tracking, settings, shadowing)


def _shadow_app(ws: Workspace, name: str, shadow: str, cpus: float, settings: ServeSettings) -> tuple:
    """``--shadow``'s model URI and the challenger's one replica, bound; RegistryError
    now for an unknown alias or version, not in the replicas."""
    import ray

    uri = shadow_uri(name, shadow)
    folder = versions.local_checkpoint(ws, versions.resolve(ws, uri))
    actor_options = {"num_cpus": cpus, **(model_actor_options(str(folder)) if ray.is_initialized() else {})}
    server = ShadowServer.options(ray_actor_options=actor_options)
    return uri, server.bind(
        uri, str(ws.home), os.environ.get("MLFLOW_TRACKING_URI"), settings.poll_interval_s
    )
