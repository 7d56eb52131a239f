"""What ``model.kind`` and ``model.weights`` name, resolved without building a model.

``mlp`` and ``cnn`` are trainflow's own; ``torchvision:<architecture>`` names a builder of
``torchvision.models``; ``package.module:callable`` a model of the user's own;
``hf:<model id or folder>`` a pretrained Hugging Face model (``hf_hub`` finds it). These
resolve names, import the user's module and find weights files, each failing in one line
(ConfigError naming the field). Importing this module imports neither torch nor
torchvision: the checks before a run use it for every kind, and pay for torchvision only
when the config names it.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainflow.config import ConfigError, ModelConfig
from trainflow.config.training import HF
from trainflow.pipelines.hooks import load_hook

TORCHVISION = "torchvision:"
OWN = ("mlp", "cnn")
# A torchvision weights name: an enum of torchvision.models and one of its members.
WEIGHTS_NAME = re.compile(r"[A-Za-z]\w*_Weights\.\w+")


def torchvision_builder(kind: str) -> Callable[..., Any]:
    """The builder ``torchvision:<architecture>`` names; an unknown name lists close ones."""
    import torchvision.models

    name = kind.removeprefix(TORCHVISION)
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


def builder(kind: str) -> Callable[..., Any] | None:
    """What builds a torchvision or user kind; None for trainflow's own and Hugging Face's."""
    if kind in OWN or kind.startswith(HF):
        return None
    return torchvision_builder(kind) if kind.startswith(TORCHVISION) else user_callable(kind)


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
    if cfg.kind.startswith(HF):
        from trainflow.pipelines.hf_hub import resolve

        resolve(cfg.kind.removeprefix(HF), "model.kind", HF)
    builder(cfg.kind)
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
