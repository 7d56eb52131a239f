"""Model builders by name. A model is described by a JSON spec saved with its checkpoint,
so loading it needs trainflow and the spec, nothing pickled."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from trainflow.config import ConfigError, ModelConfig


def model_spec(cfg: ModelConfig, num_features: int, num_classes: int) -> dict[str, Any]:
    """The full architecture, from the config plus what the data says."""
    spec: dict[str, Any] = {
        "kind": cfg.kind,
        "num_features": num_features,
        "num_classes": num_classes,
        "dropout": cfg.dropout,
    }
    if cfg.kind == "mlp":
        spec["hidden_sizes"] = list(cfg.hidden_sizes)
        return spec
    shape = cfg.image_shape
    if shape is None:
        side = math.isqrt(num_features)
        if side * side != num_features:
            raise ConfigError(
                f"model.image_shape: {num_features} features are not a square image; "
                "set model.image_shape to [channels, height, width] or use model.kind=mlp"
            )
        shape = [1, side, side]
    if len(shape) != 3 or math.prod(shape) != num_features:
        raise ConfigError(
            f"model.image_shape {shape}: needs [channels, height, width] whose product is "
            f"the number of features, {num_features}"
        )
    spec["image_shape"] = list(shape)
    spec["channels"] = list(cfg.channels)
    spec["hidden_sizes"] = list(cfg.hidden_sizes)
    return spec


def _mlp(in_features: int, hidden: list[int], out: int, dropout: float) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_features, width), nn.ReLU(), nn.Dropout(dropout)]
        in_features = width
    layers.append(nn.Linear(in_features, out))
    return layers


class SmallCNN(nn.Module):
    """3x3 convolutions, a 2x2 pooling, then an MLP head: enough for 8x8 to 32x32 images."""

    def __init__(
        self, image_shape: list[int], channels: list[int], hidden: list[int], num_classes: int, dropout: float
    ):
        super().__init__()
        self.image_shape = tuple(image_shape)
        c, h, w = image_shape
        convs: list[nn.Module] = []
        for width in channels:
            convs += [nn.Conv2d(c, width, kernel_size=3, padding=1), nn.ReLU()]
            c = width
        convs.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*convs)
        flat = c * (h // 2) * (w // 2)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), *_mlp(flat, hidden, num_classes, dropout)
        )

    def forward(self, x):
        return self.head(self.features(x.view(-1, *self.image_shape)))


def build_model(spec: dict[str, Any]) -> nn.Module:
    kind = spec["kind"]
    if kind == "mlp":
        return nn.Sequential(
            *_mlp(spec["num_features"], spec["hidden_sizes"], spec["num_classes"], spec["dropout"])
        )
    if kind == "cnn":
        return SmallCNN(
            spec["image_shape"], spec["channels"], spec["hidden_sizes"], spec["num_classes"], spec["dropout"]
        )
    raise ValueError(f"model.kind {kind!r}: use mlp or cnn")
