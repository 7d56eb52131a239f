"""The train step: one training run on the prepared splits, its progress followed in the log."""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run, task_run

from trainflow.cluster.preflight import preflight
from trainflow.cluster.session import connected
from trainflow.config import ConfigError, PipelineConfig
from trainflow.config.resources import ScalingSection
from trainflow.pipelines.training.run import TrainingDiverged, TrainingResult, run_training
from trainflow.pipelines.training.run_records import RunRecord, read_record, recorded_run
from trainflow.pipelines.training.settings import PreparedSplits
from trainflow.tasks import render
from trainflow.tasks.render import artifact_key
from trainflow.tasks.results import Prepared, Trained
from trainflow.tasks.steps import as_config, expect, run_id, step
from trainflow.timeline import timeline
from trainflow.workspace import storage_location


def _retry_unless_diverged(_task, _task_run, state) -> bool:
    # A diverged loss, a model that does not fit the data or a step handed the wrong thing
    # (ConfigError) comes back on every retry; anything else (a lost node) may not.
    return not isinstance(state.result(raise_on_failure=False), (TrainingDiverged, ConfigError))


@step(
    name="train",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_unless_diverged,
)
def train(
    config: PipelineConfig | dict | str,
    prepared: Prepared,
    run_name: str | None = None,
    scaling: ScalingSection | None = None,
) -> Trained:
    """TorchTrainer on the prepared splits, on ``config.scaling``'s workers fitted to the cluster
    (``scaling``: as the flow's ``preflight`` fitted them; None, or a retry after a lost node,
    fits them here), connected to Ray unless the caller is. ``run_name``: the Ray Train run
    under ``storage``, recorded there; by default one per call, which a retry resumes. An
    unfinished run's name continues it (``--resume``); one trained, not registered, returns it."""
    config = as_config(config, "train")
    expect(prepared, Prepared, "train", "prepared", "preprocess")
    prepared.check_made_for(config, "train")
    logger = get_run_logger()
    run_name = run_name or default_run_name(config)
    storage = storage_location(config)
    if (ended := _trained_unregistered(storage, run_name, logger)) is not None:
        return ended
    fitted = _fitted(config, scaling, logger)
    with recorded_run(storage, config, prepared.source_fingerprint, run_name, flow_run.id) as record:
        result = _run(fitted, prepared, run_name, storage, logger, record)
        trained = _trained(config, prepared, run_name, result)
        record.trained = trained.model_dump(mode="json")
    return trained


def _fitted(config: PipelineConfig, scaling: ScalingSection | None, logger) -> PipelineConfig:
    """The config to train, Ray connected: its scaling as the flow fitted it, or fitted now."""
    connected(config, logger)
    if scaling is None or task_run.run_count > 1:
        return preflight(config, logger)
    return config.model_copy(update={"scaling": scaling})


def _trained_unregistered(storage: str, run_name: str, logger) -> Trained | None:
    """The result of the run ``run_name`` when it trained to its end and was not registered
    (its registering failed); None otherwise."""
    ended = read_record(storage, run_name)
    if ended is None or not ended.to_register:
        return None
    logger.info(
        "%s trained to its end (%s): registering it, without training again", ended.describe(), ended.status
    )
    return Trained.model_validate(ended.trained)


def default_run_name(config: PipelineConfig) -> str:
    """The Ray Train run of this call of the train task: the model's name and the call's
    own id (``steps.run_id``: a Prefect retry resumes the run)."""
    return f"{config.name}-{run_id()}"


def _run(
    config: PipelineConfig, prepared: Prepared, run_name: str, storage: str, logger, record: RunRecord
) -> TrainingResult:
    """One training, its progress logged and shown as a Prefect progress artifact, its
    record's status set to how it ended."""
    if record.previous is not None:
        logger.info("resuming %s, %s", record.previous.describe(), record.previous.status)
    meter = _ProgressMeter(config.name, config.train.epochs, logger)
    try:
        result = run_training(
            config,
            prepared_splits(prepared),
            run_name=run_name,
            storage=storage,
            on_row=_log_row(logger, config, meter),
        )
        meter.update(config.train.epochs)
    except TrainingDiverged:
        record.status = "diverged"  # it would diverge again: nothing to resume
        raise
    finally:
        meter.close()
    record.status = result.status
    _log_result(logger, config, result)
    return result


