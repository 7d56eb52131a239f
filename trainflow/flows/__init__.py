"""Prefect flows: short recipes of task calls."""

from trainflow.flows.training import training_pipeline

__all__ = ["training_pipeline"]
