"""trainflow: Prefect flows that train, evaluate and register PyTorch models on Ray."""

from trainflow.config import ConfigError, PipelineConfig, load_config
from trainflow.version import __version__


def load_model(uri: str):
    """A registered model (``NAME@champion``, ``NAME/3``, ``models:/NAME@ALIAS``), ready to predict."""
    from trainflow.pipelines.registry import load_model as _load

    return _load(uri)


__all__ = ["ConfigError", "PipelineConfig", "load_config", "load_model", "__version__"]
