"""A hyperparameter sweep on Ray Tune, assembled and run: many TorchTrainer runs, weak
ones stopped early, or trained as a population that copies its best (PBT, PB2).

Each trial is a function trainable (:func:`run_trial`) that runs one training
(:func:`run_training`, as the train step does) for its sampled config (``Tuner(trainer)``
does not work with Ray Train V2) and reports every epoch to Tune (:mod:`.trials`), so
ASHA can stop it and PBT can copy it. The trial actor itself holds no CPU (the trainer's
workers ask for what ``sweep.scaling`` says) unless the trial trains in its own process
(:func:`trains_in_trial`). The search and the scheduler come from :mod:`.search`'s tables.
:func:`run_sweep` returns one plain :class:`TrialSummary` per trial and the best trial's
config and checkpoint.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainflow.cluster.quiet import configure_ray_data
from trainflow.cluster.session import driver_side
from trainflow.config import FailureSection, PipelineConfig, trial_config
from trainflow.config.sweep import POPULATION_SCHEDULERS
from trainflow.files import replacing_file
from trainflow.pipelines.sweep.search import asha_rungs, search_algorithm, search_space, trial_scheduler
from trainflow.pipelines.sweep.trials import (
    CHECKPOINT_PATH,
    HISTORY_KEYS,
    REPORT_EVERY_S,
    PlacementTracker,
    SweepFailed,
    exploited_checkpoint,
    history_row,
    quiet_stop,
    report_to_tune,
    trial_events,
    trial_id_in,
    trial_run,
)
from trainflow.pipelines.training.in_process import on_a_folder
from trainflow.pipelines.training.inputs import TRAIN_SPLITS, splits_in_memory
from trainflow.pipelines.training.run import checkpoint_metrics, run_training, train_in_trial
from trainflow.pipelines.training.settings import PreparedSplits
from trainflow.signals import stop_on_signals

# Tune adds its CSV, JSON and TensorBoard loggers to a run's callbacks unless this is "1".
NO_DEFAULT_LOGGERS = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"


@dataclass
class TrialSummary:
    """One trial as the sweep's table shows it."""

    trial_id: str
    params: dict[str, Any]
    status: str  # completed | stopped early | failed
    epochs: int  # epochs trained (reported)
    max_epochs: int  # epochs the trial's config asked for
    best: float | None  # the best value of the sweep's metric over its epochs
    best_epoch: int | None
    best_checkpoint: str | None
    run_path: str | None  # the trial's Ray Train run folder
    error: str = ""
    history: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_trial(
    tune_config: dict[str, Any],
    *,
    base: dict[str, Any],
    prepared: PreparedSplits,
    storage: str,
    placements: str,
    population: bool = False,
    in_trial: bool = False,
) -> None:
    """One trial, run by Ray Tune in its actor: trained there (:func:`train_in_trial`) when
    ``in_trial`` (:func:`trains_in_trial`), else :func:`run_training` of the sampled
    config, whose reports reach Tune from this thread (:func:`.trials.report_to_tune`).
    A diverged loss fails the trial. Worker groups record their placement groups with
    ``placements``. Under ``population`` (pbt, pb2) each epoch's checkpoint goes to Tune too,
    and a trial handed another's checkpoint goes on from it, in a Ray Train run named after it."""
    import ray.tune

    configure_ray_data()  # this trial's actor runs the trainer's Dataset executions
    quiet_stop()  # Tune ends a trial's actor with SIGTERM
    swept = PipelineConfig.model_validate(base)
    config = trial_config(swept, tune_config["params"])
    # No restarts of a trial's workers: when a trial ends, the sweep removes its workers'
    # placement group, and a controller that outlived it would restart them in a new one
    # that nothing removes. A worker that fails fails its trial, which the sweep reports.
    config = config.model_copy(update={"failure": FailureSection(max_failures=0)})
    trial_id = ray.tune.get_context().get_trial_id()
    if in_trial:
        # FIFO decides nothing before a trial ends, ASHA only at its rungs: between them the
        # epochs go to Tune a second's worth at a time.
        train_in_trial(
            config,
            prepared,
            storage=storage,
            run_name=trial_run(trial_id),
            report_every_s=REPORT_EVERY_S,
            report_at_epochs=asha_rungs(swept),
        )
        return
    train = functools.partial(
        run_training, config, prepared, storage=storage, placements=placements, run_name=trial_run(trial_id)
    )
    start = exploited_checkpoint(ray.tune.get_checkpoint()) if population else None
    if start is not None:
        train = functools.partial(train, run_name=trial_run(trial_id, start), start_from=start)
    report_to_tune(train, checkpoints=population)


