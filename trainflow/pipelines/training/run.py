"""One training run, assembled in one place: :func:`run_training` hands a prepared entry's
train and val splits to a TorchTrainer running :func:`~.loop.train_loop_per_worker` with
the run's :class:`~.settings.TrainSettings`, or the user's own loop (``train.loop``; the
:data:`LOOPS` table names the module of each), and returns what came of it; with
``scaling.num_workers: 0``, the loop runs in this process instead (:mod:`.in_process`).
The train task runs it once per flow run; a sweep, once per trial.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
from collections.abc import Callable, Collection, Sequence
from contextlib import nullcontext
from types import ModuleType
from typing import TYPE_CHECKING, Any

from trainflow import ray_internals
from trainflow.cluster.session import started_local_cluster, worker_runtime_env
from trainflow.config import ConfigError, PipelineConfig
from trainflow.files import join, redacted
from trainflow.pipelines.data import profile as profiles
from trainflow.pipelines.data.schema import DataError
from trainflow.pipelines.models.checkpoint import METRICS, read_json
from trainflow.pipelines.sweep.trials import TuneReports
from trainflow.pipelines.training.in_process import best_kept, run_folder
from trainflow.pipelines.training.loop import train_loop_per_worker
from trainflow.pipelines.training.progress import Progress, follow_progress
from trainflow.pipelines.training.run_records import local_checkpoint, newest_checkpoint, stored_run_path
from trainflow.pipelines.training.settings import (
    SETTINGS,
    Outcome,
    PreparedSplits,
    TrainingResult,
    TrainSettings,
)
from trainflow.pipelines.training.worker_settings import plan_row, trainer_inputs
from trainflow.ray_internals.errors import worker_error
from trainflow.signals import stop_on_signals
from trainflow.timeline import timeline

if TYPE_CHECKING:
    import ray.data
    import ray.train
    from ray.train.torch import TorchTrainer


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: training again with the same settings would too."""


# What the workers run, by ``train.loop``: trainflow's own loop, or a user's. Each module
# defines the driver's side of its loop: ``worker_function`` (what the workers run, with
# what) and ``training_result`` (what came of the fit).
LOOPS = {"trainflow": __name__, "user": "trainflow.pipelines.training.user_loop"}


def loop_of(config: PipelineConfig) -> ModuleType:
    """The :data:`LOOPS` module of the config's loop, imported when a run uses it."""
    return importlib.import_module(LOOPS["user" if config.train.loop else "trainflow"])


def expected_worker_error(error: Exception) -> Exception | None:
    """The error every failed worker of a Ray Train failure raised, when it is one that
    trainflow raises for a user to act on (a ConfigError: a model that does not build on
    the workers, a module they cannot import; a DataError), to report in one line as the
    driver would have; None for anything else."""
    failures = getattr(error, "worker_failures", None) or {}
    raised = [worker_error(failure) for failure in failures.values()]
    if not raised or not all(isinstance(e, (ConfigError, DataError)) for e in raised):
        return None
    try:
        return type(raised[0])(f"{raised[0]} (on the Ray Train workers)")
    except TypeError:  # a subclass that takes other arguments: its own message
        return raised[0]


def expected_controller_error(error: Exception) -> ConfigError | None:
    """The ConfigError one of trainflow's Ray Train callbacks raised in the run's controller
    (a user's loop whose checkpoint lacks the checkpoint.metric the config names), else None."""
    failure = getattr(error, "controller_failure", None)
    return failure if isinstance(failure, ConfigError) else None


def run_training(
    config: PipelineConfig,
    prepared: PreparedSplits,
    *,
    run_name: str,
    storage: str,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    callbacks: Sequence[Any] = (),
    placements: str | None = None,
    start_from: tuple[str, int] | None = None,
) -> TrainingResult:
    """Train ``config``'s model on the prepared splits, as the Ray Train run ``run_name`` under
    ``storage``, and return its best checkpoint; a run with checkpoints resumes from the latest.

    ``on_row``: called with the ``plan`` row, then from a thread with each row the workers
    write (:class:`~.progress.ProgressLog`); without it they write none. ``callbacks``: Ray Train's;
    ``placements``: the worker groups' PlacementTracker; ``start_from``: another run's
    checkpoint and epoch to go on from (a PBT exploit).

    Raises TrainingDiverged when the loss became NaN or infinite."""
    if config.scaling.in_process:  # Ray Train's local mode: the loop runs here
        return train_in_process(config, prepared, run_name=run_name, storage=storage, on_row=on_row)
    # The trainer's inputs: the workers' settings and the streamed splits' Datasets.
    settings, datasets, in_memory = trainer_inputs(
        config,
        prepared,
        run_name=run_name,
        storage=storage,
        follow=on_row is not None,
        placements=placements,
        start_from=start_from,
    )
    trainer = build_trainer(settings, datasets, run_name=run_name, storage_path=storage, callbacks=callbacks)
    if on_row is not None:
        on_row(plan_row(settings, in_memory, redacted(join(storage, run_name))))

    # Fit, following the rows the workers write; SIGTERM stops it (stop_on_signals).
    timeline("train fit start")
    with (
        follow_progress(settings.progress, on_row) if settings.progress else nullcontext(Progress()) as seen,
        stop_on_signals(),
    ):
        result = fit(trainer)
    timeline("train fit returned")

    trained = loop_of(config).training_result(
        result, settings, storage=storage, run_name=run_name, seen=seen, in_memory=in_memory
    )
    # The train split's profile goes with the model: what drift is measured against later.
    profiles.attach(prepared.path, trained.best_checkpoint)
    return trained


