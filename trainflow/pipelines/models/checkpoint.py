"""The self-describing checkpoint folder, and the predictor it loads into.

``model.pt`` (a state_dict, loaded with ``weights_only=True``), ``model.json`` (the
architecture spec), ``preprocessor.json``, ``config.json`` and ``metrics.json``;
``train_state.pt`` adds the optimizer and epoch so a run can resume. Loading needs
trainflow and the folder, nothing pickled with code in it; for a user's model or
``preprocess.transform``, its module too (:func:`user_modules`).

Under an adapter (``train.lora``), a training checkpoint's ``model.pt`` holds what trains
alone, the adapter and the head (:func:`model_state`), and loads onto the pretrained base
the model's family reads (:meth:`~.kinds.ModelFamily.initial`); a registered version holds
the whole state dict (:func:`complete_weights`), so it loads where the base model is not.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from trainflow.pipelines.data import tokenizer
from trainflow.pipelines.data import transform as transforms
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.models.build import build_model, holds_adapter, initial_model
from trainflow.pipelines.models.kinds import family

log = logging.getLogger("trainflow")

MODEL = "model.pt"
SPEC = "model.json"
PREPROCESSOR = "preprocessor.json"
CONFIG = "config.json"
METRICS = "metrics.json"
TRAIN_STATE = "train_state.pt"
REQUIRED = (MODEL, SPEC, PREPROCESSOR, CONFIG, METRICS)


def _unwrap(model: nn.Module) -> nn.Module:
    # DistributedDataParallel keeps the real model in .module (a user's model may have a
    # .module of its own).
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def save_checkpoint(
    folder: str | Path,
    *,
    model: nn.Module,
    spec: dict[str, Any],
    preprocessor: dict[str, Any],
    config: dict[str, Any],
    metrics: dict[str, Any] | str,
    train_state: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint folder ``folder``; ``metrics`` as a dict, or as the text of
    ``metrics.json`` (:func:`metrics_json`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    transform = preprocessor.get("transform")
    if transform and tokenizer.is_reference(transform["path"]):
        # The tokenizer goes with the model, named relative to the folder.
        saved = {**transform, "path": tokenizer.saved(transform["path"], folder)}
        preprocessor = {**preprocessor, "transform": saved}
    torch.save(model_state(model), folder / MODEL)
    for name, value in ((SPEC, spec), (PREPROCESSOR, preprocessor), (CONFIG, config)):
        (folder / name).write_text(json.dumps(value, indent=2))
    (folder / METRICS).write_text(metrics if isinstance(metrics, str) else metrics_json(metrics))
    if train_state is not None:
        torch.save(train_state, folder / TRAIN_STATE)
    return folder


def metrics_json(metrics: dict[str, Any], encoded_rows: list[str] | None = None) -> str:
    """``metrics.json``'s text: a key per line, each row of the ``history`` (every epoch so
    far) on a line of its own. ``encoded_rows``: the history's rows encoded for an earlier
    epoch's checkpoint of the same run, extended here with the new ones; a loop that keeps
    it encodes each row once, and a long run's late checkpoints cost what its first do."""
    lines = []
    for key, value in metrics.items():
        if key == "history" and isinstance(value, list) and value:
            rows = encoded_rows if encoded_rows is not None else []
            if len(rows) > len(value):  # another run's rows
                rows.clear()
            rows.extend(json.dumps(row) for row in value[len(rows) :])
            body = ",\n    ".join(rows)
            lines.append(f'  "history": [\n    {body}\n  ]')
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}" if lines else "{}"


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """What ``model.pt`` holds of ``model``: its state dict; under an adapter
    (:func:`~.build.holds_adapter`), only the entries that train (the adapter's and the
    head's), as the base weights are the pretrained ones."""
    model = _unwrap(model)
    state = model.state_dict()
    if not holds_adapter(model):
        return state
    trains = {name for name, p in model.named_parameters() if p.requires_grad}
    return {name: value for name, value in state.items() if name in trains}


def model_with_state(spec: dict[str, Any], state: dict[str, torch.Tensor]) -> nn.Module:
    """The model of ``spec`` holding ``state``: a whole state dict loads into the bare
    architecture; an adapter's alone onto the pretrained base its family reads."""
    if not family(spec["kind"]).adapter_alone(spec, state):
        model = build_model(spec)
        model.load_state_dict(state)
        return model
    model = initial_model(spec)
    unexpected = model.load_state_dict(state, strict=False).unexpected_keys
    if unexpected:
        raise ValueError(f"the adapter's state holds {', '.join(unexpected[:3])}: not the model's parameters")
    return model


def complete_weights(folder: str | Path) -> None:
    """Make the checkpoint's ``model.pt`` the whole state dict where it holds an adapter
    alone: base and adapter, unmerged (a registered version loads without the base)."""
    folder = Path(folder)
    spec = read_json(folder, SPEC)
    if not spec.get("lora"):
        return
    state = torch.load(folder / MODEL, map_location="cpu", weights_only=True)
    if family(spec["kind"]).adapter_alone(spec, state):
        tmp = folder / f".{MODEL}.tmp"
        torch.save(model_with_state(spec, state).state_dict(), tmp)
        tmp.replace(folder / MODEL)


def read_json(folder: str | Path, name: str) -> Any:
    return json.loads((Path(folder) / name).read_text())


