"""A training function of the user's own, ``train.loop: package.module:name``, in place of
trainflow's loop: checked in the driver before any worker starts (:func:`check_loop`),
called on every Ray Train worker as ``fn(config)`` (:func:`user_loop_per_worker`), and its
best checkpoint made trainflow's checkpoint folder (:func:`converted_checkpoint`), which
evaluation, the gate, registration, ``load_model`` and serving take as they take any.

The loop reads what Ray Train's own examples read: ``config`` (:func:`loop_config`:
``epochs``, ``batch_size``, ``lr``, ``seed``, ``train.loop_config``'s keys, and the run's
config, model spec and rows per split under ``"trainflow"``); the splits as
``ray.train.get_dataset_shard("train")`` and ``("val")``; and ``ray.train.report`` with a
folder holding ``model.pt``, the state dict of the model ``model.kind`` builds.
docs/guides/models.md says each in full."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainflow.config import LOOP_RESERVED, LOOP_SETTINGS, ConfigError, PipelineConfig
from trainflow.files import publishing_folder
from trainflow.pipelines.hooks import describe, load_hook
from trainflow.pipelines.models.build import Wrapper, build_model
from trainflow.pipelines.models.checkpoint import METRICS, MODEL, save_checkpoint
from trainflow.pipelines.models.kinds import family
from trainflow.pipelines.training.run_records import local_checkpoint, stored_run_path
from trainflow.pipelines.training.settings import TrainingResult

if TYPE_CHECKING:
    import ray.train

    from trainflow.pipelines.training.progress import Progress
    from trainflow.pipelines.training.settings import TrainSettings

FIELD = "train.loop"
# Prefixes a state dict gains from what wraps the model while it trains: DDP's
# (prepare_model), torch.compile's.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def check_loop(path: str) -> Callable[[dict[str, Any]], Any]:
    """The callable ``path`` names, imported here and taking one argument, the config dict;
    else a ConfigError naming ``train.loop``."""
    fn = load_hook(FIELD, path)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return fn
    try:
        signature.bind({})
    except TypeError:
        name = getattr(fn, "__name__", path.partition(":")[2])
        raise ConfigError(
            f"{FIELD} {path}: {name}{signature} does not take one argument; Ray Train calls it "
            f"with the config dict, as def {name}(config)"
        ) from None
    return fn


def loop_config(settings: TrainSettings) -> dict[str, Any]:
    """The dict the user's loop is called with (see the module's docstring)."""
    config = settings.config
    return {
        **{name: getattr(config.train, name) for name in LOOP_SETTINGS},
        **config.train.loop_config,
        LOOP_RESERVED: {
            **config.model_dump(mode="json"),
            "model_spec": settings.model_spec,
            "rows": settings.split_rows,
        },
    }


def worker_config(settings: TrainSettings) -> dict[str, Any]:
    """What TorchTrainer hands every worker of a run of a user's loop: the loop, its
    config dict and the ProgressLog the driver follows (None: nobody follows). Plain
    JSON: Ray Train's controller unpickles it too."""
    loop = settings.config.train.loop
    return {"loop": loop, "config": loop_config(settings), "progress": settings.progress}


def user_loop_per_worker(worker: dict[str, Any]) -> None:
    """Runs on every Ray Train worker: the user's loop, called with its config dict.
    Returns nothing, whatever the loop returns: Ray Train's controller unpickles what the
    workers return, and never holds a tensor (ray_internals.torch_config)."""
    import ray
    import ray.train

    from trainflow.pipelines.training.loop_reports import last_epoch, read_history
    from trainflow.pipelines.training.progress import ProgressLog

    fn = check_loop(worker["loop"])
    if worker["progress"]:
        # This worker's (re)start, after the epoch of the checkpoint Ray hands back.
        started = last_epoch(read_history(ray.train.get_checkpoint()))
        ctx = ray.train.get_context()
        node = ray.get_runtime_context().get_node_id()
        ProgressLog(worker["progress"], ctx.get_world_rank()).started(node, started, ctx.get_world_size())
    fn(worker["config"])


