"""Models by ``model.kind``: trainflow's own (``mlp``, ``cnn``), torchvision's
(``torchvision:resnet18``), pretrained Hugging Face transformers (``hf:``, :mod:`.hf`) and
the user's own (``package.module:callable``).

A model's JSON spec (``model.json``: kind, builder arguments, input shape, outputs) is
saved with its checkpoint, so nothing is pickled. :func:`model_spec` builds the model once
in the driver, so a model that does not fit the data fails there in one line; each worker
builds it from the spec (:func:`initial_model`), and a checkpoint rebuilds the
architecture alone (:func:`build_model`).

Input is one flat float32 tensor per batch, ``[N, num_features]``, viewed as
``model.image_shape`` or a builder's ``input_shape``. Several inputs (a transform's array
columns) reach a model as a dict that :class:`Reshaped` joins into that tensor, unless its
builder takes ``inputs`` (docs/guides/models.md)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from trainflow.config import ConfigError, ModelConfig
from trainflow.config.training import HF
from trainflow.pipelines.data.preprocess import FEATURES, Preprocessor
from trainflow.pipelines.models import hf as hf_models
from trainflow.pipelines.models import kinds as model_kinds
from trainflow.pipelines.models.kinds import OWN, TORCHVISION

# A dry forward pass in the driver runs on a batch this big (BatchNorm needs two rows).
_DRY_BATCH = 2


def model_spec(
    cfg: ModelConfig,
    num_features: int,
    num_outputs: int,
    *,
    image_shape: Sequence[int] | None = None,
    inputs: dict[str, dict[str, Any]] | None = None,
    classes: list | None = None,
    lora: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The full architecture, from the config and the data: ``num_features`` flat inputs per
    row, ``num_outputs`` outputs, an image source's ``image_shape`` and array columns'
    ``inputs`` (:func:`image_shape`, :func:`input_layout`); an ``hf:`` model's head named by
    ``classes`` and wrapped by ``lora``. Builds the model, runs a batch through it and counts
    its parameters: a kind, weights or freeze list that does not fit is a ConfigError naming
    the field."""
    spec: dict[str, Any] = {
        "kind": cfg.kind,
        "num_features": num_features,
        "num_outputs": num_outputs,
        "dropout": cfg.dropout,
    }
    if cfg.kind == "mlp":
        spec["hidden_sizes"] = list(cfg.hidden_sizes)
    elif cfg.kind == "cnn":
        spec["image_shape"] = _image_shape(cfg, num_features, image_shape)
        spec["channels"] = list(cfg.channels)
        spec["hidden_sizes"] = list(cfg.hidden_sizes)
    elif cfg.kind.startswith(HF):
        del spec["dropout"]
        spec.update(_hf_spec(cfg, num_features, num_outputs, inputs, classes, lora, image_shape))
    else:
        if cfg.kind.startswith(TORCHVISION):
            shape = _image_shape(cfg, num_features, image_shape)
        else:
            shape = list(cfg.image_shape or image_shape or [num_features])
            _fits(shape, num_features)
        spec.update(input_shape=shape, args=dict(cfg.args))
        del spec["dropout"]
        if not cfg.kind.startswith(TORCHVISION) and takes_inputs(model_kinds.builder(cfg.kind)):
            spec["by_name"] = True
            inputs = inputs or {FEATURES: {"shape": shape, "dtype": "float32"}}
    if inputs:
        spec["inputs"] = {n: {"shape": list(v["shape"]), "dtype": v["dtype"]} for n, v in inputs.items()}
    if cfg.weights is not None:
        spec["weights"] = cfg.weights  # provenance: a checkpoint never loads them again
        spec["weights_file"] = str(model_kinds.weights_file(cfg.weights))
    if cfg.freeze:
        spec["freeze"] = list(cfg.freeze)
    model = initial_model(spec)
    _dry_run(model, spec)
    spec["parameters"] = {
        "total": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    return spec


def _hf_spec(
    cfg: ModelConfig, num_features: int, num_outputs: int, inputs, classes, lora, image_shape
) -> dict[str, Any]:
    """An ``hf:`` model's part of the spec: its inputs by name (the tokenizer's) or the
    images' shape, its config."""
    if image_shape is not None:
        part: dict[str, Any] = {"input_shape": _image_shape(cfg, num_features, image_shape)}
    elif inputs:
        part = {"input_shape": [num_features], "by_name": True}
    else:
        raise ConfigError(
            f"model.kind {cfg.kind}: takes a text column through preprocess.tokenizer "
            "(such as {column: text, max_length: 128}), or images"
        )
    part["hf"] = hf_models.spec_part(cfg.kind, cfg.args, num_outputs, classes, images=image_shape is not None)
    return {**part, "lora": lora} if lora else part


def _image_shape(cfg: ModelConfig, num_features: int, image_shape: Sequence[int] | None) -> list[int]:
    """[c, h, w]: model.image_shape, else the image source's, else a square of one channel."""
    shape = cfg.image_shape or (list(image_shape) if image_shape else None)
    if shape is None:
        side = model_kinds.square_side(num_features)
        shape = [1, side, side]
    if len(shape) != 3:
        raise ConfigError(f"model.image_shape {shape}: needs [channels, height, width]")
    _fits(shape, num_features)
    return list(shape)


def _fits(shape: Sequence[int], num_features: int) -> None:
    if math.prod(shape) != num_features:
        raise ConfigError(
            f"model.image_shape {list(shape)}: its product must be the number of features, {num_features}"
        )


def image_shape(preprocessor: dict[str, Any]) -> list[int] | None:
    """The [c, h, w] of an image source's prepared rows, from its preprocessor state."""
    return (preprocessor.get("image") or {}).get("shape")


def input_layout(preprocessor: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The prepared inputs by name of data with a transform's array columns, from its
    preprocessor state (``Preprocessor.layout``); None for data of ``features`` alone."""
    return Preprocessor.from_dict(preprocessor).layout if preprocessor.get("arrays") else None


def takes_inputs(make) -> bool:
    """Whether a user's builder asks for its inputs by name: it takes a parameter ``inputs``."""
    try:
        return "inputs" in inspect.signature(make).parameters
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return False


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


class Reshaped(nn.Module):
    """A torchvision or user's model behind trainflow's rows, which reach every model flat
    (``num_features`` numbers): views each batch as [N, *input_shape] for the model
    inside, ``net``, whose names (``net.conv1.weight``) the checkpoint's state dict holds.

    Given ``inputs`` (name: shape per row), a batch is a dict of them: joined end to end
    into the flat batch (:func:`joined`), or handed over by name as they are when
    ``by_name`` (a ``features`` tensor alone is handed over as ``{"features": x}``)."""

    def __init__(
        self,
        net: nn.Module,
        input_shape: Sequence[int],
        inputs: dict[str, Sequence[int]] | None = None,
        by_name: bool = False,
    ):
        super().__init__()
        self.net = net
        self.input_shape = tuple(input_shape)
        self.inputs = {name: tuple(shape) for name, shape in (inputs or {}).items()}
        self.by_name = by_name

    def forward(self, x: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        if self.by_name:
            x = x if isinstance(x, dict) else {FEATURES: x}
            return self.net({name: x[name].reshape(-1, *shape) for name, shape in self.inputs.items()})
        if isinstance(x, dict):
            x = joined(x, list(self.inputs))
        return self.net(x.reshape(-1, *self.input_shape))


def joined(inputs: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    """Inputs by name as one flat batch, in ``names``' order: integers when every one
    holds integers (token ids stay int64), else float32."""
    parts = [inputs[name].reshape(len(inputs[name]), -1) for name in names]
    if all(not p.is_floating_point() for p in parts):
        return parts[0] if len(parts) == 1 else torch.cat([p.long() for p in parts], dim=1)
    return torch.cat([p.float() for p in parts], dim=1)


def _outputs(spec: dict[str, Any]) -> int:
    # Specs written before num_outputs (trainflow 0.1.0) name it num_classes.
    return spec["num_outputs"] if "num_outputs" in spec else spec["num_classes"]


def build_model(spec: dict[str, Any]) -> nn.Module:
    """The architecture ``spec`` describes, with fresh weights: what a checkpoint's state
    dict loads into. A user's model needs its module importable here (ConfigError)."""
    kind = spec["kind"]
    outputs = _outputs(spec)
    inputs = {name: s["shape"] for name, s in spec.get("inputs", {}).items()}
    if kind in OWN:
        hidden = spec["hidden_sizes"]
        dropout = spec["dropout"]
        if kind == "mlp":
            net = nn.Sequential(*_mlp(spec["num_features"], hidden, outputs, dropout))
        else:
            net = SmallCNN(spec["image_shape"], spec["channels"], hidden, outputs, dropout)
        # Data of several inputs reaches them joined into their flat rows.
        return Reshaped(net, [spec["num_features"]], inputs) if inputs else net
    if kind.startswith(HF):
        return Reshaped(hf_models.build(spec), spec["input_shape"], inputs, by_name=bool(inputs))
    shape = spec["input_shape"]
    args = spec.get("args", {})
    make = model_kinds.builder(kind)
    if kind.startswith(TORCHVISION):
        net = _call(kind, make, weights=None, num_classes=outputs, **args)
        if shape[0] != 3:
            replace_first_conv(net, shape[0], kind)
    elif spec.get("by_name"):
        net = _call(kind, make, inputs=inputs, num_outputs=outputs, **args)
    else:
        net = _call(kind, make, input_shape=list(shape), num_outputs=outputs, **args)
    return Reshaped(net, shape, inputs, by_name=spec.get("by_name", False))


def _call(kind: str, make, **kwargs) -> nn.Module:
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    name = getattr(make, "__name__", "the builder")
    try:
        net = make(**kwargs)
    except Exception as e:
        raise ConfigError(
            f"model.kind {kind}: {name}({shown}) raised {type(e).__name__}: {_first_line(e)}"
        ) from None
    if not isinstance(net, nn.Module):
        raise ConfigError(
            f"model.kind {kind}: {name}({shown}) returned a {type(net).__name__}, not a torch.nn.Module"
        )
    return net


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def initial_model(spec: dict[str, Any]) -> nn.Module:
    """The model a training run starts from: the architecture, its initial weights
    (``weights_file``, adapted to the data: see :func:`load_weights`) and its frozen
    parameters (``freeze``). Each worker builds it from the spec; the file must be on its
    node (torch's hub cache or the path given), as it is on a single machine. An ``hf:``
    model starts from its pretrained weights, read from its folder on the node."""
    if spec["kind"].startswith(HF):
        inputs = {name: s["shape"] for name, s in spec.get("inputs", {}).items()}
        model = Reshaped(hf_models.pretrained(spec), spec["input_shape"], inputs, by_name=bool(inputs))
    else:
        model = build_model(spec)
    inner = inner_model(model)
    if spec.get("weights_file"):
        state = _read_weights(spec["weights_file"], spec["weights"])
        load_weights(inner, state, spec["weights"], _outputs(spec))
    if spec.get("freeze"):
        freeze(inner, spec["freeze"])
    return model


def inner_model(model: nn.Module) -> nn.Module:
    """The model that names the parameters ``model.freeze`` and weights files speak of."""
    inner = model.net if isinstance(model, Reshaped) else model
    return hf_models.inner(inner) if isinstance(inner, hf_models.HFClassifier) else inner


def _read_weights(path: str, weights: str) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(
            f"model.weights {weights}: {path} is not a state dict torch can load: {_first_line(e)}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"model.weights {weights}: {path} holds no state dict (names to tensors)")
    # A trainflow checkpoint's model.pt names the model inside Reshaped "net.".
    if state and all(k.startswith("net.") for k in state):
        state = {k.removeprefix("net."): v for k, v in state.items()}
    return state


def head(model: nn.Module, outputs: int) -> str | None:
    """The name of the final classifier: the last Linear (or 1x1 Conv2d, as SqueezeNet's)
    that gives ``outputs`` values; None when there is none."""
    found = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == outputs:
            found = name
        elif (
            isinstance(module, nn.Conv2d) and module.out_channels == outputs and module.kernel_size == (1, 1)
        ):
            found = name
    return found


def first_conv(model: nn.Module) -> tuple[str, nn.Conv2d] | None:
    """The first Conv2d a model registers (resnet's conv1, a ViT's conv_proj, the stem of
    mobilenet, efficientnet, convnext...): the one that reads the image."""
    return next(((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)


def replace_first_conv(model: nn.Module, channels: int, kind: str) -> None:
    """Replace the first convolution by one that takes ``channels`` channels, with the
    same hyperparameters (fresh weights; :func:`load_weights` adapts pretrained ones)."""
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


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], weights: str, outputs: int) -> None:
    """Load ``state`` into ``model`` by name. The final classifier of another size than
    the model's keeps its fresh weights (a pretrained head of 1,000 ImageNet classes,
    re-initialised for the data's); a first convolution of other channels is adapted
    (the pretrained filters averaged over their channels). Any other difference fails,
    naming the parameter."""
    own = model.state_dict()
    head_name = head(model, outputs)
    conv = first_conv(model)
    loaded: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key not in own:
            raise ConfigError(f"model.weights {weights}: {key} is not a parameter of the model")
        want = own[key]
        if value.shape == want.shape:
            loaded[key] = value
        elif head_name is not None and key.startswith(f"{head_name}."):
            continue  # the data's classes: the head starts anew
        elif conv is not None and key == f"{conv[0]}.weight" and _same_but_channels(value, want):
            # Each filter's mean over the file's channels, for every channel of the data's.
            loaded[key] = value.mean(dim=1, keepdim=True).expand_as(want) * (value.shape[1] / want.shape[1])
        else:
            raise ConfigError(
                f"model.weights {weights}: {key} has shape {list(value.shape)} there and "
                f"{list(want.shape)} in the model"
            )
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    if missing:
        raise ConfigError(
            f"model.weights {weights}: holds no {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
        )
    model.load_state_dict(loaded, strict=False)


def _same_but_channels(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dim() == b.dim() == 4 and a.shape[0] == b.shape[0] and a.shape[2:] == b.shape[2:]


def freeze(model: nn.Module, prefixes: Sequence[str]) -> int:
    """Keep the parameters under each name prefix (``conv1``, ``layer1``) frozen; returns
    how many values stay frozen. A prefix that names no parameter fails."""
    names = [name for name, _ in model.named_parameters()]
    for prefix in prefixes:
        if not any(n == prefix or n.startswith(f"{prefix}.") for n in names):
            raise ConfigError(
                f"model.freeze {prefix!r} names no parameter of the model; its top-level names: "
                + ", ".join(dict.fromkeys(n.split(".")[0] for n in names))
            )
    frozen = 0
    for name, param in model.named_parameters():
        if any(name == p or name.startswith(f"{p}.") for p in prefixes):
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def _dry_run(model: nn.Module, spec: dict[str, Any]) -> None:
    """One batch through the model in the driver, as training runs it (train mode), so a
    model that cannot take the data's shape or gives the wrong outputs fails here."""
    kind = spec["kind"]
    outputs = _outputs(spec)
    if kind in OWN:
        return
    shape = spec["input_shape"]
    x = dry_batch(spec)
    what = f"{shape[0]}-channel images of {shape[1]}x{shape[2]}" if len(shape) == 3 else f"inputs of {shape}"
    if spec.get("by_name"):
        what = "inputs " + ", ".join(f"{n} {s['shape']} {s['dtype']}" for n, s in spec["inputs"].items())
    try:
        with torch.no_grad():
            y = model.train()(x)
    except Exception as e:
        raise ConfigError(
            f"model.kind {kind}: does not take {what}: {type(e).__name__}: {_first_line(e)}"
        ) from None
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (_DRY_BATCH, outputs):
        got = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ConfigError(
            f"model.kind {kind}: gives {got} for a batch of {_DRY_BATCH}, not [{_DRY_BATCH}, {outputs}] "
            "(a tensor of one row of outputs per input)"
        )


def dry_batch(spec: dict[str, Any]) -> torch.Tensor | dict[str, torch.Tensor]:
    """A batch of zeros as the model of ``spec`` gets its batches: flat floats, or its inputs by name."""
    if not spec.get("inputs"):
        return torch.zeros(_DRY_BATCH, spec["num_features"])
    return {
        name: torch.zeros(_DRY_BATCH, *s["shape"], dtype=getattr(torch, s["dtype"]))
        for name, s in spec["inputs"].items()
    }


def describe_parameters(spec: dict[str, Any]) -> str | None:
    """``11,172,810 of 11,181,642 parameters train``, from the spec's counts."""
    counts = spec.get("parameters")
    if not counts:
        return None
    return f"{counts['trainable']:,} of {counts['total']:,} parameters train"
