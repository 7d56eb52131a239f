"""trainflow: Prefect flows that train, evaluate and register PyTorch models on Ray."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from trainflow.version import __version__

if TYPE_CHECKING:
    from trainflow.config import ConfigError, PipelineConfig, load_config

# Imported on first use: the `trainflow` command hands a run to `trainflow up`'s forkserver
# before it imports pydantic and the config.
_FROM_CONFIG = ("ConfigError", "PipelineConfig", "load_config")


def __getattr__(name: str):
    if name in _FROM_CONFIG:
        return getattr(importlib.import_module("trainflow.config"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_model(uri: str):
    """A registered model (``NAME@champion``, ``NAME/3``, ``models:/NAME@ALIAS``), ready to predict."""
    from trainflow.pipelines.registry.versions import load_model as _load

    return _load(uri)


__all__ = ["ConfigError", "PipelineConfig", "load_config", "load_model", "__version__"]