def _trained(config: PipelineConfig, prepared: Prepared, run_name: str, result: TrainingResult) -> Trained:
    return Trained(
        run_name=run_name,
        run_path=result.run_path,
        best_checkpoint=result.best_checkpoint,
        best_metrics=result.best_metrics,
        history=result.history,
        status=result.status,
        starts=result.starts,
        nodes=result.nodes,
        sizes=result.sizes,
        config_hash=config.config_hash(),
        prepared=prepared.fingerprint,
    )


def prepared_splits(prepared: Prepared) -> PreparedSplits:
    """What training reads of the preprocess task's result."""
    return PreparedSplits(
        prepared.path,
        prepared.preprocessor,
        prepared.num_features,
        prepared.num_outputs,
        counts=dict(prepared.counts),
    )


def _describe_weights(weights: list[float] | None, config: PipelineConfig) -> str:
    """``, class weights (balanced): stayed 0.64, left 2.28``, or nothing when unweighted."""
    if not weights:
        return ""
    classes = config.data.classes or range(len(weights))
    pairs = ", ".join(f"{c} {w:.3g}" for c, w in zip(classes, weights, strict=False))
    return f", class weights ({config.train.class_weights}): {pairs}"


def _log_plan(logger, config: PipelineConfig, row: dict[str, Any]) -> None:
    """Log the run's ``plan`` row: the model, the workers, the splits, the loss or the
    user's loop."""
    s = config.scaling
    if s.in_process:
        where = "in the flow's own process (scaling.num_workers 0)"
        kind = "run folder"
    else:
        kind = "Ray run"
        workers = f"{s.min_workers} to {s.max_workers}" if s.elastic else s.num_workers
        where = f"on {workers} workers ({s.resources_per_worker} each)"
    logger.info(
        "training %s (%s)%s for %d epochs %s, %s; %s %s",
        config.model.kind,
        row["parameters"],
        f" with train.loop {row['loop']}" if row.get("loop") else "",
        config.train.epochs,
        where,
        _describe_splits(row["in_memory"], row["streamed"]),
        kind,
        row["run_path"],
    )
    if not row.get("loop"):
        logger.info("loss %s%s", row["loss"], _describe_weights(row["class_weights"], config))


def _loop_metrics(row: dict[str, Any]) -> str:
    """``loss 0.3120  val_accuracy 0.941``: every number a user's loop reported for an epoch."""
    shown = {k: v for k, v in row.items() if k not in ("kind", "epoch", "lr") and isinstance(v, (int, float))}
    return "  ".join(f"{k} {v:.4g}" for k, v in shown.items())


def _log_row(logger, config: PipelineConfig, meter: _ProgressMeter):
    """Log each row of the run's progress as it arrives (run_training's ``on_row``)."""
    epochs = config.train.epochs
    metric = config.checkpoint.metric
    unranked: list[bool] = []  # a user's loop reported no checkpoint.metric: said once
    sizes: list[int] = []  # the workers of each start of the worker group
    preempted: list[dict[str, Any]] = []  # a node's preemption announced since the group's last start

    def on_row(row: dict[str, Any]) -> None:
        if row["kind"] == "plan":
            _log_plan(logger, config, row)
            return
        timeline(f"train worker row {row['kind']} epoch {row.get('epoch', row.get('start_epoch'))}")
        if row["kind"] == "start":
            _log_start(logger, config.scaling, row, sizes, preempted)
        elif row["kind"] == "preempting":
            preempted.append(row)
            _log_preempting(logger, row)
        elif row["kind"] == "step":
            logger.info("epoch %d step %d  loss %.4f", row["epoch"], row["step"], row["loss"])
        else:
            metrics = _loop_metrics(row) if config.train.loop else render.epoch_metrics(row)
            lr = f"  lr {row['lr']:.3g}" if "lr" in row else ""  # a user's loop may report none
            logger.info("epoch %d/%d  %s%s", row["epoch"], epochs, metrics, lr)
            meter.update(row["epoch"])
            if config.train.loop and metric not in row and not unranked:
                unranked.append(True)
                logger.warning(
                    "checkpoint.metric %s is not among the metrics train.loop %s reports (%s): the "
                    "run fails when training ends; set checkpoint.metric to one of them",
                    metric,
                    config.train.loop,
                    ", ".join(k for k in row if k != "kind"),
                )

    return on_row