def without_wrappers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict without the prefixes that wrappers of the model give every name
    (:data:`WRAPPER_PREFIXES`)."""
    state = dict(state)
    stripped = True
    while state and stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if all(key.startswith(prefix) for key in state):
                state = {key.removeprefix(prefix): value for key, value in state.items()}
                stripped = True
    return state


# A transformers model's weights as ``save_pretrained`` writes them, and the folder Ray's
# RayTrainReportCallback copies a Trainer's checkpoint into.
PRETRAINED_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
TRAINER_FOLDER = "checkpoint"
# A PEFT model's save_pretrained folder holds its adapter alone.
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def pretrained_weights(folder: Path) -> Path | None:
    """The weights file of a ``save_pretrained`` folder in a loop's checkpoint: the
    checkpoint itself, or its ``checkpoint/`` (a ``transformers.Trainer``'s, reported by
    Ray's RayTrainReportCallback); None when there is none."""
    for where in (folder, folder / TRAINER_FOLDER):
        for name in PRETRAINED_WEIGHTS:
            if (where / name).is_file():
                return where / name
    return None


def adapter_folder(folder: Path) -> Path | None:
    """The folder of a PEFT adapter in a loop's checkpoint (the checkpoint itself, or its
    ``checkpoint/``) when it holds no whole weights; None otherwise."""
    if (folder / MODEL).is_file() or pretrained_weights(folder) is not None:
        return None
    for where in (folder, folder / TRAINER_FOLDER):
        if (where / ADAPTER_WEIGHTS).is_file():
            return where
    return None


def read_loop_state(folder: Path, path: str) -> dict[str, torch.Tensor]:
    """The state dict in ``model.pt`` of a checkpoint of the loop ``path``, or in the
    weights of a ``save_pretrained`` folder there, its wrappers' prefixes taken off; a
    ConfigError saying what is wrong when there is none."""
    file = folder / MODEL
    if not file.is_file():
        file = pretrained_weights(folder) or file
    if not file.is_file():
        held = ", ".join(sorted(p.name for p in folder.iterdir())[:6]) or "nothing"
        raise ConfigError(
            f"{FIELD} {path}: its checkpoint holds no {MODEL} ({held}); save the model's state "
            f"dict there as Ray's guide does, torch.save(model.module.state_dict(), "
            f"os.path.join(folder, '{MODEL}')), or for model.kind hf: a save_pretrained folder"
        )
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(file)
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"{FIELD} {path}: its checkpoint's {file.name} does not load: {first}") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(
            f"{FIELD} {path}: its checkpoint's {file.name} holds {describe(state)}, not a state dict "
            "(names to tensors, model.state_dict())"
        )
    return without_wrappers(state)


def loop_model(folder: Path, spec: dict[str, Any], path: str) -> nn.Module:
    """The model ``spec`` describes (model.kind's), with the weights of the loop's
    checkpoint ``folder``: the state dict of the model itself or of one it wraps (a
    torchvision, user's or transformers model in Reshaped, a transformers model in
    HFClassifier); an adapter the loop saved (a Trainer of a PEFT model) merged by the
    family into its pretrained weights (:meth:`~.kinds.ModelFamily.adapter_state`). A
    ConfigError naming both when the state dict does not fit the model."""
    adapter = adapter_folder(folder)
    state = family(spec["kind"]).adapter_state(spec, adapter) if adapter else None
    if state is None:
        state = read_loop_state(folder, path)
    model = build_model(spec)
    # trainflow's wrappers (build.Wrapper: Reshaped around a torchvision, user's or
    # transformers model, HFClassifier around the transformers model) each hold what they
    # wrap as ``net``: the loop's state dict is that of the one whose names it shares most.
    chain = [model]
    while isinstance(chain[-1], Wrapper):
        chain.append(chain[-1].net)
    target = max(chain, key=lambda m: len(state.keys() & m.state_dict().keys()))
    own = target.state_dict()
    problems = [
        *(f"{key} missing" for key in own if key not in state),
        *(f"{key} not in the model" for key in state if key not in own),
        *(
            f"{key} {list(state[key].shape)} where the model has {list(own[key].shape)}"
            for key in state
            if key in own and state[key].shape != own[key].shape
        ),
    ]
    if problems:
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise ConfigError(
            f"{FIELD} {path}: its checkpoint's {MODEL} does not fit the model model.kind {spec['kind']} "
            f"builds: {'; '.join(problems[:3])}{more}"
        )
    target.load_state_dict(state)
    return model


