"""One thin Prefect task per step: call a pipelines function, log, publish, return small values."""

from trainflow.tasks.steps import evaluate, ingest, preprocess, register, train

__all__ = ["ingest", "preprocess", "train", "evaluate", "register"]
