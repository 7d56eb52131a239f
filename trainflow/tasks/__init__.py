"""One thin Prefect task per step: call a pipelines function, log, publish, return small values."""

from trainflow.tasks.evaluate import evaluate
from trainflow.tasks.prepare import ingest, preprocess
from trainflow.tasks.register import register
from trainflow.tasks.train import train

__all__ = ["ingest", "preprocess", "train", "evaluate", "register"]
