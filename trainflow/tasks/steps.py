"""The training pipeline's steps as Prefect tasks.

Each calls one pipelines function, logs what a user wants to see, publishes artifacts
and returns a small pydantic value. Retries live on the decorators.
"""

from __future__ import annotations

import hashlib
import subprocess
import uuid
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.config import PipelineConfig
from trainflow.pipelines import checkpoint as ckpt
from trainflow.pipelines import data, models, registry, reports
from trainflow.pipelines import evaluate as ev
from trainflow.pipelines import preprocess as prep
from trainflow.pipelines import train as tr
from trainflow.runtime import timeline, workspace
from trainflow.tasks.results import Evaluated, Prepared, Registered, Trained

# Ingest and preprocess cache across flow runs. Each record is a file at an absolute
# path under TRAINFLOW_HOME/cache (hence the result storage at "/"): the preprocess
# record sits inside the prepared entry it describes, so deleting an entry (or the
# whole cache) also forgets that it was made, and a run never reuses a record whose
# splits are gone. The keys hold the input's fingerprint, so a changed file misses.
CACHE_RECORDS = Path("/")


def ingest_cache_key(context, parameters: dict[str, Any]) -> str:
    """The data config, the input's fingerprint (file list, sizes, mtimes or content) and
    the code that inspects it."""
    config: PipelineConfig = parameters["config"]
    cache = workspace().cache
    parts = [config.data.model_dump_json(), data.source_fingerprint(config.data, cache), prep.code_version()]
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return str(cache / "ingest" / key)


def preprocess_cache_key(context, parameters: dict[str, Any]) -> str:
    """The prepared entry's own key; the record lives in the entry's folder."""
    config: PipelineConfig = parameters["config"]
    key = prep.cache_key(parameters["source"], config.data.split, config.preprocess)
    return str(workspace().cache / key / "prefect-task-record")


@task(
    name="ingest",
    cache_key_fn=ingest_cache_key,
    persist_result=True,
    result_storage=CACHE_RECORDS,
)
def ingest(config: PipelineConfig) -> data.SourceInfo:
    """Check the source and its columns and fingerprint it; runs in the driver, before Ray."""
    info = data.inspect_source(config.data, workspace().cache)
    get_run_logger().info(
        "source %s (%s, %d files): %d features, label %r, fingerprint %s",
        info.source,
        info.format,
        len(info.files),
        len(info.feature_columns),
        info.label_column,
        info.fingerprint,
    )
    return info


@task(
    name="preprocess",
    cache_key_fn=preprocess_cache_key,
    persist_result=True,
    result_storage=CACHE_RECORDS,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=lambda task, task_run, state: (
        not isinstance(state.result(raise_on_failure=False), data.DataError)
    ),
)
def preprocess(config: PipelineConfig, source: data.SourceInfo) -> Prepared:
    """Check the rows, split, fit on train, write every split as Parquet under the cache
    (or reuse a finished entry)."""
    logger = get_run_logger()
    entry = prep.prepare(source, config.data.split, config.preprocess, workspace().cache)
    pre = entry.preprocessor
    if entry.dropped:
        logger.warning("dropped %d rows with a missing value (data.missing=drop)", entry.dropped)
    logger.info(
        "%s prepared splits %s at %s: %d classes",
        "reused" if entry.reused else "wrote",
        entry.counts,
        entry.path,
        len(pre.classes),
    )
    return Prepared(
        path=str(entry.path),
        counts=entry.counts,
        preprocessor=pre.to_dict(),
        num_features=pre.num_features,
        num_classes=len(pre.classes),
        fingerprint=entry.key,
        reused=entry.reused,
        dropped=entry.dropped,
    )


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


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(config: PipelineConfig, prepared: Prepared, trained: Trained) -> Evaluated:
    """The best checkpoint over the test split; metrics published as artifacts."""
    import ray.data

    logger = get_run_logger()
    batch_size = config.evaluation.batch_size
    in_driver = prepared.counts["test"] <= config.evaluation.in_driver_max_rows
    if in_driver:
        metrics = ev.evaluate_checkpoint_in_driver(
            trained.best_checkpoint, prepared.split_path("test"), batch_size
        )
    else:
        test = ray.data.read_parquet(prepared.split_path("test"))
        metrics = ev.evaluate_checkpoint(
            trained.best_checkpoint, test, batch_size, config.evaluation.concurrency
        )
    logger.info(
        "test accuracy %.4f, macro F1 %.4f on %d examples (predicted %s)",
        metrics["accuracy"],
        metrics["macro_f1"],
        metrics["num_examples"],
        "in the driver" if in_driver else f"by {config.evaluation.concurrency} Ray Data actor(s)",
    )
    plots = _plots(config, trained, metrics)
    create_table_artifact(
        key=f"{artifact_key(config.name)}-per-class",
        table=[{"class": c, **v} for c, v in metrics["per_class"].items()],
        description=f"{config.name}: per-class test metrics",
    )
    create_markdown_artifact(
        key=f"{artifact_key(config.name)}-evaluation",
        markdown=_evaluation_markdown(config.name, metrics, plots),
        description=f"{config.name}: test metrics, per-class numbers, confusion matrix, learning curve",
    )
    return Evaluated(checkpoint=trained.best_checkpoint, metrics=metrics, reports=[str(p) for p in plots])