@dataclass
class SweepOutcome:
    """A finished sweep: every trial, and the best one with its config and checkpoint."""

    trials: list[TrialSummary]  # in trial order
    best: TrialSummary
    best_config: PipelineConfig  # the best trial's whole config, as `trainflow run` takes it
    best_config_path: Path  # the same as YAML, beside the trials' runs
    best_metrics: dict[str, Any]  # the best trial's best checkpoint's metrics


def run_sweep(
    config: PipelineConfig,
    prepared: PreparedSplits,
    *,
    name: str,
    storage_path: str,
    max_concurrent: int,
    on_event: Callable[[dict[str, Any]], None] = lambda event: None,
    on_trials: Callable[[list[TrialSummary]], None] = lambda trials: None,
) -> SweepOutcome:
    """Run ``config.sweep`` on Ray Tune, summarize every trial, pick the best and write its
    config as YAML.

    ``name`` is the experiment's folder under ``storage_path``; each trial's Ray Train run
    is ``name/trial-<id>`` in it. ``on_event`` gets each trial's start, epochs and end as
    they happen; ``on_trials`` every trial's summary once the trials ended, before the
    best is picked. Raises SweepFailed when no trial produced a checkpoint.
    """
    placements = PlacementTracker(f"trainflow-sweep-{name}")
    rows: dict[str, list[dict[str, Any]]] = {}  # each trial's reports, in order

    def record(event: dict[str, Any]) -> None:
        if event["kind"] == "epoch":
            rows.setdefault(event["trial_id"], []).append(history_row(event))
        on_event(event)

    try:
        # Through Ray Client, Tune's loop and its callbacks run in an actor on the cluster.
        with driver_side(record) as told:
            tuner = build_tuner(
                config,
                prepared,
                name=name,
                storage_path=storage_path,
                max_concurrent=max_concurrent,
                callbacks=[trial_events(told, placements.release)],
                placements=placements.name,
            )
            with (
                stop_on_signals(),
                _tune_console_quiet(),
                _no_tensorboard_files(),
                _seeded(config.sweep.seed),
            ):
                grid = tuner.fit()
    finally:
        placements.close()
    trials = summarize(config, grid, rows)
    on_trials(trials)
    best = best_trial(config, trials)
    best_config = trial_config(config, best.params)
    path = Path(storage_path) / name / "best-config.yaml"
    write_config_yaml(
        best_config,
        path,
        header=f"The best trial ({best.trial_id}, {config.sweep.metric} {best.best:.4f} at epoch "
        f"{best.best_epoch}) of sweep {name}.\nTrain it again with: trainflow run {path}",
    )
    return SweepOutcome(trials, best, best_config, path, checkpoint_metrics(best.best_checkpoint))


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Python's ``random`` seeded while the sweep runs, as PBT draws from it: which top
    trial a weak one copies, and how it perturbs the hyperparameters."""
    before = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(before)


@contextmanager
def _no_tensorboard_files() -> Iterator[None]:
    """Tune's default loggers off while the sweep runs (``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS``):
    the Tuner's callbacks (:func:`build_tuner`) keep each trial's result.json and
    progress.csv, not the TensorBoard event files that Tune's driver writes and flushes at
    every report, which the trial waits for, and that nothing of trainflow reads. Through
    Ray Client, Tune's loop runs on the cluster and keeps them."""
    before = os.environ.get(NO_DEFAULT_LOGGERS)
    os.environ[NO_DEFAULT_LOGGERS] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NO_DEFAULT_LOGGERS, None)
        else:
            os.environ[NO_DEFAULT_LOGGERS] = before