@dataclass
class Predictor:
    """A trained model with the preprocessing it was trained with."""

    model: nn.Module
    spec: dict[str, Any]
    preprocessor: Preprocessor
    config: dict[str, Any]
    metrics: dict[str, Any]
    path: Path
    version: str | None = None  # the registered version it was loaded from, if any

    @property
    def classes(self) -> list[Any]:
        """The classes, in the order of the model's outputs; empty for a regression."""
        return self.preprocessor.classes

    @property
    def objective(self) -> str:
        """classification or regression."""
        return self.preprocessor.objective

    @property
    def task(self) -> str:
        """The old name of :attr:`objective`, still answered in this release."""
        return self.objective

    @torch.inference_mode()
    def predict_logits(self, features: np.ndarray | dict[str, np.ndarray]) -> np.ndarray:
        """The model's outputs for prepared inputs: ``features``, or every input by name."""
        device = next(self.model.parameters()).device  # a batch-predict actor may hold it on a GPU
        if isinstance(features, dict):
            x = {name: _tensor(v).to(device) for name, v in features.items()}
        else:
            x = _tensor(features).to(device)
        return self.model(x).cpu().numpy()

    def predict_proba(self, frame: pd.DataFrame) -> np.ndarray:
        """Class probabilities, one column per entry of ``classes``, for raw rows."""
        if self.preprocessor.is_regression:
            raise ValueError("a regression model predicts numbers, not class probabilities; use predict")
        logits = self.predict_logits(self.preprocessor.model_inputs(frame))
        return torch.softmax(torch.from_numpy(logits), dim=1).numpy()

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """For raw rows, the predicted class value (as the label column holds it), or for a
        regression the predicted number in the label's units."""
        return self._predictions(self.predict_logits(self.preprocessor.model_inputs(frame)))

    def predict_with_proba(
        self, frame: pd.DataFrame | dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``predict`` and ``predict_proba`` from one pass of the model (None for a
        regression's probabilities): what an online answer needs, computed once."""
        outputs = self.predict_logits(self.preprocessor.model_inputs(frame))
        if self.preprocessor.is_regression:
            return self._predictions(outputs), None
        return self._predictions(outputs), torch.softmax(torch.from_numpy(outputs), dim=1).numpy()

    def _predictions(self, outputs: np.ndarray) -> np.ndarray:
        if self.preprocessor.is_regression:
            return self.preprocessor.unscale(outputs.reshape(-1))
        return np.asarray(self.classes)[outputs.argmax(axis=1)]


def _tensor(values: np.ndarray) -> torch.Tensor:
    """Prepared inputs as a tensor: integers as they are (token ids), anything else float32."""
    arr = np.asarray(values)
    if arr.dtype == object:  # a tensor column as Ray Data hands it: an array per row
        arr = np.stack(arr)
    if arr.dtype.kind not in "iu":
        arr = arr.astype(np.float32, copy=False)
    return torch.from_numpy(np.ascontiguousarray(arr))


def model_actor_options(checkpoint_dir: str) -> dict[str, Any]:
    """The Ray actor options that let an actor load the checkpoint's model and apply its
    preprocessing: the user's modules they need (:func:`user_modules`) shipped as
    runtime_env ``py_modules``, which the cluster's workers need not have."""
    from trainflow.cluster.session import worker_runtime_env

    env = worker_runtime_env(user_modules(checkpoint_dir))
    return {"runtime_env": env} if env else {}


def user_modules(checkpoint_dir: str) -> list[str]:
    """The modules of the user's code a checkpoint needs to be loaded and used: its
    model's (``model.kind: package.module:callable``) and its transform's
    (``preprocess.transform``)."""
    from trainflow.config import user_module_of

    modules = [user_module_of(read_json(checkpoint_dir, SPEC)["kind"])]
    transform = read_json(checkpoint_dir, PREPROCESSOR).get("transform")
    if transform and not tokenizer.is_reference(transform["path"]):
        modules.append(transform["path"].partition(":")[0])
    return list(dict.fromkeys(m for m in modules if m))


def check_transform(pre: Preprocessor, folder: Path) -> None:
    """The checkpoint's transform imports here (ConfigError naming it if not), and a
    warning when its module's code is not what the model was trained with."""
    if not pre.transform:
        return
    path = pre.transform["path"]
    if transforms.code_hash(path) != pre.transform["hash"]:
        log.warning(
            "%s %s: its module's code differs from the one the model at %s was trained with; "
            "predictions go through the code here",
            transforms.FIELD,
            path,
            folder,
        )


def load_checkpoint(folder: str | Path) -> Predictor:
    folder = Path(folder)
    missing = [name for name in REQUIRED if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {folder}: missing {', '.join(missing)}")
    spec = read_json(folder, SPEC)
    model = model_with_state(spec, torch.load(folder / MODEL, map_location="cpu", weights_only=True))
    model = family(spec["kind"]).loaded(model, spec)
    model.eval()
    pre = Preprocessor.load(folder / PREPROCESSOR)
    check_transform(pre, folder)
    return Predictor(
        model=model,
        spec=spec,
        preprocessor=pre,
        config=read_json(folder, CONFIG),
        metrics=read_json(folder, METRICS),
        path=folder,
    )
