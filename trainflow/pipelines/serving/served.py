"""The model a replica serves: a loaded version with what ``GET /model`` says of it, and
one pass of it over a batch of requests, split back into one answer each."""

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from trainflow.pipelines.data.schema import IMAGE, DataError
from trainflow.pipelines.models.checkpoint import Predictor, load_checkpoint
from trainflow.pipelines.registry import versions
from trainflow.pipelines.serving.requests import Inputs, RequestError
from trainflow.workspace import Workspace


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
        details = versions.version_details(ws, f"{name}/{version}")
        mv = versions.resolve(ws, f"{name}/{version}")
        predictor = load_checkpoint(versions.local_checkpoint(ws, mv))
        predictor.version = version
        # Typed once, by the registry: `trainflow models show` says the same.
        return cls(predictor, name, version, details["gate"], details["metrics"], now())


def use_registry(tracking_uri: str | None) -> None:
    """Read the registry the driver reads, whatever this replica's environment says."""
    import logging
    import os

    if tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
    else:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    logging.getLogger("mlflow").setLevel(logging.WARNING)


def now() -> str:
    """The time in UTC, to the second, as ``GET /model`` shows it."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def _merged(batch: list[Inputs]) -> dict[str, Any]:
    """The requests' columns end to end: images as one list, other columns as one array."""
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