@contextmanager
def _tune_console_quiet() -> Iterator[None]:
    """Tune's own console output off for the sweep: trainflow logs each trial's epochs,
    prints the trial table and says `stopped (SIGINT)` itself. Its output engine is off
    for the whole run (``RAY_AIR_NEW_OUTPUT``, :data:`trainflow.cluster.quiet.QUIET_ENV`);
    here, on a Ctrl-C, Tune's logger warns that the stop was received, points at
    ``Tuner.restore`` (which trainflow's sweep does not use) and at trials with no results
    yet. Its errors stay."""
    tune_log = logging.getLogger("ray.tune")
    before = tune_log.level
    tune_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            # Tune's advice for PBT: reused actors would keep a paused trial's trainer alive.
            warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
            yield
    finally:
        tune_log.setLevel(before)


def trains_in_trial(config: PipelineConfig, prepared: PreparedSplits) -> bool:
    """Whether each trial of ``config.sweep`` trains inside its Tune trial's process: one
    worker on the CPU with trainflow's own loop, every split of ``prepared`` held in
    memory, under a scheduler that stops trials rather than copies them (PBT and PB2 hand
    checkpoints between trials' runs), unless ``sweep.reuse_workers`` is off."""
    sweep = config.sweep
    scaling = sweep.scaling
    trial = config.model_copy(update={"scaling": scaling})  # as a trial's config has it
    return (
        sweep.reuse_workers
        and scaling.num_workers == 1
        and not scaling.use_gpu
        and set(scaling.resources_per_worker) <= {"CPU", "memory"}
        and not config.train.loop
        and sweep.scheduler.kind not in POPULATION_SCHEDULERS
        and config.checkpoint.every_n_steps is None
        and set(TRAIN_SPLITS) <= set(splits_in_memory(trial, prepared.path))
    )


def trial_resources(config: PipelineConfig, in_trial: bool) -> dict[str, float]:
    """What each trial's process asks of the cluster: its one worker's resources when it
    trains itself (``in_trial``); else nothing but a byte (Tune refuses a trial that asks
    for nothing), since its Ray Train workers hold the CPUs."""
    if in_trial:
        return {"CPU": 1.0, **config.sweep.scaling.resources_per_worker}
    return {"CPU": 0, "memory": 1}


