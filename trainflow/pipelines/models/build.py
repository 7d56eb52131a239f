"""Models by ``model.kind``, each built by its family's :class:`~.kinds.ModelFamily`
(the table :data:`~.kinds.FAMILIES`): trainflow's own, ``mlp`` and ``cnn``, here
(:data:`OWN_MODELS`); torchvision's and the user's in :mod:`.builders`; Hugging Face's in
:mod:`.hf`.

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
from trainflow.pipelines.data.preprocess import FEATURES, Preprocessor
from trainflow.pipelines.models import kinds as model_kinds

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
    ``inputs`` (:func:`image_shape`, :func:`input_layout`); the classes' names ``classes``
    and a LoRA adapter's settings ``lora`` where the kind's family takes them
    (:meth:`~.kinds.ModelFamily.spec_part`). Builds the model, runs a batch through it and
    counts its parameters: a kind, weights or freeze list that does not fit is a
    ConfigError naming the field."""
    spec: dict[str, Any] = {"kind": cfg.kind, "num_features": num_features, "num_outputs": num_outputs}
    spec.update(
        model_kinds.family(cfg.kind).spec_part(
            cfg, num_features, num_outputs, image_shape=image_shape, inputs=inputs, classes=classes, lora=lora
        )
    )
    inputs = inputs or spec.get("inputs")
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


def image_shape_of(cfg: ModelConfig, num_features: int, image_shape: Sequence[int] | None) -> list[int]:
    """[c, h, w]: model.image_shape, else the image source's, else a square of one channel."""
    shape = cfg.image_shape or (list(image_shape) if image_shape else None)
    if shape is None:
        side = model_kinds.square_side(num_features)
        shape = [1, side, side]
    if len(shape) != 3:
        raise ConfigError(f"model.image_shape {shape}: needs [channels, height, width]")
    check_fits(shape, num_features)
    return list(shape)


def check_fits(shape: Sequence[int], num_features: int) -> None:
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


class Wrapper(nn.Module):
    """A module of trainflow's around the model it holds as ``net``: :class:`Reshaped`, and a
    family's own (hf's around a transformers model). :attr:`holds_adapter` says whether
    ``net`` is an adapter over frozen base weights (:func:`holds_adapter`)."""

    @property
    def holds_adapter(self) -> bool:
        return False


def holds_adapter(model: nn.Module) -> bool:
    """Whether ``model`` holds an adapter over frozen base weights (a LoRA adapter of an
    ``hf:`` model): its checkpoint's ``model.pt`` keeps what trains alone."""
    return any(isinstance(m, Wrapper) and m.holds_adapter for m in model.modules())


class Reshaped(Wrapper):
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


def outputs_of(spec: dict[str, Any]) -> int:
    """The spec's outputs; a spec of trainflow 0.1.0 names them ``num_classes``."""
    return spec["num_outputs"] if "num_outputs" in spec else spec["num_classes"]


def inputs_of(spec: dict[str, Any]) -> dict[str, list[int]]:
    """The spec's inputs by name, each its shape per row; empty for ``features`` alone."""
    return {name: s["shape"] for name, s in spec.get("inputs", {}).items()}


class OwnModels(model_kinds.ModelFamily):
    """``mlp`` and ``cnn``: trainflow's own, their sizes from the config and the data."""

    def spec_part(self, cfg, num_features, num_outputs, *, image_shape, inputs, classes, lora):
        part: dict[str, Any] = {"dropout": cfg.dropout}
        if cfg.kind == "cnn":
            part["image_shape"] = image_shape_of(cfg, num_features, image_shape)
            part["channels"] = list(cfg.channels)
        part["hidden_sizes"] = list(cfg.hidden_sizes)
        return part

    def build(self, spec):
        hidden = spec["hidden_sizes"]
        dropout = spec["dropout"]
        outputs = outputs_of(spec)
        if spec["kind"] == "mlp":
            net = nn.Sequential(*_mlp(spec["num_features"], hidden, outputs, dropout))
        else:
            net = SmallCNN(spec["image_shape"], spec["channels"], hidden, outputs, dropout)
        # Data of several inputs reaches them joined into their flat rows.
        inputs = inputs_of(spec)
        return Reshaped(net, [spec["num_features"]], inputs) if inputs else net


OWN_MODELS = OwnModels()


def build_model(spec: dict[str, Any]) -> nn.Module:
    """The architecture ``spec`` describes, with fresh weights: what a checkpoint's state
    dict loads into. A user's model needs its module importable here (ConfigError)."""
    return model_kinds.family(spec["kind"]).build(spec)


def first_line(e: BaseException) -> str:
    """An exception's message, its first line alone."""
    return (str(e).strip().splitlines() or [""])[0]


def initial_model(spec: dict[str, Any]) -> nn.Module:
    """The model a training run starts from: the architecture, its initial weights
    (``weights_file``, adapted to the data: see :func:`load_weights`) and its frozen
    parameters (``freeze``). Each worker builds it from the spec; the file must be on its
    node (torch's hub cache or the path given), as it is on a single machine. An ``hf:``
    model starts from its pretrained weights, read from its folder on the node."""
    model = model_kinds.family(spec["kind"]).initial(spec)
    inner = inner_model(model, spec["kind"])
    if spec.get("weights_file"):
        state = _read_weights(spec["weights_file"], spec["weights"])
        load_weights(inner, state, spec["weights"], outputs_of(spec))
    if spec.get("freeze"):
        freeze(inner, spec["freeze"])
    return model


def inner_model(model: nn.Module, kind: str) -> nn.Module:
    """The model of ``kind`` that names the parameters ``model.freeze`` and weights files speak of."""
    return model_kinds.family(kind).inner(model.net if isinstance(model, Reshaped) else model)


def _read_weights(path: str, weights: str) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(
            f"model.weights {weights}: {path} is not a state dict torch can load: {first_line(e)}"
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
    outputs = outputs_of(spec)
    if "input_shape" not in spec:  # trainflow's own models, whose sizes come from the data
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
            f"model.kind {kind}: does not take {what}: {type(e).__name__}: {first_line(e)}"
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
