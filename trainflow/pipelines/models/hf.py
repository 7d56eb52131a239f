"""``model.kind: hf:<model id or folder>``: a pretrained Hugging Face transformers model,
fine-tuned for the run's task with a head sized from the data (``id2label`` names the
classes; a regression has one output).

The model's spec holds its transformers config as a dict, so a checkpoint rebuilds the
architecture from ``model.json`` alone (:func:`build`) and its ``model.pt`` loads into it;
only a run's start reads the pretrained weights (:func:`pretrained`), from the folder
:func:`~trainflow.pipelines.hf_hub.resolve` found. With ``train.lora`` the model is wrapped
by PEFT's LoRA (:func:`with_lora`): only the adapter and the head train.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainflow.config import ConfigError
from trainflow.config.training import HF
from trainflow.pipelines.hf_hub import quiet, resolve


class HFClassifier(nn.Module):
    """A transformers model for sequence classification called with its inputs by name
    (``input_ids``, ``attention_mask``, ...); returns its logits."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.net(**inputs).logits


def source(kind: str) -> str:
    """The folder of ``model.kind: hf:...``, resolved (ConfigError when it is not there)."""
    return resolve(kind.removeprefix(HF), "model.kind", HF)


def spec_part(kind: str, args: dict[str, Any], num_outputs: int, classes: list | None) -> dict[str, Any]:
    """``{"source": folder, "config": the model's config dict}``: the pretrained config with
    the head sized for ``num_outputs`` (its classes' names as ``id2label``) and ``args``."""
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
    return {"source": folder, "config": values}


def _config(part: dict[str, Any]):
    from transformers import AutoConfig

    values = dict(part["config"])
    return AutoConfig.for_model(values.pop("model_type"), **values)


def build(spec: dict[str, Any]) -> nn.Module:
    """The architecture with fresh weights (a checkpoint's state dict loads into it)."""
    from transformers import AutoModelForSequenceClassification

    with quiet():
        net = AutoModelForSequenceClassification.from_config(_config(spec["hf"]))
    return with_lora(net, spec.get("lora"))


def pretrained(spec: dict[str, Any]) -> nn.Module:
    """The model a run starts from: the pretrained weights, a head of the data's size."""
    from transformers import AutoModelForSequenceClassification

    part = spec["hf"]
    try:
        with quiet():
            net = AutoModelForSequenceClassification.from_pretrained(part["source"], config=_config(part))
    except Exception as e:
        raise ConfigError(
            f"model.kind {spec['kind']}: {part['source']} does not load as a sequence classifier: "
            f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        ) from None
    return with_lora(net, spec.get("lora"))


def with_lora(net: nn.Module, lora: dict[str, Any] | None) -> nn.Module:
    """``net`` under a LoRA adapter of these settings (PEFT), or as it is."""
    if not lora:
        return HFClassifier(net)
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora.get("target_modules"),
    )
    try:
        with quiet():
            return HFClassifier(get_peft_model(net, config))
    except ValueError as e:
        raise ConfigError(f"train.lora: {str(e).strip().splitlines()[0]}") from None


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