def _plots(config: PipelineConfig, trained: Trained, metrics: dict[str, Any]) -> list[Path]:
    """The learning curve and the confusion matrix as PNGs beside the Ray run."""
    folder = Path(trained.run_path) / "reports"
    return [
        reports.learning_curve_png(trained.history, folder / reports.LEARNING_CURVE),
        reports.confusion_matrix_png(
            metrics["confusion_matrix"], list(metrics["per_class"]), folder / reports.CONFUSION_MATRIX
        ),
    ]


@task(name="register", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10])
def register(
    config: PipelineConfig,
    source: data.SourceInfo,
    prepared: Prepared,
    trained: Trained,
    evaluated: Evaluated,
) -> Registered:
    """One MLflow model version with lineage; the champion alias moves only if the gate passes."""
    from prefect.artifacts import create_link_artifact
    from prefect.runtime import flow_run

    logger = get_run_logger()
    ws = workspace()
    tags = {
        "trainflow.config_hash": config.config_hash(),
        "trainflow.data_fingerprint": source.fingerprint,
        registry.TEST_FINGERPRINT_TAG: prepared.fingerprint,
        "trainflow.ray_run": trained.run_path,
        "trainflow.best_epoch": str(trained.best_metrics["epoch"]),
    }
    if flow_run.id:
        tags["prefect.flow_run_id"] = str(flow_run.id)
    commit = _git_commit()
    if commit:
        tags["git.commit"] = commit
    reg = registry.register_checkpoint(
        ws,
        name=config.name,
        checkpoint_dir=trained.best_checkpoint,
        params=config.model_dump(mode="json"),
        metrics=evaluated.headline,
        history=trained.history,
        tags=tags,
        gate=config.registry,
        reevaluate=lambda champion_dir: _score_on_this_test_split(config, source, prepared, champion_dir),
        reports=evaluated.reports,
    )
    d = reg.decision
    logger.info(
        "registered %s version %s; %s: %s",
        reg.name,
        reg.version,
        "champion" if reg.champion else "champion unchanged",
        d.reason,
    )
    create_markdown_artifact(
        key=f"{artifact_key(config.name)}-gate",
        # The whole report in one place: the gate decision, then the metrics and plots.
        markdown=gate_markdown(reg)
        + "\n\n"
        + _evaluation_markdown(config.name, evaluated.metrics, [Path(p) for p in evaluated.reports]),
        description=f"{reg.name}: the promotion gate's decision and the test report",
    )
    create_link_artifact(
        key=f"{artifact_key(config.name)}-model",
        link=_model_link(ws, reg.name, reg.version, reg.source),
        link_text=f"{reg.name} version {reg.version}",
        description="The registered model version",
    )
    return Registered(
        name=reg.name,
        aliases=reg.aliases,
        version=reg.version,
        run_id=reg.run_id,
        champion=reg.champion,
        decision=d.to_dict(),
        source=reg.source,
    )


