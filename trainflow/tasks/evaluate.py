"""The evaluate task: the best checkpoint over the test split, published as artifacts."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.config import PipelineConfig
from trainflow.files import is_uri
from trainflow.pipelines.evaluation import evaluate as ev
from trainflow.tasks import render
from trainflow.tasks.results import Evaluated, Prepared, Trained


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(config: PipelineConfig, prepared: Prepared, trained: Trained) -> Evaluated:
    """The best checkpoint over the test split; metrics published as artifacts."""
    test = prepared.split_path("test")
    metrics, where = ev.evaluate_split(
        trained.best_checkpoint, test, prepared.counts["test"], config.evaluation
    )
    scores = ", ".join(f"{k} {metrics[k]:.4f}" for k in render.task_metrics(metrics))
    get_run_logger().info("test %s on %d examples (predicted %s)", scores, metrics["num_examples"], where)
    # Beside the run's checkpoints; on an object store, beside the best one's copy here.
    run_folder = Path(trained.best_checkpoint).parent if is_uri(trained.run_path) else Path(trained.run_path)
    plots = ev.evaluation_plots(trained.history, metrics, run_folder / "reports")
    key, name = render.artifact_key(config.name), config.name
    if "per_class" in metrics:
        create_table_artifact(
            key=f"{key}-per-class",
            table=render.per_class_table(metrics),
            description=f"{name}: per-class test metrics",
        )
    create_markdown_artifact(
        key=f"{key}-evaluation",
        markdown=render.evaluation_markdown(name, metrics, plots),
        description=f"{name}: test metrics and plots",
    )
    return Evaluated(checkpoint=trained.best_checkpoint, metrics=metrics, reports=[str(p) for p in plots])
