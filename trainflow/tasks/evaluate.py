"""The evaluate step: the best checkpoint over the test split, published as artifacts."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.cluster.session import connected
from trainflow.config import PipelineConfig
from trainflow.files import is_uri
from trainflow.pipelines.evaluation import evaluate as scoring
from trainflow.tasks import render
from trainflow.tasks.results import Evaluated, Prepared, Trained
from trainflow.tasks.steps import as_config, expect, step


@step(name="evaluate", cache_policy=NO_CACHE)
def evaluate(config: PipelineConfig | dict | str, prepared: Prepared, trained: Trained) -> Evaluated:
    """The best checkpoint over the test split (in this process when the split is small,
    else on Ray Data actors, connecting to Ray when the caller has not); its metrics and
    plots published as Prefect artifacts."""
    config = as_config(config, "evaluate")
    expect(prepared, Prepared, "evaluate", "prepared", "preprocess")
    expect(trained, Trained, "evaluate", "trained", "train")
    trained.check_trained_on(prepared, "evaluate")
    if prepared.counts["test"] > config.evaluation.in_driver_max_rows:  # Ray Data actors score it
        connected(config, get_run_logger())
    metrics, where = scoring.evaluate_split(
        trained.best_checkpoint, prepared.split_path("test"), prepared.counts["test"], config.evaluation
    )
    get_run_logger().info(
        "test %s on %d examples (predicted %s)", render.test_scores(metrics), metrics["num_examples"], where
    )
    plots = scoring.evaluation_plots(trained.history, metrics, _reports_folder(trained))
    _publish(config.name, metrics, plots)
    return Evaluated(checkpoint=trained.best_checkpoint, metrics=metrics, reports=[str(p) for p in plots])


def _reports_folder(trained: Trained) -> Path:
    """Beside the run's checkpoints; on an object store, beside the best one's copy here."""
    run_folder = Path(trained.best_checkpoint).parent if is_uri(trained.run_path) else Path(trained.run_path)
    return run_folder / "reports"


def _publish(name: str, metrics: dict, plots: list[Path]) -> None:
    key = render.artifact_key(name)
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
