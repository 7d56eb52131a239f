"""The evaluate task: the best checkpoint over the test split, published as artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.config import PipelineConfig
from trainflow.pipelines import evaluate as ev
from trainflow.pipelines import reports
from trainflow.tasks.render import artifact_key, evaluation_markdown
from trainflow.tasks.results import Evaluated, Prepared, Trained


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
        markdown=evaluation_markdown(config.name, metrics, plots),
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
