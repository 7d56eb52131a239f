"""The register task: one MLflow model version with lineage, behind the promotion gate."""

from __future__ import annotations

import subprocess
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.config import PipelineConfig
from trainflow.pipelines import data, registry
from trainflow.pipelines import evaluate as ev
from trainflow.pipelines.prepare import raw_split
from trainflow.runtime import workspace
from trainflow.tasks.render import artifact_key, evaluation_markdown, gate_markdown
from trainflow.tasks.results import Evaluated, Prepared, Registered, Trained


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
        + evaluation_markdown(config.name, evaluated.metrics, [Path(p) for p in evaluated.reports]),
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
    test = raw_split(source, config.data.split, "test", kept_rows=kept)
    metrics = ev.evaluate_rows(
        str(checkpoint_dir),
        test,
        source.label_column,
        config.evaluation.batch_size,
        config.evaluation.concurrency,
    )
    logger.info("champion on this test split: accuracy %.4f", metrics["accuracy"])
    return metrics


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
