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

The steps a default training run does not take (``drift``, ``predict``, ``check_input``,
``resolve_model``, ``sweep``, ``serve_endpoint``) are imported when first asked for.
The plumbing of trainflow's own flows is here too: :func:`one_training_at_a_time` (the
model's concurrency slot) and :func:`step_times` (what each step took); the Ray session
and the cluster's preflight are in :mod:`trainflow.cluster`.
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING

from trainflow.tasks.evaluate import evaluate
from trainflow.tasks.prepare import ingest, preprocess
from trainflow.tasks.register import register
from trainflow.tasks.slots import one_training_at_a_time
from trainflow.tasks.steps import StepInputError, step_times
from trainflow.tasks.train import train

if TYPE_CHECKING:
    from trainflow.tasks.drift import drift
    from trainflow.tasks.predict import check_input, predict, resolve_model
    from trainflow.tasks.serving import serve_endpoint
    from trainflow.tasks.sweep import sweep

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

# The steps imported when first asked for, by the module that defines each.
LAZY = {
    "drift": "drift",
    "check_input": "predict",
    "predict": "predict",
    "resolve_model": "predict",
    "serve_endpoint": "serving",
    "sweep": "sweep",
}


def __getattr__(name: str):
    if name in LAZY:
        step = getattr(importlib.import_module(f"{__name__}.{LAZY[name]}"), name)
        globals()[name] = step
        return step
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Steps(types.ModuleType):
    """This package, whose ``drift``, ``predict`` and ``sweep`` stay the steps when their
    modules of the same names are imported (Python's import sets a package's attribute to
    each submodule it imports)."""

    def __setattr__(self, name: str, value) -> None:
        if name in LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Steps