def _score_on_this_test_split(
    config: PipelineConfig, source: data.SourceInfo, prepared: Prepared, checkpoint_dir
) -> dict:
    """A champion measured on other test data, scored on this run's raw test rows with
    its own saved preprocessing, so the gate compares the two on the same rows."""
    logger = get_run_logger()
    logger.info("the champion was evaluated on other test data; scoring it on this run's test split")
    kept = sum(prepared.counts.values())
    test = data.raw_split(source, config.data.split, "test", kept_rows=kept)
    metrics = ev.evaluate_rows(
        str(checkpoint_dir),
        test,
        source.label_column,
        config.evaluation.batch_size,
        config.evaluation.concurrency,
    )
    logger.info("champion on this test split: accuracy %.4f", metrics["accuracy"])
    return metrics


def artifact_key(name: str) -> str:
    # Prefect artifact keys hold lowercase letters, digits and dashes only.
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower())


def _model_link(ws, name: str, version: str, source: str) -> str:
    uri = registry.tracking_uri(ws)
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/models/{name}/versions/{version}"
    return source


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def gate_markdown(reg: registry.Registration) -> str:
    d = reg.decision
    if d.champion is None:
        champion = "none"
    else:
        where = "re-evaluated on this test data" if d.champion_reevaluated else "as registered"
        champion = f"{d.champion:.4f} (v{d.champion_version}, {where})"
    same = {True: "yes", False: "no", None: "-"}[d.same_test_data]
    verdict = "promoted to **champion**" if reg.champion else "not promoted: **challenger**"
    return (
        f"# {reg.name} v{reg.version}: {verdict}\n\n"
        f"{d.reason}\n\n"
        "| metric | candidate | champion | same test data | min_improvement | min_value | passed |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| {d.metric} | {d.candidate:.4f} | {champion} | {same} | {d.min_improvement} | "
        f"{d.min_value} | {d.passed} |\n\n"
        f"Aliases: {', '.join(reg.aliases) or 'none'}. "
        f'Load it: `trainflow.load_model("{reg.name}/{reg.version}")`'
    )


def _evaluation_markdown(name: str, metrics: dict[str, Any], plots: list[Path] = ()) -> str:
    classes = list(metrics["per_class"])
    scalars = [(k, v) for k, v in metrics.items() if isinstance(v, float)]
    lines = [
        f"# {name}: test metrics",
        "",
        f"{metrics['num_examples']} examples",
        "",
        "| metric | value |",
        "|---|---|",
        *[f"| {k} | {v:.4f} |" for k, v in scalars],
        "",
        "## Per class",
        "",
        "| class | precision | recall | f1 | support |",
        "|---|---|---|---|---|",
        *[
            f"| {c} | {v['precision']:.4f} | {v['recall']:.4f} | {v['f1']:.4f} | {v['support']} |"
            for c, v in metrics["per_class"].items()
        ],
        "",
        "## Confusion matrix (rows: true class, columns: predicted)",
        "",
        "| | " + " | ".join(classes) + " |",
        "|---" * (len(classes) + 1) + "|",
    ]
    for c, row in zip(classes, metrics["confusion_matrix"], strict=True):
        lines.append(f"| **{c}** | " + " | ".join(str(v) for v in row) + " |")
    for plot in plots:
        # Embedded, so the artifact shows the plot wherever the Prefect UI runs; the
        # file is also logged with the model version's MLflow run under reports/.
        lines += ["", f"![{plot.stem}]({reports.data_uri(plot)})", "", f"`{plot}`"]
    return "\n".join(lines)
