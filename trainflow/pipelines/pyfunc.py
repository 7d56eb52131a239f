"""MLflow's entry point for registered versions whose ``MLmodel`` names
``loader_module: trainflow.pipelines.pyfunc``. A version's files are hashed at
registration and never rewritten, so this path stays and hands them to
:mod:`trainflow.pipelines.registry.pyfunc`, where the flavor lives and which new
versions name."""

from trainflow.pipelines.registry.pyfunc import _load_pyfunc

__all__ = ["_load_pyfunc"]