def train_in_process(
    config: PipelineConfig,
    prepared: PreparedSplits,
    *,
    run_name: str,
    storage: str,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> TrainingResult:
    """Train ``config`` (``scaling.num_workers: 0``) on the ``prepared`` splits in this
    process, as the run ``run_name`` in its folder under ``storage``, and return its best
    checkpoint: trainflow's loop, the splits in memory, each epoch's checkpoint saved by
    the loop (:mod:`.in_process`); a run with checkpoints resumes from the latest.
    ``on_row`` as :func:`run_training`'s. Raises TrainingDiverged as it does, and
    ConfigError on a storage bucket."""
    folder = run_folder(storage, run_name)
    settings, _, in_memory = trainer_inputs(
        config, prepared, run_name=run_name, storage=storage, follow=on_row is not None, placements=None
    )
    settings = dataclasses.replace(settings, own_folder=str(folder))
    if on_row is not None:
        on_row(plan_row(settings, in_memory, str(folder)))
    timeline("train fit start")
    with (
        follow_progress(settings.progress, on_row) if settings.progress else nullcontext(Progress()) as seen,
        stop_on_signals(),
    ):
        outcome = train_loop_per_worker({SETTINGS: settings})
    timeline("train fit returned")
    if outcome.status == "diverged":
        raise TrainingDiverged(outcome.message)
    best = str(best_kept(str(folder), config.checkpoint))
    profiles.attach(prepared.path, best)
    history = read_json(newest_checkpoint(storage, run_name)[0], METRICS)["history"]
    return _loop_result(outcome, str(folder), best, history, seen, in_memory)


def train_in_trial(
    config: PipelineConfig,
    prepared: PreparedSplits,
    *,
    storage: str,
    run_name: str,
    report_every_s: float = 0.0,
    report_at_epochs: Collection[int] = (),
) -> None:
    """Train ``config`` on the ``prepared`` splits in this process, a sweep trial's
    (:mod:`.in_process`), trainflow's loop its only worker, as the run ``run_name`` under
    ``storage``, its epochs reported to Ray Tune ``report_every_s`` seconds' worth at a time
    and each of ``report_at_epochs`` at once (:class:`TuneReports`, the sweep's); the train
    split's profile goes with each checkpoint kept, also when Tune stops the trial at a
    report. Raises TrainingDiverged when the loss became NaN or infinite."""
    folder = run_folder(storage, run_name)
    settings = trainer_inputs(
        config, prepared, run_name=run_name, storage=storage, follow=False, placements=None
    )[0]
    reports = TuneReports(every_s=report_every_s, at_epochs=report_at_epochs)
    # No mid-epoch saves: a trial is not resumed (the sweep reports a failed one).
    settings = dataclasses.replace(settings, own_folder=str(folder), to_tune=reports, step_folder=None)
    try:
        outcome = train_loop_per_worker({SETTINGS: settings})
    finally:
        for checkpoint in folder.glob("checkpoint_epoch_*"):
            profiles.attach(prepared.path, str(checkpoint))
    reports.flush()
    if outcome.status == "diverged":
        raise TrainingDiverged(outcome.message)


def fit(trainer: TorchTrainer) -> ray.train.Result:
    """``trainer.fit()``; a failure of the workers with an error trainflow raises for a
    user to act on is raised as that error (:func:`expected_worker_error`)."""
    from ray.train import TrainingFailedError

    try:
        return trainer.fit()
    except TrainingFailedError as e:
        expected = expected_worker_error(e) or expected_controller_error(e)
        if expected is None:
            raise
        raise expected from None


def training_result(
    result: ray.train.Result,
    settings: TrainSettings,
    *,
    storage: str,
    run_name: str,
    seen: Progress,
    in_memory: tuple[str, ...],
) -> TrainingResult:
    """What came of the fit of the run ``run_name`` of ``config``, with the worker starts
    ``seen`` and the splits held ``in_memory``. Raises TrainingDiverged when the loss
    became NaN or infinite."""
    config = settings.config
    outcome: Outcome = result.return_value or Outcome("completed", config.train.epochs)
    if outcome.status == "diverged":
        raise TrainingDiverged(outcome.message)
    # The best checkpoint as a folder here (on an object store, a local copy); the history
    # from the last checkpoint, read where Ray stored it.
    best = local_checkpoint(result.get_best_checkpoint(config.checkpoint.metric, config.checkpoint.mode))
    history = stored_json(result.checkpoint, METRICS)["history"]
    run_path = stored_run_path(storage, run_name, result)
    return _loop_result(outcome, run_path, best, history, seen, in_memory)


def _loop_result(
    outcome: Outcome,
    run_path: str,
    best: str,
    history: list[dict[str, float]],
    seen: Progress,
    in_memory: tuple[str, ...],
) -> TrainingResult:
    """What a run of trainflow's loop gives: how it ended, its best checkpoint (a folder
    here) with that epoch's metrics, every epoch's, and the starts ``seen``."""
    return TrainingResult(
        run_path=run_path,
        best_checkpoint=best,
        best_metrics=checkpoint_metrics(best),
        history=history,
        status=outcome.status,
        epoch=outcome.epoch,
        message=outcome.message,
        starts=seen.starts,
        nodes=seen.nodes,
        sizes=seen.sizes,
        in_memory=in_memory,
    )


def stored_json(checkpoint: ray.train.Checkpoint, name: str) -> Any:
    """A JSON file of a checkpoint, read where Ray Train stored it."""
    with checkpoint.filesystem.open_input_stream(f"{checkpoint.path}/{name}") as f:
        return json.loads(f.read())


def checkpoint_metrics(checkpoint: str) -> dict[str, Any]:
    """A checkpoint's epoch metrics, without the history of the epochs before it."""
    metrics = read_json(checkpoint, METRICS)
    metrics.pop("history", None)
    return metrics


def build_trainer(
    settings: TrainSettings,
    datasets: dict[str, ray.data.Dataset] | None,
    *,
    run_name: str,
    storage_path: str,
    callbacks: Sequence[Any] = (),
) -> TorchTrainer:
    """The TorchTrainer of one run of ``settings.config``, its workers fed ``datasets``
    (the streamed splits) besides the splits they read into memory, and the modules of the
    user's code (``model.kind: package.module:callable``, ``train.loop``...) shipped to them."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

    config = settings.config
    train_function, train_loop_config, callbacks = loop_of(config).worker_function(
        settings, storage_path, run_name, callbacks
    )
    return _trainer_class()(
        train_function,
        train_loop_config=train_loop_config,
        datasets=datasets,
        # Ray's TorchConfig but for TPUs, without torch in the controller.
        torch_config=None if "TPU" in config.scaling.resources_per_worker else ray_internals.torch_config(),
        scaling_config=ScalingConfig(
            num_workers=config.scaling.num_workers,  # a (min, max) range: elastic
            use_gpu=config.scaling.use_gpu,
            resources_per_worker=dict(config.scaling.resources_per_worker),
            placement_strategy=config.scaling.placement_strategy,
            **({"elastic_resize_monitor_interval_s": s} if (s := config.scaling.resize_check_s) else {}),
        ),
        run_config=RunConfig(
            name=run_name,
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(
                num_to_keep=config.checkpoint.keep,
                checkpoint_score_attribute=config.checkpoint.metric,
                checkpoint_score_order=config.checkpoint.mode,
            ),
            failure_config=FailureConfig(
                max_failures=config.failure.max_failures,
                max_preemption_failures=-1 if (p := config.failure.max_preemptions) is None else p,
            ),
            # Ray Train logs every report and checkpoint at INFO; trainflow logs each epoch.
            logging_config=LoggingConfig(log_level="WARNING"),
            callbacks=list(callbacks),
            # A user's model module, shipped to the workers: they import it to build the
            # model, on a cluster whose nodes do not have it (one started elsewhere too),
            # beside what the job ships already (trainflow, to a cluster started elsewhere).
            worker_runtime_env=worker_runtime_env(config.user_modules),
        ),
    )


def worker_function(
    settings: TrainSettings, storage: str, run_name: str, callbacks: Sequence[Any]
) -> tuple[Callable[[dict], Any], dict[str, Any], list[Any]]:
    """What every worker of the run ``run_name`` under ``storage`` runs, with what, beside
    ``callbacks``: trainflow's loop and its settings (a loop's :data:`LOOPS` module
    defines its own)."""
    return train_loop_per_worker, {SETTINGS: settings}, list(callbacks)


@functools.cache
def _trainer_class() -> type[TorchTrainer]:
    """TorchTrainer less the helper processes a run does not need
    (:func:`trainflow.ray_internals.trainer_class`)."""
    return ray_internals.trainer_class(fixed_cluster=started_local_cluster)
