"""The train task: one training run on the prepared splits, its progress followed in the log."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.config import ConfigError, PipelineConfig
from trainflow.pipelines.training.run import TrainingDiverged, TrainingResult, run_training
from trainflow.pipelines.training.settings import PreparedSplits
from trainflow.tasks import render
from trainflow.tasks.render import artifact_key
from trainflow.tasks.results import Prepared, Trained
from trainflow.timeline import timeline
from trainflow.workspace import workspace


def _retry_unless_diverged(task, task_run, state) -> bool:
    # A diverged loss, or a model that does not fit the data (ConfigError), comes back on
    # every retry; anything else (a lost node) may not.
    return not isinstance(state.result(raise_on_failure=False), (TrainingDiverged, ConfigError))


@task(
    name="train",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_unless_diverged,
)
def train(config: PipelineConfig, prepared: Prepared, run_name: str) -> Trained:
    """TorchTrainer on the prepared splits. The run name is fixed per flow run, so a
    retry of this task resumes the same Ray run from its latest checkpoint."""
    logger = get_run_logger()
    meter = _ProgressMeter(config.name, config.train.epochs, logger)
    result = run_training(
        config,
        prepared_splits(prepared),
        run_name=run_name,
        storage=config.storage or str(workspace().runs),
        on_row=_log_row(logger, config, meter),
    )
    meter.update(config.train.epochs)
    _log_result(logger, config, result)
    return _trained(run_name, result)


def _trained(run_name: str, result: TrainingResult) -> Trained:
    return Trained(
        run_name=run_name,
        run_path=result.run_path,
        best_checkpoint=result.best_checkpoint,
        best_metrics=result.best_metrics,
        history=result.history,
        status=result.status,
        starts=result.starts,
        nodes=result.nodes,
    )


def prepared_splits(prepared: Prepared) -> PreparedSplits:
    """What training reads of the preprocess task's result."""
    return PreparedSplits(prepared.path, prepared.preprocessor, prepared.num_features, prepared.num_outputs)


def _describe_weights(weights: list[float] | None, config: PipelineConfig) -> str:
    """``, class weights (balanced): stayed 0.64, left 2.28``, or nothing when unweighted."""
    if not weights:
        return ""
    classes = config.data.classes or range(len(weights))
    pairs = ", ".join(f"{c} {w:.3g}" for c, w in zip(classes, weights, strict=False))
    return f", class weights ({config.train.class_weights}): {pairs}"


def _log_row(logger, config: PipelineConfig, meter: _ProgressMeter):
    """Log each row of the run's progress as it arrives (run_training's ``on_row``)."""
    epochs, s = config.train.epochs, config.scaling

    def on_row(row: dict[str, Any]) -> None:
        if row["kind"] == "plan":
            logger.info(
                "training %s (%s) for %d epochs on %d workers (%s each), %s; Ray run %s",
                config.model.kind,
                row["parameters"],
                epochs,
                s.num_workers,
                s.resources_per_worker,
                _describe_splits(row["in_memory"], row["streamed"]),
                row["run_path"],
            )
            logger.info("loss %s%s", row["loss"], _describe_weights(row["class_weights"], config))
            return
        timeline(f"train worker row {row['kind']} epoch {row.get('epoch', row.get('start_epoch'))}")
        if row["kind"] == "start":
            if row["start_epoch"]:
                logger.info("resuming from the checkpoint of epoch %d", row["start_epoch"])
        elif row["kind"] == "step":
            logger.info("epoch %d step %d  loss %.4f", row["epoch"], row["step"], row["loss"])
        else:
            logger.info(
                "epoch %d/%d  %s  lr %.3g", row["epoch"], epochs, render.epoch_metrics(row), row["lr"]
            )
            meter.update(row["epoch"])

    return on_row


def _describe_splits(in_memory: list[str], streamed: list[str]) -> str:
    """``val in memory, train streamed from Ray Data`` and the like."""
    parts = [f"{' and '.join(in_memory)} in memory"] if in_memory else []
    parts += [f"{' and '.join(streamed)} streamed from Ray Data"] if streamed else []
    return ", ".join(parts)


def _log_result(logger, config: PipelineConfig, result: TrainingResult) -> None:
    if result.status == "early_stopped":
        logger.info("stopped early after epoch %d: %s", result.epoch, result.message)
    logger.info("%d workers trained on %d Ray node(s)", config.scaling.num_workers, len(result.nodes))
    if len(result.starts) > 1:
        logger.warning(
            "the worker group started %d times (a worker or node failed); it resumed after epochs %s",
            len(result.starts),
            result.starts[1:],
        )
    metric = config.checkpoint.metric
    logger.info(
        "best checkpoint (epoch %d, %s %.4f): %s",
        result.best_metrics["epoch"],
        metric,
        result.best_metrics[metric],
        result.best_checkpoint,
    )


class _ProgressMeter:
    """The train task's Prefect progress artifact, moved as epochs finish."""

    def __init__(self, name: str, epochs: int, logger):
        from prefect.artifacts import create_progress_artifact

        self.epochs, self.logger, self.done = epochs, logger, 0
        self.id = create_progress_artifact(
            progress=0.0, key=f"{artifact_key(name)}-training", description=f"{name}: epochs trained"
        )

    def update(self, epoch: int) -> None:
        from prefect.artifacts import update_progress_artifact

        if epoch <= self.done:
            return
        self.done = epoch
        try:
            update_progress_artifact(self.id, progress=100.0 * epoch / self.epochs)
        except Exception as e:  # a display aid: never worth failing the training for
            self.logger.warning("could not update the training progress artifact: %s", e)
