"""The train task: TorchTrainer on the prepared splits, its progress followed in the log."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.config import PipelineConfig
from trainflow.pipelines import checkpoint as ckpt
from trainflow.pipelines import models
from trainflow.pipelines import train as tr
from trainflow.runtime import timeline, workspace
from trainflow.tasks.render import artifact_key
from trainflow.tasks.results import Prepared, Trained


def _split_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*.parquet"))


def splits_in_memory(config: PipelineConfig, prepared: Prepared) -> tuple[str, ...]:
    """The splits the workers read once into memory (``train.in_memory``); the rest stream."""
    # Augmented images stream from Ray Data, so each epoch draws new crops and flips.
    augment = bool((prepared.preprocessor.get("image") or {}).get("augment"))
    sizes = {name: _split_bytes(prepared.split_path(name)) for name in tr.SPLITS}
    return tr.in_memory_splits(
        config.train.in_memory, sizes, augment=augment, workers=config.scaling.num_workers
    )


def describe_splits(in_memory: tuple[str, ...]) -> str:
    """``val in memory, train streamed from Ray Data`` and the like, for the train log."""
    streamed = [name for name in tr.SPLITS if name not in in_memory]
    parts = [f"{' and '.join(in_memory)} in memory"] if in_memory else []
    parts += [f"{' and '.join(streamed)} streamed from Ray Data"] if streamed else []
    return ", ".join(parts)


def _retry_unless_diverged(task, task_run, state) -> bool:
    # A diverged loss comes back on every retry; anything else (a lost node) may not.
    return not isinstance(state.result(raise_on_failure=False), tr.TrainingDiverged)


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
    in_memory = splits_in_memory(config, prepared)
    spec = models.model_spec(config.model, prepared.num_features, prepared.num_classes)
    # Unique per attempt: a retry must not read (or clear) the last attempt's progress rows.
    progress = f"trainflow-progress-{run_name}-{uuid.uuid4().hex[:8]}"
    memory_splits, datasets = tr.split_inputs(
        prepared.path, in_memory=in_memory, preprocessor=prepared.preprocessor
    )
    loop_config = config.to_train_loop_config(
        model_spec=spec,
        preprocessor=prepared.preprocessor,
        progress_actor=progress,
        memory_splits=memory_splits,
    )
    storage = config.storage or str(workspace().runs)
    trainer = tr.build_trainer(config, loop_config, datasets, run_name=run_name, storage_path=storage)
    s = config.scaling
    logger.info(
        "training %s for %d epochs on %d workers (%s each), %s; Ray run %s/%s",
        config.model.kind,
        config.train.epochs,
        s.num_workers,
        s.resources_per_worker,
        describe_splits(in_memory),
        storage,
        run_name,
    )
    epochs = config.train.epochs
    meter = _ProgressMeter(config.name, epochs, logger)

    def on_row(row: dict[str, Any]) -> None:
        timeline(f"train worker row {row['kind']} epoch {row.get('epoch', row.get('start_epoch'))}")
        if row["kind"] == "start":
            if row["start_epoch"]:
                logger.info("resuming from the checkpoint of epoch %d", row["start_epoch"])
        elif row["kind"] == "step":
            logger.info("epoch %d step %d  loss %.4f", row["epoch"], row["step"], row["loss"])
        else:
            logger.info(
                "epoch %d/%d  train_loss %.4f  val_loss %.4f  val_accuracy %.4f  lr %.3g",
                row["epoch"],
                epochs,
                row["train_loss"],
                row["val_loss"],
                row["val_accuracy"],
                row["lr"],
            )
            meter.update(row["epoch"])

    timeline("train fit start")
    with tr.follow_progress(progress, on_row) as seen:
        result = trainer.fit()
    timeline("train fit returned")
    outcome = result.return_value or {"status": "completed", "epoch": epochs, "message": ""}
    if outcome["status"] == "diverged":
        raise tr.TrainingDiverged(outcome["message"])
    if outcome["status"] == "early_stopped":
        logger.info("stopped early after epoch %d: %s", outcome["epoch"], outcome["message"])
    meter.update(epochs)
    logger.info("%d workers trained on %d Ray node(s)", config.scaling.num_workers, len(seen.nodes))
    if len(seen.starts) > 1:
        logger.warning(
            "the worker group started %d times (a worker or node failed); it resumed after epochs %s",
            len(seen.starts),
            seen.starts[1:],
        )
    best = result.get_best_checkpoint(config.checkpoint.metric, config.checkpoint.mode)
    best_metrics = ckpt.read_json(best.path, ckpt.METRICS)
    history = ckpt.read_json(result.checkpoint.path, ckpt.METRICS)["history"]
    best_metrics.pop("history", None)
    logger.info(
        "best checkpoint (epoch %d, %s %.4f): %s",
        best_metrics["epoch"],
        config.checkpoint.metric,
        best_metrics[config.checkpoint.metric],
        best.path,
    )
    return Trained(
        run_name=run_name,
        run_path=str(result.path),
        best_checkpoint=best.path,
        best_metrics=best_metrics,
        history=history,
        status=outcome["status"],
        starts=seen.starts,
        nodes=seen.nodes,
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
