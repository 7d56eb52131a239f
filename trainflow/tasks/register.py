"""The register task: one MLflow model version with lineage, behind the promotion gate."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from trainflow.config import PipelineConfig
from trainflow.pipelines import registry
from trainflow.pipelines.data import schema as data
from trainflow.pipelines.evaluation import evaluate as ev
from trainflow.tasks import render
from trainflow.tasks.results import Evaluated, Prepared, Registered, Trained
from trainflow.workspace import workspace


@task(name="register", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10])
def register(
    config: PipelineConfig,
    source: data.SourceInfo,
    prepared: Prepared,
    trained: Trained,
    evaluated: Evaluated,
) -> Registered:
    """One MLflow model version with lineage; the champion alias moves only if the gate passes."""
    logger, ws = get_run_logger(), workspace()
    reg = registry.register_checkpoint(
        ws,
        name=config.name,
        checkpoint_dir=trained.best_checkpoint,
        params=config.model_dump(mode="json"),
        metrics=evaluated.headline,
        history=trained.history,
        tags=_lineage(config, source, prepared, trained),
        gate=config.registry,
        reevaluate=_rescore(config, source, prepared, logger),
        reports=evaluated.reports,
    )
    verdict = "champion" if reg.champion else "champion unchanged"
    logger.info("registered %s version %s; %s: %s", reg.name, reg.version, verdict, reg.decision.reason)
    _publish(config, reg, evaluated, registry.model_link(ws, reg))
    return Registered(**{**reg.__dict__, "decision": reg.decision.to_dict()})


def _lineage(config: PipelineConfig, source: data.SourceInfo, prepared: Prepared, trained: Trained) -> dict:
    return registry.lineage_tags(
        config_hash=config.config_hash(),
        data_fingerprint=source.fingerprint,
        test_fingerprint=prepared.fingerprint,
        ray_run=trained.run_path,
        best_epoch=trained.best_metrics["epoch"],
        flow_run_id=str(flow_run.id) if flow_run.id else None,
    )


def _rescore(
    config: PipelineConfig, source: data.SourceInfo, prepared: Prepared, logger
) -> registry.Reevaluate:
    """The gate's re-score of a champion measured on other test data, logged."""

    def rescore(champion_dir) -> dict:
        logger.info("the champion was evaluated on other test data; scoring it on this run's test split")
        kept = sum(prepared.counts.values())
        metrics = ev.score_on_raw_test_split(champion_dir, source, config.data.split, kept, config.evaluation)
        metric = config.registry.gate_metric
        if metric in metrics:
            logger.info("champion on this test split: %s %.4f", metric, metrics[metric])
        return metrics

    return rescore


def _publish(config: PipelineConfig, reg: registry.Registration, evaluated: Evaluated, link: str) -> None:
    """The gate's report and a link to the version, as Prefect artifacts."""
    key = render.artifact_key(config.name)
    create_markdown_artifact(
        key=f"{key}-gate",
        markdown=render.gate_report_markdown(reg, config.name, evaluated),
        description=f"{reg.name}: the promotion gate's decision and the test report",
    )
    create_link_artifact(
        key=f"{key}-model",
        link=link,
        link_text=f"{reg.name} version {reg.version}",
        description="The registered model version",
    )