def converted_checkpoint(folder: str, settings: TrainSettings, metrics: dict[str, Any]) -> str:
    """trainflow's checkpoint folder (model.pt of model.kind's model, model.json,
    preprocessor.json, config.json and ``metrics``, with their history) made of the user's
    loop's checkpoint ``folder``; written whole once, beside it, as ``trainflow-<its name>``."""
    source = Path(folder)
    out = source.with_name(f"trainflow-{source.name}")
    model = loop_model(source, settings.model_spec, settings.config.train.loop)
    with publishing_folder(out, finished=lambda p: (p / METRICS).is_file()) as tmp:
        save_checkpoint(
            tmp,
            model=model,
            spec=settings.model_spec,
            preprocessor=settings.preprocessor,
            config=settings.config.model_dump(mode="json"),
            metrics=metrics,
        )
    return str(out)


def required_metric(config: PipelineConfig) -> bool:
    """Whether the config names its checkpoint.metric, which a user's loop must then report
    with each checkpoint; one left at its default the loop need not know."""
    return "metric" in config.checkpoint.model_fields_set


def worker_function(
    settings: TrainSettings, storage: str, run_name: str, callbacks: Sequence[Any]
) -> tuple[Callable[[dict], Any], dict[str, Any], list[Any]]:
    """What every worker of the run ``run_name`` under ``storage`` runs, with what: the
    user's loop and its config dict, its reports followed from the controller
    (:class:`~.loop_reports.LoopReports`) besides ``callbacks``."""
    # Here, not at the top: the module's base class, Ray Train's, is slow to import.
    from trainflow.pipelines.training.loop_reports import LoopReports, resumed_history

    config = settings.config
    required = (config.train.loop, config.checkpoint.metric) if required_metric(config) else None
    reports = LoopReports(settings.progress, resumed_history(storage, run_name), required)
    return user_loop_per_worker, worker_config(settings), [*callbacks, reports]


def training_result(
    result: ray.train.Result,
    settings: TrainSettings,
    *,
    storage: str,
    run_name: str,
    seen: Progress,
    in_memory: tuple[str, ...] = (),
) -> TrainingResult:
    """What came of the fit of a user's loop (``train.loop``): its best checkpoint by
    checkpoint.metric, converted to trainflow's checkpoint folder, with the history the
    run's checkpoints keep (:mod:`.loop_reports`). ConfigError, in one line, when the loop
    reported no checkpoint, or none with a checkpoint.metric the config names; with the
    metric left at its default, the latest checkpoint, and a warning saying so."""
    from trainflow.pipelines.training.loop_reports import LoopHistory, missing_metric, read_history

    config = settings.config
    run_path = stored_run_path(storage, run_name, result)
    loop = config.train.loop
    metric = config.checkpoint.metric
    if not result.best_checkpoints:
        raise ConfigError(
            f"train.loop {loop}: reported no checkpoint; report one as Ray's guide does, "
            "ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder)) "
            "with the model's state dict saved in that folder as model.pt"
        )
    reported = [m for _, m in result.best_checkpoints]
    named = ", ".join(sorted(reported[-1])) or "none"
    if any(metric in m for m in reported):
        best = result.get_best_checkpoint(metric, config.checkpoint.mode)
    elif required_metric(config):  # (LoopReports stops such a run at its first checkpoint)
        raise missing_metric(loop, metric, reported[-1])
    else:  # left at its default, which the loop need not know: the latest, as Ray keeps it
        logging.getLogger("trainflow").warning(
            "train.loop %s reports no %s (checkpoint.metric's default): its latest checkpoint is "
            "kept; set checkpoint.metric to one it reports (%s) to keep its best",
            loop,
            metric,
            named,
        )
        best = result.checkpoint
    best_reported = next(m for c, m in result.best_checkpoints if c.path == best.path)
    # The epochs up to the best checkpoint, as it keeps them; a checkpoint without them
    # (its controller stopped before it wrote them) counts as its own first epoch.
    history = (read_history(best) or {}).get("history") or [LoopHistory().add(best_reported)]
    folder = converted_checkpoint(local_checkpoint(best), settings, {**history[-1], "history": history})
    everything = (read_history(result.checkpoint) or {}).get("history") or history
    return TrainingResult(
        run_path=run_path,
        best_checkpoint=folder,
        best_metrics=dict(history[-1]),
        history=everything,
        status="completed",
        epoch=everything[-1]["epoch"],
        message="",
        starts=seen.starts,
        nodes=seen.nodes,
        sizes=seen.sizes,
    )
