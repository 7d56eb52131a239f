"""Prefect flows: short recipes of task calls."""

from trainflow.flows.batch_predict import batch_predict
from trainflow.flows.reproduce import reproduce_version
from trainflow.flows.retrain import retrain_on_new_data, watch_data, watch_served
from trainflow.flows.sweep import sweep_pipeline
from trainflow.flows.training import training_pipeline

__all__ = [
    "batch_predict",
    "reproduce_version",
    "retrain_on_new_data",
    "sweep_pipeline",
    "training_pipeline",
    "watch_data",
    "watch_served",
]
