"""Prefect flows: short recipes of task calls.

Each flow is imported when first asked for (``from trainflow.flows import sweep_pipeline``),
so that a command running one does not import what the others need.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainflow.flows.batch_predict import batch_predict
    from trainflow.flows.reproduce import reproduce_version
    from trainflow.flows.retrain import retrain_on_new_data, watch_data, watch_served
    from trainflow.flows.sweep import sweep_pipeline
    from trainflow.flows.training import training_pipeline

# Each flow by the module that defines it.
_MODULES = {
    "batch_predict": "batch_predict",
    "reproduce_version": "reproduce",
    "retrain_on_new_data": "retrain",
    "sweep_pipeline": "sweep",
    "training_pipeline": "training",
    "watch_data": "retrain",
    "watch_served": "retrain",
}

__all__ = [
    "batch_predict",
    "reproduce_version",
    "retrain_on_new_data",
    "sweep_pipeline",
    "training_pipeline",
    "watch_data",
    "watch_served",
]


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
