"""``model.kind: hf:<model id or folder>``: a pretrained Hugging Face transformers model,
fine-tuned for the run's objective with a head sized from the data (``id2label`` names the
classes; a regression has one output): a sequence classifier on the tokenizer's inputs,
an image classifier on images prepared as its image processor says (:func:`image_processing`).

The model's spec holds its transformers config as a dict, so a checkpoint rebuilds the
architecture from ``model.json`` alone (:func:`build`) and its ``model.pt`` loads into it;
only a run's start reads the pretrained weights (:func:`pretrained`), from the folder
:func:`~trainflow.pipelines.hf_hub.resolve` found. With ``train.lora`` the model is wrapped
by PEFT's LoRA (:func:`with_lora`): only the adapter and the head train.

:data:`HF_MODELS` is the hf family's row of the table in :mod:`.kinds`: what building,
checkpoints (the adapter alone, merged when loaded) and image preprocessing ask of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainflow.config import ConfigError
from trainflow.pipelines.hf_hub import model_folder, quiet
from trainflow.pipelines.models import kinds as model_kinds
from trainflow.pipelines.models.build import Reshaped, Wrapper, image_shape_of, inputs_of


class HFClassifier(Wrapper):
    """A transformers classifier (or regressor) called with its inputs by name
    (``input_ids``, ``attention_mask``, ...), or with a batch of images as its
    ``pixel_values``; returns its logits."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    @property
    def holds_adapter(self) -> bool:
        return has_adapter(self.net)

    def forward(self, inputs: dict[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        if isinstance(inputs, torch.Tensor):
            return self.net(pixel_values=inputs).logits
        return self.net(**inputs).logits


def _auto_class(part: dict[str, Any]):
    import transformers

    if part.get("input") == "images":
        return transformers.AutoModelForImageClassification
    return transformers.AutoModelForSequenceClassification


def image_processing(kind: str) -> dict[str, list]:
    """What the image processor of ``model.kind: hf:...`` does to an image, as the
    preprocess fields that do it: ``image_size`` (its size, or its crop where it crops)
    and ``image_mean``/``image_std`` (0 and 1 where it does not normalize); from its
    ``preprocessor_config.json``, else the size alone from the model's ``image_size``."""
    folder = Path(source(kind))
    model = json.loads((folder / "config.json").read_text())
    found: dict[str, list] = {}
    processor = folder / "preprocessor_config.json"
    if processor.is_file():
        settings = json.loads(processor.read_text())
        size = settings.get("crop_size") if settings.get("do_center_crop") else settings.get("size")
        if isinstance(size, int):
            found["image_size"] = [size, size]
        elif isinstance(size, dict) and "height" in size:
            found["image_size"] = [size["height"], size["width"]]
        elif isinstance(size, dict) and "shortest_edge" in size:
            found["image_size"] = [size["shortest_edge"]] * 2
        if not settings.get("do_normalize", True):
            channels = model.get("num_channels", 3)
            found["image_mean"] = [0.0] * channels
            found["image_std"] = [1.0] * channels
        elif settings.get("image_mean") is not None:
            found["image_mean"] = settings["image_mean"]
            found["image_std"] = settings["image_std"]
    if "image_size" not in found and isinstance(model.get("image_size"), int):
        found["image_size"] = [model["image_size"]] * 2
    return found


def source(kind: str) -> str:
    """The folder of ``model.kind: hf:...``, resolved (ConfigError when it is not there)."""
    return model_folder(kind)


def spec_part(
    kind: str, args: dict[str, Any], num_outputs: int, classes: list | None, images: bool = False
) -> dict[str, Any]:
    """``{"source": folder, "config": the model's config dict}``: the pretrained config with
    the head sized for ``num_outputs`` (its classes' names as ``id2label``) and ``args``;
    ``"input": "images"`` for an image classifier."""
    from transformers import AutoConfig

    folder = source(kind)
    names = [str(c) for c in classes] if classes else [f"LABEL_{i}" for i in range(num_outputs)]
    problem = "single_label_classification" if classes else "regression"
    try:
        with quiet():
            config = AutoConfig.from_pretrained(
                folder,
                num_labels=num_outputs,
                id2label=dict(enumerate(names)),
                label2id={n: i for i, n in enumerate(names)},
                problem_type=problem,
                **args,
            )
    except Exception as e:
        raise ConfigError(f"model.kind {kind}: its config does not load: {type(e).__name__}: {e}") from None
    values = config.to_dict()
    values["id2label"] = {str(i): name for i, name in values["id2label"].items()}  # JSON's keys
    return {"source": folder, "config": values, **({"input": "images"} if images else {})}


def _config(part: dict[str, Any]):
    from transformers import AutoConfig

    values = dict(part["config"])
    return AutoConfig.for_model(values.pop("model_type"), **values)


def build(spec: dict[str, Any]) -> nn.Module:
    """The architecture with fresh weights (a checkpoint's state dict loads into it)."""
    with quiet():
        net = _auto_class(spec["hf"]).from_config(_config(spec["hf"]))
    return with_lora(net, spec.get("lora"), spec["hf"])


def pretrained(spec: dict[str, Any]) -> nn.Module:
    """The model a run starts from: the pretrained weights, a head of the data's size."""
    part = spec["hf"]
    what = "an image classifier" if part.get("input") == "images" else "a sequence classifier"
    try:
        with quiet():
            net = _auto_class(part).from_pretrained(part["source"], config=_config(part))
    except Exception as e:
        raise ConfigError(
            f"model.kind {spec['kind']}: {part['source']} does not load as {what}: "
            f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        ) from None
    return with_lora(net, spec.get("lora"), part)


def with_lora(net: nn.Module, lora: dict[str, Any] | None, part: dict[str, Any]) -> nn.Module:
    """``net`` under a LoRA adapter of these settings (PEFT), or as it is. The head trains
    beside the adapter: PEFT's sequence-classification task keeps it so; an image
    classifier names it (``classifier``) among the modules PEFT saves whole."""
    if not lora:
        return HFClassifier(net)
    from peft import LoraConfig, TaskType, get_peft_model

    images = part.get("input") == "images"
    config = LoraConfig(
        task_type=None if images else TaskType.SEQ_CLS,
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora.get("target_modules"),
        modules_to_save=[_head_name(net)] if images else None,
    )
    try:
        with quiet():
            return HFClassifier(get_peft_model(net, config))
    except ValueError as e:
        if lora.get("target_modules") is None and "target_modules" in str(e):
            linear = {name.rpartition(".")[2] for name, m in net.named_modules() if isinstance(m, nn.Linear)}
            raise ConfigError(
                "train.lora.target_modules: PEFT has no default for model type "
                f"{part['config']['model_type']}; name the layers to adapt among its linear ones: "
                + ", ".join(sorted(linear - {_head_name(net)}))
            ) from None
        raise ConfigError(f"train.lora: {str(e).strip().splitlines()[0]}") from None


def _head_name(net: nn.Module) -> str:
    """The last Linear layer's name: an image classifier's head (``classifier``)."""
    return [name for name, module in net.named_modules() if isinstance(module, nn.Linear)][-1]


def has_adapter(model: nn.Module) -> bool:
    """Whether ``model`` holds a LoRA adapter (PEFT's ``lora_`` parameters)."""
    return any("lora_" in name for name, _ in model.named_parameters())


def is_adapter_state(spec: dict[str, Any], state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state``, of a model of ``spec``, holds a LoRA adapter without the base
    weights it adapts (PEFT keeps those as ``base_layer``)."""
    return bool(spec.get("lora")) and not any(".base_layer." in name for name in state)


def adapter_state(spec: dict[str, Any], folder: Path) -> dict[str, torch.Tensor]:
    """The state dict of the transformers model ``spec`` describes, from its pretrained
    weights with the PEFT adapter saved in ``folder`` (``adapter_model.safetensors``, as a
    ``transformers.Trainer`` of a PEFT model saves it) merged in, its head among them."""
    from peft import PeftModel

    part = spec["hf"]
    with quiet():
        net = _auto_class(part).from_pretrained(part["source"], config=_config(part))
        merged = PeftModel.from_pretrained(net, str(folder)).merge_and_unload()
    return merged.state_dict()


def merge_lora(model: nn.Module) -> nn.Module:
    """``model`` with each LoRA adapter merged into its base weights (``train.lora.merge``):
    one plain transformers model, without the adapter's extra steps at prediction."""
    for module in model.modules():
        if isinstance(module, HFClassifier) and hasattr(module.net, "merge_and_unload"):
            module.net = module.net.merge_and_unload()
    return model


def inner(model: nn.Module) -> nn.Module:
    """The transformers model under its wrappers, whose names ``model.freeze`` speaks of."""
    net = model.net if isinstance(model, HFClassifier) else model
    return net.get_base_model() if hasattr(net, "get_base_model") else net


class HFModels(model_kinds.ModelFamily):
    """``hf:<model id or folder>``: a pretrained transformers classifier in
    :class:`~.build.Reshaped`, its inputs by name (the tokenizer's) or the images."""

    def spec_part(self, cfg, num_features, num_outputs, *, image_shape, inputs, classes, lora):
        if image_shape is not None:
            part: dict[str, Any] = {"input_shape": image_shape_of(cfg, num_features, image_shape)}
        elif inputs:
            part = {"input_shape": [num_features], "by_name": True}
        else:
            raise ConfigError(
                f"model.kind {cfg.kind}: takes a text column through preprocess.tokenizer "
                "(such as {column: text, max_length: 128}), or images"
            )
        part["hf"] = spec_part(cfg.kind, cfg.args, num_outputs, classes, images=image_shape is not None)
        return {**part, "lora": lora} if lora else part

    def build(self, spec):
        inputs = inputs_of(spec)
        return Reshaped(build(spec), spec["input_shape"], inputs, by_name=bool(inputs))

    def initial(self, spec):
        inputs = inputs_of(spec)
        return Reshaped(pretrained(spec), spec["input_shape"], inputs, by_name=bool(inputs))

    def inner(self, net):
        return inner(net)

    def adapter_alone(self, spec, state):
        return is_adapter_state(spec, state)

    def loaded(self, model, spec):
        return merge_lora(model) if (spec.get("lora") or {}).get("merge") else model

    def adapter_state(self, spec, folder):
        return adapter_state(spec, folder)

    def image_processing(self, kind):
        return image_processing(kind)


HF_MODELS = HFModels()
