"""The sweep step: run the trials on Ray Tune, log them, publish the trial table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.cluster.preflight import preflight_sweep
from trainflow.cluster.session import connected
from trainflow.config import PipelineConfig
from trainflow.pipelines.sweep import run as sweeps
from trainflow.pipelines.sweep.trials import trial_run
from trainflow.tasks import render
from trainflow.tasks.results import Prepared, Swept, Trained
from trainflow.tasks.steps import as_config, expect, run_id, step
from trainflow.tasks.train import prepared_splits
from trainflow.workspace import storage_location


# No retries: a sweep that ran for an hour is not started over by a retry; failed trials
# are reported in its table instead.
@step(name="sweep", cache_policy=NO_CACHE)
def sweep(
    config: PipelineConfig | dict | str,
    prepared: Prepared,
    name: str | None = None,
    max_concurrent: int | None = None,
) -> Swept:
    """Every trial of ``config.sweep`` on Ray Tune, ``max_concurrent`` at a time (by
    default as many as the cluster holds, ``cluster.preflight.preflight_sweep``); the best one's
    checkpoint and config. ``name``: the Tune experiment's folder under ``storage``, by
    default one per call of this task. Connects to Ray when the caller has not."""
    config = as_config(config, "sweep")
    logger = get_run_logger()
    expect(prepared, Prepared, "sweep", "prepared", "preprocess")
    prepared.check_made_for(config, "sweep")
    connected(config, logger)
    max_concurrent = max_concurrent or preflight_sweep(config, logger)
    name = name or f"{config.name}-sweep-{run_id()}"
    storage = storage_location(config).removeprefix("file://")  # a folder: the checks refuse a URI
    outcome = _run(config, prepared, name, storage, max_concurrent, logger)
    return _swept(name, storage, outcome, prepared)


def _run(config: PipelineConfig, prepared: Prepared, name: str, storage: str, max_concurrent: int, logger):
    """The trials on Ray Tune, their plan, events and outcome logged as they come."""
    _log_plan(logger, config, name, max_concurrent, storage)
    outcome = sweeps.run_sweep(
        config,
        prepared_splits(prepared),
        name=name,
        storage_path=storage,
        max_concurrent=max_concurrent,
        on_event=_log_event(logger),
        on_trials=_publish_trials(logger, config, name),
    )
    _log_outcome(logger, config, outcome)
    return outcome


def _swept(name: str, storage: str, outcome: sweeps.SweepOutcome, prepared: Prepared) -> Swept:
    """The sweep's result for the flow: every trial, and the best as a training run."""
    best = outcome.best
    trained = Trained(
        # A PBT trial's best checkpoint may be of the run it went on in after an exploit.
        run_name=Path(best.run_path).name if best.run_path else trial_run(best.trial_id),
        run_path=best.run_path,
        best_checkpoint=best.best_checkpoint,
        best_metrics=outcome.best_metrics,
        history=best.history,
        status=best.status,
        config_hash=outcome.best_config.config_hash(),
        prepared=prepared.fingerprint,
    )
    return Swept(
        name=name,
        path=str(Path(storage) / name),
        trials=[t.to_dict() for t in outcome.trials],
        best_trial=best.trial_id,
        best_config=outcome.best_config.model_dump(mode="json"),
        best_config_path=str(outcome.best_config_path),
        trained=trained,
    )


def _log_plan(logger, config: PipelineConfig, name: str, max_concurrent: int, storage: str) -> None:
    s = config.sweep
    logger.info(
        "sweep %s: %d samples%s of %s, %d at a time (%d workers x %s each), %s on %s (%s); Ray runs in %s/%s",
        name,
        s.trials,
        " suggested by Optuna (TPE)" if s.search == "optuna" else "",
        ", ".join(f"{path} ({dim.kind})" for path, dim in s.space.items()),
        max_concurrent,
        s.scaling.num_workers,
        s.scaling.resources_per_worker,
        _scheduler_words(s),
        s.metric,
        s.mode,
        storage,
        name,
    )


def _scheduler_words(s) -> str:
    scheduler = s.scheduler
    if scheduler.kind in ("pbt", "pb2"):
        return (
            f"{scheduler.kind.upper()} every {scheduler.perturbation_interval} epochs (bottom "
            f"{scheduler.quantile_fraction:g} goes on from top {scheduler.quantile_fraction:g})"
        )
    return scheduler.kind.upper()


def _publish_trials(logger, config: PipelineConfig, name: str):
    """Publish the trial table and warn of each failed trial, once the trials ended."""

    def on_trials(trials: list[sweeps.TrialSummary]) -> None:
        create_table_artifact(
            key=f"{render.artifact_key(config.name)}-sweep-trials",
            table=render.trial_rows(config.sweep.metric, [t.to_dict() for t in trials]),
            description=f"{config.name}: every trial of sweep {name} (params, {config.sweep.metric}, "
            "epochs, status)",
        )
        for t in trials:
            if t.status == "failed":
                logger.warning("trial %s failed: %s", t.trial_id, t.error)

    return on_trials


def _log_outcome(logger, config: PipelineConfig, outcome: sweeps.SweepOutcome) -> None:
    trials = outcome.trials
    best = outcome.best
    stopped = sum(t.status == "stopped early" for t in trials)
    failed = sum(t.status == "failed" for t in trials)
    logger.info(
        "%d trials: %d completed, %d stopped early, %d failed; best %s with %s %.4f (%s); config %s",
        len(trials),
        len(trials) - stopped - failed,
        stopped,
        failed,
        best.trial_id,
        config.sweep.metric,
        best.best,
        render.trial_params(best.params),
        outcome.best_config_path,
    )


def _log_event(logger):
    epochs: dict[str, int] = {}

    def on_event(event: dict[str, Any]) -> None:
        trial = event["trial_id"]
        if event["kind"] == "start":
            logger.info("trial %s started: %s", trial, render.trial_params(event["params"]))
        elif event["kind"] == "resume":
            logger.info("trial %s resumes after epoch %d", trial, event["epoch"])
        elif event["kind"] == "exploit":
            epochs[trial] = int(event["epoch"])
            logger.info(
                "trial %s goes on from trial %s's checkpoint after epoch %d: %s",
                trial,
                event["source"],
                event["epoch"],
                render.trial_params(event["params"]),
            )
        elif event["kind"] == "epoch":
            epochs[trial] = int(event.get("epoch", epochs.get(trial, 0) + 1))
            logger.info("trial %s epoch %d  %s", trial, epochs[trial], render.epoch_metrics(event))
        elif event["kind"] == "end":
            logger.info("trial %s ended after %d epochs", trial, epochs.get(trial, 0))
        else:
            logger.warning("trial %s failed: %s", trial, event["error"])

    return on_event
