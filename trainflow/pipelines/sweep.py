"""A hyperparameter sweep on Ray Tune: many TorchTrainer runs, weak ones stopped early.

Each trial is a function trainable that builds one :class:`TorchTrainer` for its
sampled config (``Tuner(trainer)`` does not work with Ray Train V2) and forwards every
epoch's report to Tune through ``TuneReportCallback``, so ASHA can stop it. The trial
actor itself holds no CPU: the trainer's workers ask for what ``sweep.scaling`` says.
:func:`run_sweep` returns one plain :class:`TrialSummary` per trial and the best.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainflow.config import FailureSection, PipelineConfig, SweepConfig, trial_config
from trainflow.files import replacing_file
from trainflow.pipelines.checkpoint import METRICS, read_json
from trainflow.pipelines.models import model_spec
from trainflow.pipelines.train import ProgressLog, TrainingDiverged, build_trainer, split_inputs
from trainflow.runtime import configure_ray_data

# What a trial's report row holds besides the metrics (set by TuneReportCallback).
CHECKPOINT_PATH = "checkpoint_path"
HISTORY_KEYS = ("epoch", "train_loss", "val_loss", "val_accuracy", "lr")


class SweepFailed(RuntimeError):
    """No trial produced a checkpoint; the message lists why each failed."""


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


def search_space(sweep: SweepConfig) -> dict[str, Any]:
    """Ray Tune's search space from the config's dimensions, keyed by dotted field."""
    from ray import tune

    def domain(dim):
        if dim.choice is not None:
            return tune.choice(dim.choice)
        if dim.grid is not None:
            return tune.grid_search(dim.grid)
        if dim.uniform is not None:
            return tune.uniform(*dim.uniform)
        if dim.loguniform is not None:
            return tune.loguniform(*dim.loguniform)
        return tune.randint(*dim.randint)

    return {path: domain(dim) for path, dim in sweep.space.items()}


def max_epochs(config: PipelineConfig) -> int:
    """The most epochs any trial can train: ASHA's last rung."""
    dim = config.sweep.space.get("train.epochs")
    return max(int(v) for v in dim.extremes()) if dim is not None else config.train.epochs


def run_trial(
    tune_config: dict[str, Any], *, base: dict[str, Any], data: dict[str, Any], storage: str, progress: str
) -> None:
    """One trial, run by Ray Tune in its own actor: a TorchTrainer for the sampled config.

    ``data`` holds the prepared splits' ``path``, ``preprocessor``, ``num_features``,
    ``num_classes`` and ``in_memory`` (the names of the splits kept in memory). Every
    epoch's report reaches Tune (and ASHA) through TuneReportCallback; a diverged loss
    fails the trial with its message.
    """
    import ray.data
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    configure_ray_data()  # this trial's actor runs the trainer's Dataset executions
    config = trial_config(PipelineConfig.model_validate(base), tune_config["params"])
    # No restarts of a trial's workers: when a trial ends, the sweep removes its workers'
    # placement group, and a controller that outlived it would restart them in a new one
    # that nothing removes. A worker that fails fails its trial, which the sweep reports.
    config = config.model_copy(update={"failure": FailureSection(max_failures=0)})
    spec = model_spec(config.model, data["num_features"], data["num_classes"])
    memory_splits, datasets = split_inputs(
        data["path"], in_memory=data["in_memory"], preprocessor=data["preprocessor"]
    )
    loop_config = config.to_train_loop_config(
        model_spec=spec,
        preprocessor=data["preprocessor"],
        progress_actor=progress,
        memory_splits=memory_splits,
    )
    trial_id = ray.tune.get_context().get_trial_id()
    trainer = build_trainer(
        config,
        loop_config,
        datasets,
        run_name=f"trial-{trial_id}",
        storage_path=storage,
        callbacks=[TuneReportCallback()],
    )
    outcome = trainer.fit().return_value or {"status": "completed"}
    if outcome["status"] == "diverged":
        raise TrainingDiverged(outcome["message"])


def trial_events(on_event: Callable[[dict[str, Any]], None], release: Callable[[str], None]):
    """A Ray Tune callback that hands each trial's start, epochs and end to ``on_event``,
    and releases an ended trial's training workers' resources."""
    from ray.tune import Callback

    class TrialEvents(Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            on_event({"kind": "start", "trial_id": trial.trial_id, "params": trial.config["params"]})

        def on_trial_result(self, iteration, trials, trial, result, **info):
            on_event({"kind": "epoch", "trial_id": trial.trial_id, **_row(result)})

        def on_trial_complete(self, iteration, trials, trial, **info):
            release(trial.trial_id)
            on_event({"kind": "end", "trial_id": trial.trial_id})

        def on_trial_error(self, iteration, trials, trial, **info):
            release(trial.trial_id)
            on_event({"kind": "error", "trial_id": trial.trial_id, "error": _error_line(trial.error_file)})

    return TrialEvents()


class _Placements:
    """The placement groups of every trial's worker group, as its workers report them to
    the :class:`ProgressLog` ``name`` (read here for its worker starts only).

    A trial that ASHA stops is killed with its TorchTrainer's controller, which then cannot
    remove its workers' placement group; Ray Train's own cleaner needs the dashboard's
    state API. Left alone, the CPUs stay reserved and later trials wait forever.
    """

    def __init__(self, name: str):
        self.name = name
        self.log = ProgressLog(name)

    def release(self, trial_id: str) -> None:
        self._remove(lambda w: w["run"] == f"trial-{trial_id}")

    def close(self) -> None:
        try:
            self._remove(lambda w: True)
        finally:
            self.log.clear()

    def _remove(self, which) -> None:
        import ray
        from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

        groups = {w["placement_group"] for w in self.log.workers() if which(w)}
        for hex_id in groups - {None}:
            group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(hex_id)))
            if placement_group_table(group).get("state") not in ("REMOVED", None):
                remove_placement_group(group)


