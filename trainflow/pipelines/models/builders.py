"""Models that a named builder makes: ``torchvision:<architecture>``, a builder of
``torchvision.models`` (:data:`TORCHVISION_MODELS`), and ``package.module:callable``, the
user's own (:data:`USER_MODELS`). Both sit in :class:`~.build.Reshaped`, which views
trainflow's flat rows as the builder's ``input_shape``; the builder is looked up by
:mod:`.kinds` (:func:`~.kinds.torchvision_builder`, :func:`~.kinds.user_callable`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from trainflow.config import ConfigError
from trainflow.pipelines.data.preprocess import FEATURES
from trainflow.pipelines.models import kinds as model_kinds
from trainflow.pipelines.models.build import (
    Reshaped,
    check_fits,
    first_conv,
    first_line,
    image_shape_of,
    inputs_of,
    outputs_of,
    takes_inputs,
)


class TorchvisionModels(model_kinds.ModelFamily):
    """A torchvision classification architecture, its head sized for the data's outputs and
    its first convolution for the images' channels."""

    def spec_part(self, cfg, num_features, num_outputs, *, image_shape, inputs, classes, lora):
        return {"input_shape": image_shape_of(cfg, num_features, image_shape), "args": dict(cfg.args)}

    def build(self, spec):
        kind = spec["kind"]
        shape = spec["input_shape"]
        make = model_kinds.torchvision_builder(kind)
        net = _call(kind, make, weights=None, num_classes=outputs_of(spec), **spec.get("args", {}))
        if shape[0] != 3:
            replace_first_conv(net, shape[0], kind)
        return Reshaped(net, shape, inputs_of(spec), by_name=spec.get("by_name", False))


class UserModels(model_kinds.ModelFamily):
    """The user's builder: called with ``input_shape`` (one flat tensor per batch), or, when
    it takes a parameter ``inputs``, with the inputs by name (a dict of tensors)."""

    def spec_part(self, cfg, num_features, num_outputs, *, image_shape, inputs, classes, lora):
        shape = list(cfg.image_shape or image_shape or [num_features])
        check_fits(shape, num_features)
        part: dict[str, Any] = {"input_shape": shape, "args": dict(cfg.args)}
        if takes_inputs(model_kinds.user_callable(cfg.kind)):
            part["by_name"] = True
            part["inputs"] = inputs or {FEATURES: {"shape": shape, "dtype": "float32"}}
        return part

    def build(self, spec):
        kind = spec["kind"]
        shape = spec["input_shape"]
        inputs = inputs_of(spec)
        args = spec.get("args", {})
        make = model_kinds.user_callable(kind)
        if spec.get("by_name"):
            net = _call(kind, make, inputs=inputs, num_outputs=outputs_of(spec), **args)
        else:
            net = _call(kind, make, input_shape=list(shape), num_outputs=outputs_of(spec), **args)
        return Reshaped(net, shape, inputs, by_name=spec.get("by_name", False))


TORCHVISION_MODELS = TorchvisionModels()
USER_MODELS = UserModels()


def _call(kind: str, make, **kwargs) -> nn.Module:
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    name = getattr(make, "__name__", "the builder")
    try:
        net = make(**kwargs)
    except Exception as e:
        raise ConfigError(
            f"model.kind {kind}: {name}({shown}) raised {type(e).__name__}: {first_line(e)}"
        ) from None
    if not isinstance(net, nn.Module):
        raise ConfigError(
            f"model.kind {kind}: {name}({shown}) returned a {type(net).__name__}, not a torch.nn.Module"
        )
    return net


def replace_first_conv(model: nn.Module, channels: int, kind: str) -> None:
    """Replace the first convolution by one that takes ``channels`` channels, with the
    same hyperparameters (fresh weights; :func:`~.build.load_weights` adapts pretrained ones)."""
    found = first_conv(model)
    if found is None or found[1].groups != 1:
        raise ConfigError(
            f"model.kind {kind}: takes 3-channel images and has no plain first convolution to "
            f"replace for the data's {channels}; convert the images (data.image_mode: RGB)"
        )
    name, old = found
    new = nn.Conv2d(
        channels,
        old.out_channels,
        kernel_size=old.kernel_size,
        stride=old.stride,
        padding=old.padding,
        dilation=old.dilation,
        bias=old.bias is not None,
        padding_mode=old.padding_mode,
    )
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name), attr, new)