def build_tuner(
    config: PipelineConfig,
    prepared: PreparedSplits,
    *,
    name: str,
    storage_path: str,
    max_concurrent: int,
    callbacks: list[Any],
    placements: str,
):
    """The Tuner for ``config.sweep``; ``placements`` names the PlacementTracker the trials'
    worker groups record their placement groups with."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    sweep = config.sweep
    population = sweep.scheduler.kind in POPULATION_SCHEDULERS
    # On a bucket, only Ray Train's workers save a trial's checkpoints.
    in_trial = trains_in_trial(config, prepared) and on_a_folder(storage_path)
    trainable = tune.with_parameters(
        run_trial,
        base=config.model_dump(mode="json"),
        prepared=prepared,
        storage=f"{storage_path}/{name}",
        placements=placements,
        population=population,
        in_trial=in_trial,
    )
    return tune.Tuner(
        tune.with_resources(trainable, trial_resources(config, in_trial)),
        param_space={"params": search_space(sweep)},
        tune_config=tune.TuneConfig(
            metric=sweep.metric,
            mode=sweep.mode,
            num_samples=sweep.trials,
            scheduler=trial_scheduler(config, in_trial),
            search_alg=search_algorithm(sweep, max_concurrent),
            # A trial that trains in its own process hands it to the next (training.in_process); one
            # with a trainer of its own ends with it, as PBT's pause needs.
            reuse_actors=in_trial,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path,
            # A failed trial is reported, not retried, and does not fail the sweep.
            failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            verbose=0,  # trainflow logs each trial's epochs itself
            callbacks=[*callbacks, JsonLoggerCallback(), CSVLoggerCallback()],
            # A trial's last epoch ends it before PBT ranks it: an exploit there trains nothing.
            stop={"epoch": config.train.epochs} if population else None,
        ),
    )


def summarize(
    config: PipelineConfig, grid, reported: dict[str, list[dict[str, Any]]] | None = None
) -> list[TrialSummary]:
    """One summary per trial of a finished Tuner's ResultGrid, in trial order; each trial's
    rows are those ``reported`` as they came (:func:`trial_events`' ``rows``), else those
    Tune's ResultGrid kept (which, for a trial PBT paused, holds only those since)."""
    sweep = config.sweep
    better = max if sweep.mode == "max" else min
    summaries = []
    for result in grid:
        params = result.config["params"]
        trial_id = _trial_id(result)
        frame = result.metrics_dataframe
        rows = (reported or {}).get(trial_id) or ([] if frame is None else frame.to_dict("records"))
        rows = [r for r in rows if sweep.metric in r and not _missing(r[sweep.metric])]
        asked = int(params.get("train.epochs", config.train.epochs))
        best_row = better(rows, key=lambda r: r[sweep.metric]) if rows else None
        if result.error is not None:
            status = "failed"
        elif not rows or rows[-1]["epoch"] < asked:  # a PBT trial counts on from another's epochs
            status = "stopped early"
        else:
            status = "completed"
        summaries.append(
            TrialSummary(
                trial_id=trial_id,
                params=params,
                status=status,
                epochs=len(rows),
                max_epochs=asked,
                best=float(best_row[sweep.metric]) if best_row else None,
                best_epoch=int(best_row["epoch"]) if best_row else None,
                best_checkpoint=best_row.get(CHECKPOINT_PATH) if best_row else None,
                # Ray Train keeps a run's checkpoints in the run's folder.
                run_path=str(Path(best_row[CHECKPOINT_PATH]).parent)
                if best_row and best_row.get(CHECKPOINT_PATH)
                else None,
                error=_error_text(result.error) if result.error is not None else "",
                history=[{k: float(r[k]) for k in HISTORY_KEYS if k in r} for r in rows],
            )
        )
    return sorted(summaries, key=lambda s: s.trial_id)


def _trial_id(result) -> str:
    trial_id = (result.metrics or {}).get("trial_id")
    if trial_id:
        return str(trial_id)
    # A trial that failed before its first report.
    return trial_id_in(result.path) if result.path else "?"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _error_text(error: BaseException) -> str:
    """A failed trial's cause in one line, without Ray's wrapping tracebacks."""
    cause = error
    while getattr(cause, "cause", None) is not None and cause.cause is not cause:
        cause = cause.cause
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}".strip()


def best_trial(config: PipelineConfig, trials: list[TrialSummary]) -> TrialSummary:
    """The trial whose best epoch scored best on the sweep's metric; SweepFailed if none did."""
    scored = [
        t for t in trials if t.best is not None and t.best_checkpoint and Path(t.best_checkpoint).is_dir()
    ]
    if not scored:
        reasons = "; ".join(f"trial {t.trial_id}: {t.error or t.status}" for t in trials)
        raise SweepFailed(f"no trial of the sweep produced a checkpoint: {reasons}")
    pick = max if config.sweep.mode == "max" else min
    return pick(scored, key=lambda t: t.best)


def write_config_yaml(config: PipelineConfig, path: str | Path, header: str = "") -> Path:
    """The config as YAML at ``path``, written to a temporary name and renamed when complete."""
    import yaml

    comment = "".join(f"# {line}\n" for line in header.splitlines())
    with replacing_file(path) as tmp:
        tmp.write_text(
            comment + yaml.safe_dump(config.model_dump(mode="json", exclude={"sweep"}), sort_keys=False)
        )
    return Path(path)