def _log_preempting(logger, row: dict[str, Any]) -> None:
    """Ray Train warned that nodes of the run are being preempted, and rank 0 saved."""
    deadline = row["deadline_ms"]
    gone = f" (gone in {max(0, deadline / 1000 - time.time()):.0f} s)" if deadline else ""
    nodes = ", ".join(node[:12] for node in row["nodes"])
    which = f"Ray nodes {nodes} are" if len(row["nodes"]) > 1 else f"Ray node {nodes} is"
    logger.warning(
        "%s being preempted%s: saved the state at step %d of epoch %d, which the run goes on from "
        "when Ray Train restarts it",
        which,
        gone,
        row["step"],
        row["epoch"],
    )


def _log_start(
    logger, scaling: ScalingSection, row: dict[str, Any], sizes: list[int], preempted: list[dict[str, Any]]
) -> None:
    """Log a start of the worker group (its rank 0's row): an elastic run's size, and each
    resize with its cause and the epoch it resumes after; a restart's resumption."""
    workers = row["workers"]
    before = sizes[-1] if sizes else None
    sizes.append(workers)
    lost = "a node was preempted" if preempted else "a worker or its node was lost"
    preempted.clear()
    if before is None and scaling.elastic:
        logger.info("started with %d of %d to %d workers", workers, scaling.min_workers, scaling.max_workers)
    epoch = row["start_epoch"]
    step = row.get("start_step", 0)
    where = f"at step {step} of epoch {epoch + 1}" if step else f"after epoch {epoch}"
    if before is not None and workers != before:
        why = "the cluster has room for more" if workers > before else lost
        logger.warning("resized from %d to %d workers (%s); resuming %s", before, workers, why, where)
    elif step:
        logger.info("resuming from the save at step %d of epoch %d", step, epoch + 1)
    elif epoch:
        logger.info("resuming from the checkpoint of epoch %d", epoch)


def _describe_splits(in_memory: list[str], streamed: list[str]) -> str:
    """``val in memory, train streamed from Ray Data`` and the like."""
    parts = [f"{' and '.join(in_memory)} in memory"] if in_memory else []
    parts += [f"{' and '.join(streamed)} streamed from Ray Data"] if streamed else []
    return ", ".join(parts)


def _log_result(logger, config: PipelineConfig, result: TrainingResult) -> None:
    if result.status == "early_stopped":
        logger.info("stopped early after epoch %d: %s", result.epoch, result.message)
    sizes = sorted(set(result.sizes)) or [config.scaling.min_workers]
    workers = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}"
    if not config.scaling.in_process:
        logger.info("%s workers trained on %d Ray node(s)", workers, len(result.nodes))
    if len(result.starts) > 1 and not config.scaling.elastic:
        logger.warning(
            "the worker group started %d times (a worker or node failed or was preempted); it resumed "
            "after epochs %s",
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
    """The train task's Prefect progress artifact, moved as epochs finish through one
    Prefect client of its own: ``update_progress_artifact`` makes a client per call, whose
    TLS set-up took the driver's CPU every epoch, beside the workers training."""

    def __init__(self, name: str, epochs: int, logger):
        from prefect.artifacts import create_progress_artifact

        self.epochs = epochs
        self.logger = logger
        self.done = 0
        self.client = None
        self.id = create_progress_artifact(
            progress=0.0, key=f"{artifact_key(name)}-training", description=f"{name}: epochs trained"
        )

    def update(self, epoch: int) -> None:
        from prefect.client.schemas.actions import ArtifactUpdate

        if epoch <= self.done:
            return
        self.done = epoch
        # A user's loop may train more epochs than train.epochs says.
        progress = ArtifactUpdate(data=min(100.0, 100.0 * epoch / self.epochs))
        try:
            self._client().update_artifact(self.id, progress)
        except Exception as e:  # a display aid: never worth failing the training for
            self.logger.warning("could not update the training progress artifact: %s", e)

    def close(self) -> None:
        if self.client is not None:
            self.client.__exit__(None, None, None)
            self.client = None

    def _client(self):
        if self.client is None:
            from prefect.client.orchestration import get_client

            self.client = get_client(sync_client=True).__enter__()
        return self.client
