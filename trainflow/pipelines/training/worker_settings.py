"""What one training run's workers are given, from its config and prepared splits: their
:class:`~.settings.TrainSettings` and a Dataset for each streamed split
(:func:`trainer_inputs`), the folder of mid-epoch saves, the name of the progress rows the
driver follows, and the ``plan`` row logged before the workers start."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from trainflow.config import ConfigError, PipelineConfig
from trainflow.files import redacted
from trainflow.pipelines.models.build import describe_parameters
from trainflow.pipelines.training.inputs import TRAIN_SPLITS, split_inputs, splits_in_memory
from trainflow.pipelines.training.progress import clear_progress
from trainflow.pipelines.training.resume import step_folder
from trainflow.pipelines.training.run_records import newest_checkpoint
from trainflow.pipelines.training.settings import PreparedSplits, TrainSettings, balanced_class_weights

if TYPE_CHECKING:
    import ray.data


def trainer_inputs(
    config: PipelineConfig,
    prepared: PreparedSplits,
    *,
    run_name: str,
    storage: str,
    follow: bool,
    placements: str | None,
    start_from: tuple[str, int] | None = None,
) -> tuple[TrainSettings, dict[str, ray.data.Dataset] | None, tuple[str, ...]]:
    """What the trainer of a run of ``config`` on ``prepared`` is given: the workers'
    settings and a Dataset for each streamed split (None when none streams); with the
    names of the splits the workers hold in memory. ``follow``: the workers write
    progress rows, to a :class:`~.progress.ProgressLog` of this call's own. A loop of the
    user's own is checked here, and reads every split from its Ray Data shard."""
    if config.train.loop:
        from trainflow.pipelines.training.user_loop import check_loop

        check_loop(config.train.loop)
    in_memory = () if config.train.loop else splits_in_memory(config, prepared.path)
    memory_splits, datasets = split_inputs(
        prepared.path, in_memory=in_memory, preprocessor=prepared.preprocessor
    )
    progress = new_progress_name(run_name) if follow else None
    settings = TrainSettings.from_config(
        config,
        preprocessor=prepared.preprocessor,
        num_features=prepared.num_features,
        num_outputs=prepared.num_outputs,
        memory_splits=memory_splits,
        class_weights=(
            balanced_class_weights(prepared.path, prepared.num_outputs)
            if config.train.class_weights == "balanced"
            else None
        ),
        split_rows=prepared.counts,
        progress=progress,
        placements=placements,
        resume_from=max(
            filter(None, (newest_checkpoint(storage, run_name), start_from)), key=lambda c: c[1], default=None
        ),
        step_folder=steps_of(config, storage, run_name),
    )
    return settings, datasets, in_memory


def steps_of(config: PipelineConfig, storage: str, run_name: str) -> str | None:
    """The folder of the run's mid-epoch saves (``checkpoint.every_n_steps``, and the save
    when a node is being preempted); None when neither can save, or on a storage bucket,
    where they have no folder: ConfigError there when every_n_steps is set."""
    if config.checkpoint.every_n_steps is None and not config.checkpoint.preemption_check_steps:
        return None
    folder = step_folder(storage, run_name)
    if folder is None and config.checkpoint.every_n_steps is not None:
        raise ConfigError(
            f"checkpoint.every_n_steps keeps its saves in the run's folder, and storage {redacted(storage)} "
            "is a bucket: use a folder every node sees (a shared mount), or leave every_n_steps unset"
        )
    return folder


def new_progress_name(run_name: str) -> str:
    """The name of the progress rows of one call of the run ``run_name``: unique, so that a
    retry does not read the last attempt's rows. Rows that a killed driver of this run left
    on the cluster (its follower never deleted them) are deleted first."""
    clear_progress(f"trainflow-progress-{run_name}-")
    return f"trainflow-progress-{run_name}-{uuid.uuid4().hex[:8]}"


def plan_row(settings: TrainSettings, in_memory: tuple[str, ...], run_path: str) -> dict[str, Any]:
    """The ``plan`` row ``on_row`` gets before the workers start: the splits held in memory
    and those streamed, where the run is stored, the model's parameters, the loss and the
    class weights."""
    return {
        "kind": "plan",
        "in_memory": list(in_memory),
        "streamed": [name for name in TRAIN_SPLITS if name not in in_memory],
        "run_path": run_path,
        "parameters": describe_parameters(settings.model_spec),
        "loss": settings.config.loss,
        "class_weights": settings.class_weights,
        **({"loop": settings.config.train.loop} if settings.config.train.loop else {}),
    }
