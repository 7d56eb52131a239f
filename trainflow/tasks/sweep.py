"""The sweep step as a Prefect task: run the trials, log them, publish the trial table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.config import PipelineConfig, trial_config
from trainflow.pipelines import sweep as sw
from trainflow.runtime import workspace
from trainflow.tasks import render
from trainflow.tasks.results import Prepared, Swept, Trained
from trainflow.tasks.train import splits_in_memory


# No retries: a sweep that ran for an hour is not started over by a retry; failed trials
# are reported in its table instead.
@task(name="sweep", cache_policy=NO_CACHE)
def sweep(config: PipelineConfig, prepared: Prepared, name: str, max_concurrent: int) -> Swept:
    """Every trial of ``config.sweep`` on Ray Tune; the best one's checkpoint and config."""
    logger = get_run_logger()
    s = config.sweep
    storage = config.storage or str(workspace().runs)
    logger.info(
        "sweep %s: %d samples of %s, %d at a time (%d workers x %s each), %s on %s (%s); Ray runs in %s/%s",
        name,
        s.trials,
        ", ".join(f"{path} ({dim.kind})" for path, dim in s.space.items()),
        max_concurrent,
        s.scaling.num_workers,
        s.scaling.resources_per_worker,
        s.scheduler.kind.upper(),
        s.metric,
        s.mode,
        storage,
        name,
    )
    data = {
        "path": prepared.path,
        "preprocessor": prepared.preprocessor,
        "num_features": prepared.num_features,
        "num_classes": prepared.num_classes,
        "in_memory": splits_in_memory(config, prepared),
    }
    trials = sw.run_sweep(
        config,
        data,
        name=name,
        storage_path=storage,
        max_concurrent=max_concurrent,
        on_event=_log_event(logger),
    )
    table = render.trial_rows(s.metric, [t.to_dict() for t in trials])
    create_table_artifact(
        key=f"{render.artifact_key(config.name)}-sweep-trials",
        table=table,
        description=f"{config.name}: every trial of sweep {name} (params, {s.metric}, epochs, status)",
    )
    for t in trials:
        if t.status == "failed":
            logger.warning("trial %s failed: %s", t.trial_id, t.error)
    best = sw.best_trial(config, trials)
    best_config = trial_config(config, best.params)
    path = sw.write_config_yaml(
        best_config,
        Path(storage) / name / "best-config.yaml",
        header=f"The best trial ({best.trial_id}, {s.metric} {best.best:.4f} at epoch {best.best_epoch}) "
        f"of sweep {name}.\nTrain it again with: trainflow run {Path(storage) / name / 'best-config.yaml'}",
    )
    stopped = sum(t.status == "stopped early" for t in trials)
    failed = sum(t.status == "failed" for t in trials)
    logger.info(
        "%d trials: %d completed, %d stopped early, %d failed; best %s with %s %.4f (%s); config %s",
        len(trials),
        len(trials) - stopped - failed,
        stopped,
        failed,
        best.trial_id,
        s.metric,
        best.best,
        render.trial_params(best.params),
        path,
    )
    trained = Trained(
        run_name=f"trial-{best.trial_id}",
        run_path=best.run_path,
        best_checkpoint=best.best_checkpoint,
        best_metrics=sw.checkpoint_metrics(best.best_checkpoint),
        history=best.history,
        status=best.status,
    )
    return Swept(
        name=name,
        path=str(Path(storage) / name),
        trials=[t.to_dict() for t in trials],
        best_trial=best.trial_id,
        best_config=best_config.model_dump(mode="json"),
        best_config_path=str(path),
        trained=trained,
    )


def _log_event(logger):
    epochs: dict[str, int] = {}

    def on_event(event: dict[str, Any]) -> None:
        trial = event["trial_id"]
        if event["kind"] == "start":
            logger.info("trial %s started: %s", trial, render.trial_params(event["params"]))
        elif event["kind"] == "epoch":
            epochs[trial] = int(event.get("epoch", epochs.get(trial, 0) + 1))
            logger.info(
                "trial %s epoch %d  train_loss %.4f  val_loss %.4f  val_accuracy %.4f",
                trial,
                epochs[trial],
                event.get("train_loss", float("nan")),
                event.get("val_loss", float("nan")),
                event.get("val_accuracy", float("nan")),
            )
        elif event["kind"] == "end":
            logger.info("trial %s ended after %d epochs", trial, epochs.get(trial, 0))
        else:
            logger.warning("trial %s failed: %s", trial, event["error"])

    return on_event
