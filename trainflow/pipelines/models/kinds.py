"""What ``model.kind`` and ``model.weights`` name, resolved without building a model, and
the table of model kinds' families.

:data:`FAMILIES` maps each family (``own``: ``mlp`` and ``cnn``; ``torchvision:<architecture>``;
``hf:<model id or folder>``; the user's ``package.module:callable``) to its
:class:`ModelFamily`, which builds its models, and to its check before a run. Shared code
asks :func:`family` and never tests a kind's prefix; a family's module is imported when a
config names it. The checks resolve names, import the user's module and find weights
files, each failing in one line (ConfigError naming the field). Importing this module
imports neither torch nor torchvision: the checks before a run use it for every kind.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from trainflow.config import ConfigError, ModelConfig
from trainflow.config.training import kind_family, kind_name
from trainflow.pipelines.hooks import load_hook

# A torchvision weights name: an enum of torchvision.models and one of its members.
WEIGHTS_NAME = re.compile(r"[A-Za-z]\w*_Weights\.\w+")


class Family(NamedTuple):
    """A row of :data:`FAMILIES`: ``module:name`` of the family's :class:`ModelFamily`, and of
    its check before a run (a function of the kind, which spares the checks the family's
    module and torch where the family allows), or None."""

    models: str
    check: str | None


FAMILIES = {
    "own": Family("trainflow.pipelines.models.build:OWN_MODELS", None),
    "torchvision": Family(
        "trainflow.pipelines.models.builders:TORCHVISION_MODELS",
        "trainflow.pipelines.models.kinds:torchvision_builder",
    ),
    "hf": Family("trainflow.pipelines.models.hf:HF_MODELS", "trainflow.pipelines.hf_hub:model_folder"),
    "user": Family(
        "trainflow.pipelines.models.builders:USER_MODELS", "trainflow.pipelines.models.kinds:user_callable"
    ),
}


class ModelFamily:
    """What shared code asks of a family of model kinds; each family's module defines one.
    The defaults suit a model whose checkpoint is its whole state dict."""

    def spec_part(
        self, cfg: ModelConfig, num_features: int, num_outputs: int, *, image_shape, inputs, classes, lora
    ) -> dict[str, Any]:
        """The family's fields of the model's spec, from the config and the data
        (:func:`~trainflow.pipelines.models.build.model_spec` says what each argument is)."""
        raise NotImplementedError

    def build(self, spec: dict[str, Any]) -> Any:
        """The architecture ``spec`` describes, with fresh weights: the ``nn.Module`` a
        checkpoint's state dict loads into."""
        raise NotImplementedError

    def initial(self, spec: dict[str, Any]) -> Any:
        """The model a run starts from, before ``model.weights``: the architecture."""
        return self.build(spec)

    def inner(self, net: Any) -> Any:
        """The model under the family's own wrapper, whose parameters ``model.freeze`` and
        ``model.weights`` name."""
        return net

    def adapter_alone(self, spec: dict[str, Any], state: dict[str, Any]) -> bool:
        """Whether ``state`` holds an adapter without the base weights it adapts, which
        :meth:`initial` reads."""
        return False

    def loaded(self, model: Any, spec: dict[str, Any]) -> Any:
        """A checkpoint's model as it predicts (an adapter merged where the spec says so)."""
        return model

    def adapter_state(self, spec: dict[str, Any], folder: Path) -> dict[str, Any] | None:
        """The state dict of the model of ``spec`` with an adapter a user's loop saved in
        ``folder`` merged in; None for a family without adapters."""
        return None

    def image_processing(self, kind: str) -> dict[str, list]:
        """The preprocess fields (``image_size``, ``image_mean``, ``image_std``) the model's
        own image processing sets; none by default."""
        return {}


def _named(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@functools.cache
def _family_models(name: str) -> ModelFamily:
    return _named(FAMILIES[name].models)


def family(kind: str) -> ModelFamily:
    """The :class:`ModelFamily` of ``kind``'s family, its module imported on first use."""
    return _family_models(kind_family(kind))


def torchvision_builder(kind: str) -> Callable[..., Any]:
    """The builder ``torchvision:<architecture>`` names; an unknown name lists close ones."""
    import torchvision.models

    name = kind_name(kind)
    known = torchvision.models.list_models(module=torchvision.models)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
        hint = f"close names: {', '.join(close)}" if close else "see torchvision.models.list_models()"
        raise ConfigError(
            f"model.kind {kind}: no classification architecture {name!r} in torchvision.models; {hint}"
        )
    return torchvision.models.get_model_builder(name)


def user_callable(kind: str) -> Callable[..., Any]:
    """The callable ``package.module:callable`` names, imported here."""
    return load_hook("model.kind", kind)


def weights_file(weights: str) -> Path:
    """The local file ``model.weights`` names: a state dict file, or the file torch's hub
    cache holds for a torchvision weights name, downloaded there by torchvision's own code
    when missing. Missing and not downloadable: one line naming where to put it."""
    path = Path(weights).expanduser()
    if path.is_file():
        return path.resolve()
    if not WEIGHTS_NAME.fullmatch(weights):
        raise ConfigError(
            f"model.weights {weights}: no such file; give a state dict file or a torchvision "
            "weights name such as ResNet18_Weights.DEFAULT"
        )
    import torch.hub
    import torchvision.models

    try:
        enum = torchvision.models.get_weight(weights)
    except (KeyError, ValueError, AttributeError):
        raise ConfigError(
            f"model.weights {weights}: not a torchvision weights name (such as ResNet18_Weights.DEFAULT) "
            "nor a file"
        ) from None
    url = enum.url
    cached = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]
    if not cached.is_file():
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(url, str(cached), progress=False)
        except Exception:
            raise ConfigError(
                f"model.weights {weights}: {cached.name} is not in torch's hub cache and could not be "
                f"downloaded; download {url} to {cached}"
            ) from None
    return cached


def check_model(cfg: ModelConfig) -> None:
    """The checks before a run, at config level: the architecture exists, the user's
    module imports and holds the callable, the weights file is there. Building the model
    needs the data's shape and outputs: :func:`~trainflow.pipelines.models.build.model_spec`
    does, in the driver."""
    check = FAMILIES[cfg.family].check
    if check is not None:
        _named(check)(cfg.kind)
    if cfg.weights is not None:
        weights_file(cfg.weights)


def square_side(width: int) -> int:
    """The side of the square one-channel image of ``width`` numbers that trainflow's cnn
    reads a row as, when model.image_shape does not say its shape."""
    side = math.isqrt(width)
    if side * side != width:
        raise ConfigError(
            f"model.image_shape: {width} features are not a square image; "
            "set model.image_shape to [channels, height, width] or use model.kind=mlp"
        )
    return side


def check_table_fits(cfg: ModelConfig, width: int | None, source: str) -> None:
    """Before a run, trainflow's cnn on a table: its ``width`` numbers make a square image
    (:func:`square_side`). None: a width that only fitting tells (categorical columns, one
    column a category), which the cnn is not for. Other kinds take any width."""
    if cfg.kind != "cnn" or cfg.image_shape is not None:
        return
    if width is None:
        raise ConfigError(
            f"model.kind cnn reads square images; {source} is a table with categorical columns, "
            "whose width only fitting tells: use model.kind=mlp, or set model.image_shape"
        )
    square_side(width)