def _row(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result[k] for k in HISTORY_KEYS if k in result}


def _error_line(error_file: str | None) -> str:
    """The last line of a failed trial's traceback, which says what went wrong."""
    if not error_file or not Path(error_file).is_file():
        return "failed (no error recorded)"
    lines = [line.strip() for line in Path(error_file).read_text().splitlines() if line.strip()]
    return lines[-1] if lines else "failed (no error recorded)"


def run_sweep(
    config: PipelineConfig,
    data: dict[str, Any],
    *,
    name: str,
    storage_path: str,
    max_concurrent: int,
    on_event: Callable[[dict[str, Any]], None] = lambda event: None,
) -> list[TrialSummary]:
    """Run ``config.sweep`` on Ray Tune and summarize every trial.

    ``name`` is the experiment's folder under ``storage_path``; each trial's Ray Train run
    is ``name/trial-<id>`` in it. ``data`` holds the prepared splits' ``path``,
    ``preprocessor``, ``num_features``, ``num_classes`` and ``in_memory`` (the names of
    the splits kept in memory).
    """
    placements = _Placements(f"trainflow-sweep-{name}")
    try:
        tuner = build_tuner(
            config,
            data,
            name=name,
            storage_path=storage_path,
            max_concurrent=max_concurrent,
            callbacks=[trial_events(on_event, placements.release)],
            progress=placements.name,
        )
        grid = tuner.fit()
    finally:
        placements.close()
    return summarize(config, grid)


def build_tuner(
    config: PipelineConfig,
    data: dict[str, Any],
    *,
    name: str,
    storage_path: str,
    max_concurrent: int,
    callbacks: list[Any],
    progress: str,
):
    """The Tuner for ``config.sweep``; ``progress`` names the ProgressLog the trials' workers
    report to."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    sweep = config.sweep
    if sweep.scheduler.kind == "asha":
        last = max_epochs(config)
        scheduler = ASHAScheduler(
            time_attr="training_iteration",  # one report per epoch
            max_t=last,
            grace_period=min(sweep.scheduler.grace_period, last),
            reduction_factor=sweep.scheduler.reduction_factor,
        )
    else:
        scheduler = FIFOScheduler()
    trainable = tune.with_parameters(
        run_trial,
        base=config.model_dump(mode="json"),
        data=data,
        storage=f"{storage_path}/{name}",
        progress=progress,
    )
    return tune.Tuner(
        # The trial actor only waits on its trainer; the trainer's workers hold the CPUs.
        # Tune refuses a trial that asks for nothing at all, so it asks for one byte.
        tune.with_resources(trainable, {"CPU": 0, "memory": 1}),
        param_space={"params": search_space(sweep)},
        tune_config=tune.TuneConfig(
            metric=sweep.metric,
            mode=sweep.mode,
            num_samples=sweep.trials,
            scheduler=scheduler,
            search_alg=BasicVariantGenerator(random_state=sweep.seed, max_concurrent=max_concurrent),
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path,
            # A failed trial is reported, not retried, and does not fail the sweep.
            failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            verbose=0,  # trainflow logs each trial's epochs itself
            callbacks=callbacks,
        ),
    )


def summarize(config: PipelineConfig, grid) -> list[TrialSummary]:
    """One summary per trial of a finished Tuner's ResultGrid, in trial order."""
    sweep = config.sweep
    better = max if sweep.mode == "max" else min
    summaries = []
    for result in grid:
        params = result.config["params"]
        frame = result.metrics_dataframe
        rows = [] if frame is None else frame.to_dict("records")
        rows = [r for r in rows if sweep.metric in r and not _missing(r[sweep.metric])]
        asked = int(params.get("train.epochs", config.train.epochs))
        best_row = better(rows, key=lambda r: r[sweep.metric]) if rows else None
        if result.error is not None:
            status = "failed"
        elif len(rows) < asked:
            status = "stopped early"
        else:
            status = "completed"
        trial_id = _trial_id(result)
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
    # A trial that failed before its first report: Tune's name for its folder holds its id
    # (run_trial_af7a9_00003_3_train_lr=...).
    found = re.search(r"_([0-9a-f]+_\d{5})_", Path(result.path).name) if result.path else None
    return found[1] if found else "?"


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


def checkpoint_metrics(checkpoint: str) -> dict[str, Any]:
    metrics = read_json(checkpoint, METRICS)
    metrics.pop("history", None)
    return metrics


def write_config_yaml(config: PipelineConfig, path: str | Path, header: str = "") -> Path:
    """The config as YAML at ``path``, written to a temporary name and renamed when complete."""
    import yaml

    comment = "".join(f"# {line}\n" for line in header.splitlines())
    with replacing_file(path) as tmp:
        tmp.write_text(
            comment + yaml.safe_dump(config.model_dump(mode="json", exclude={"sweep"}), sort_keys=False)
        )
    return Path(path)
