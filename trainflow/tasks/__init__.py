"""trainflow's steps as Prefect tasks, for trainflow's flows and for yours.

Each runs inside any Prefect flow and opens what it needs when the caller has not (a Ray
session, the working folders); each is handed what the step before returns, and one
handed anything else fails in one line naming it (:class:`StepInputError`)::

    from prefect import flow
    from trainflow import load_config
    from trainflow.tasks import evaluate, ingest, preprocess, register, train

    @flow
    def my_flow():
        config = load_config("configs/digits.yaml", ["train.epochs=5"])
        source = ingest(config)
        prepared = preprocess(config, source)
        trained = train(config, prepared)
        evaluated = evaluate(config, prepared, trained)
        register(config, source, prepared, trained, evaluated)

The plumbing of trainflow's own flows is here too: :func:`one_training_at_a_time` (the
model's concurrency slot) and :func:`step_times` (what each step took); the Ray session
and the cluster's preflight are in :mod:`trainflow.cluster`.
"""

from typing import TYPE_CHECKING

from trainflow.tasks.drift import drift
from trainflow.tasks.evaluate import evaluate
from trainflow.tasks.predict import check_input, predict, resolve_model
from trainflow.tasks.prepare import ingest, preprocess
from trainflow.tasks.register import register
from trainflow.tasks.slots import one_training_at_a_time
from trainflow.tasks.steps import StepInputError, step_times
from trainflow.tasks.sweep import sweep
from trainflow.tasks.train import train

if TYPE_CHECKING:
    from trainflow.tasks.serving import serve_endpoint

__all__ = [
    "StepInputError",
    "check_input",
    "drift",
    "evaluate",
    "ingest",
    "one_training_at_a_time",
    "predict",
    "preprocess",
    "register",
    "resolve_model",
    "serve_endpoint",
    "step_times",
    "sweep",
    "train",
]


def __getattr__(name: str):
    """``serve_endpoint``, imported when first asked for: it imports Ray Serve and FastAPI,
    which a flow that trains never uses."""
    if name == "serve_endpoint":
        from trainflow.tasks.serving import serve_endpoint

        return serve_endpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
