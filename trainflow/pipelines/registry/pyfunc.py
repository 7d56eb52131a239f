"""The MLflow ``python_function`` flavor that every registered version carries.

Registration writes an ``MLmodel`` file (with an input signature: the model's columns)
and the pip requirements beside the checkpoint's files, so tools that speak MLflow load
a version without trainflow's API::

    mlflow.pyfunc.load_model("models:/digits@champion").predict(frame)

which answers what ``trainflow.load_model("digits@champion").predict(frame)`` does: MLflow
imports this module (``loader_module``) and calls :func:`_load_pyfunc` on the folder.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.pipelines.data.preprocess import Preprocessor

if TYPE_CHECKING:
    from trainflow.pipelines.models.checkpoint import Predictor

MLMODEL = "MLmodel"
REQUIREMENTS = "requirements.txt"
PYTHON_ENV = "python_env.yaml"
FLAVOR_FILES = (MLMODEL, REQUIREMENTS, PYTHON_ENV)
# What loading a version needs, pinned as installed where it was registered.
_PACKAGES = ("trainflow", "torch", "torchvision", "numpy", "pandas", "mlflow-skinny")


class TrainflowPyfunc:
    """The object ``mlflow.pyfunc.load_model`` wraps: a checkpoint's predictor."""

    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def predict(self, data: Any, params: dict[str, Any] | None = None) -> Any:
        """Class values, or a regression's numbers, for raw rows (a pandas DataFrame)."""
        return self.predictor.predict(data)


def _load_pyfunc(path: str) -> TrainflowPyfunc:
    """MLflow's entry point for a ``loader_module``: the registered checkpoint folder."""
    from trainflow.pipelines.models.checkpoint import load_checkpoint  # torch: for loading alone

    return TrainflowPyfunc(load_checkpoint(path))


def pip_requirements() -> list[str]:
    out = []
    for name in _PACKAGES:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def signature(pre: Preprocessor):
    """The columns the model reads: numbers as double, categories as strings; through a
    transform, the raw columns it takes, by their source's types. An image folder's model
    reads arrays (an ``image`` column of HxW or HxWxC uint8), which a column signature
    cannot state: it has none; nor has a transform's of a column of lists."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    if pre.image:
        return None
    if pre.transform:
        kinds = {c: _raw_type(pre.transform["columns"][c]) for c in pre.raw_columns}
        if None in kinds.values():
            return None
        columns = [ColSpec(kind, c) for c, kind in kinds.items()]
    else:
        columns = [ColSpec("double", c) for c in pre.numeric_columns]
        columns += [ColSpec("string", c) for c in pre.categorical]
    output = ColSpec("double") if pre.is_regression else ColSpec(_output_type(pre.classes))
    return ModelSignature(inputs=Schema(columns), outputs=Schema([output]))


def _raw_type(arrow_type: str) -> str | None:
    """MLflow's column type for a raw column of this Arrow type; None for one it has no type for."""
    if arrow_type.startswith(("int", "uint")):
        return "long"
    if arrow_type.startswith(("double", "float", "halffloat")):
        return "double"
    return {"string": "string", "large_string": "string", "bool": "boolean"}.get(arrow_type)


def _output_type(classes: list[Any]) -> str:
    if all(isinstance(c, bool) for c in classes):
        return "boolean"
    if all(isinstance(c, int) for c in classes):
        return "long"
    return "string"


def write_flavor(folder: str | Path) -> None:
    """Write the flavor's files into a checkpoint folder (before it is hashed and logged)."""
    import yaml
    from mlflow.models import Model
    from mlflow.pyfunc import add_to_model

    from trainflow.pipelines.models.checkpoint import PREPROCESSOR

    folder = Path(folder)
    pre = Preprocessor.load(folder / PREPROCESSOR)
    model = Model(signature=signature(pre))
    add_to_model(model, loader_module=__name__, data=".", python_env=PYTHON_ENV)
    (folder / REQUIREMENTS).write_text("\n".join(pip_requirements()) + "\n")
    python_env = {
        "python": ".".join(map(str, sys.version_info[:3])),
        "build_dependencies": ["pip"],
        "dependencies": [f"-r {REQUIREMENTS}"],
    }
    (folder / PYTHON_ENV).write_text(yaml.safe_dump(python_env, sort_keys=False))
    model.save(folder / MLMODEL)
