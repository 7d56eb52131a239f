"""The register step: one MLflow model version with lineage, behind the promotion gate."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect import get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from trainflow.cluster.session import connected
from trainflow.config import PipelineConfig
from trainflow.pipelines.data import schema
from trainflow.pipelines.evaluation import evaluate as scoring
from trainflow.pipelines.training.run_records import mark_registered
from trainflow.tasks import render
from trainflow.tasks.results import Drifted, Evaluated, Prepared, Registered, Trained
from trainflow.tasks.steps import StepInputError, as_config, expect, step
from trainflow.workspace import Workspace, storage_location, workspace

if TYPE_CHECKING:
    from trainflow.pipelines.registry import gate, registration


@step(name="register", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10])
def register(
    config: PipelineConfig | dict | str,
    source: schema.SourceInfo,
    prepared: Prepared,
    trained: Trained,
    evaluated: Evaluated,
    drifted: Drifted | None = None,
) -> Registered:
    """One MLflow model version of the trained checkpoint, with its lineage and reports (the drift
    step's too, given ``drifted``); ``champion`` moves to it only if the gate passes (``registry.decide``)."""
    config = _checked(config, source, prepared, trained, evaluated, drifted)
    logger = get_run_logger()
    ws = workspace()
    reg = _registered(ws, config, source, prepared, trained, evaluated, drifted, logger)
    mark_registered(storage_location(config), trained.run_name, reg.version)
    _publish(config, reg, evaluated, drifted, ws, logger)
    return Registered(**{**reg.__dict__, "decision": reg.decision.to_dict()})


def _registered(
    ws: Workspace,
    config: PipelineConfig,
    source: schema.SourceInfo,
    prepared: Prepared,
    trained: Trained,
    evaluated: Evaluated,
    drifted: Drifted | None,
    logger,
) -> registration.Registration:
    """The version made of ``trained`` behind the gate; a registry server gone is one line."""
    from trainflow.pipelines.registry import registration
    from trainflow.pipelines.registry.versions import server_in_one_line

    with server_in_one_line(ws):
        return registration.register_checkpoint(
            ws,
            name=config.name,
            checkpoint_dir=trained.best_checkpoint,
            params=config.model_dump(mode="json"),
            metrics=evaluated.headline,
            history=trained.history,
            tags=_lineage(config, source, prepared, trained),
            reports=[*evaluated.reports, *(drifted.reports if drifted else [])],
            **_gate(config, source, prepared, logger),
        )


def _checked(
    config: PipelineConfig | dict | str,
    source: schema.SourceInfo,
    prepared: Prepared,
    trained: Trained,
    evaluated: Evaluated,
    drifted: Drifted | None = None,
) -> PipelineConfig:
    """The config; StepInputError unless each result is what its step returns, all of one
    run of that config."""
    config = as_config(config, "register")
    for value, kind, argument, made_by in (
        (source, schema.SourceInfo, "source", "ingest"),
        (prepared, Prepared, "prepared", "preprocess"),
        (trained, Trained, "trained", "train"),
        (evaluated, Evaluated, "evaluated", "evaluate"),
    ):
        expect(value, kind, "register", argument, made_by)
    if prepared.source_fingerprint and prepared.source_fingerprint != source.fingerprint:
        raise StepInputError(
            f"register: prepared was made from other data than source ({source.source}, fingerprint "
            f"{source.fingerprint}); give it the source the splits were prepared from"
        )
    trained.check_trained_on(prepared, "register")
    trained.check_trained_with(config, "register")
    if drifted is not None:
        expect(drifted, Drifted, "register", "drifted", "drift")
        drifted.check_measured(prepared, "register")
    if evaluated.checkpoint != trained.best_checkpoint:
        raise StepInputError(
            f"register: evaluated scored {evaluated.checkpoint}, not trained's best checkpoint "
            f"{trained.best_checkpoint}; evaluate the checkpoint you register"
        )
    return config


def _lineage(config: PipelineConfig, source: schema.SourceInfo, prepared: Prepared, trained: Trained) -> dict:
    """The lineage tags, with the flow run's name and flow, which MLflow's UI shows as who
    registered the version (``registration.creator_tags``)."""
    from trainflow.pipelines.registry import lineage
    from trainflow.pipelines.registry.registration import FLOW_NAME_TAG, FLOW_RUN_NAME_TAG

    tags = lineage.lineage_tags(
        config_hash=config.config_hash(),
        data_fingerprint=source.fingerprint,
        test_fingerprint=prepared.fingerprint,
        ray_run=trained.run_path,
        best_epoch=trained.best_metrics["epoch"],
        flow_run_id=str(flow_run.id) if flow_run.id else None,
    )
    if flow_run.id:
        tags |= {FLOW_RUN_NAME_TAG: flow_run.name, FLOW_NAME_TAG: flow_run.flow_name}
    return tags


def _gate(config: PipelineConfig, source: schema.SourceInfo, prepared: Prepared, logger) -> dict:
    """What the promotion gate decides with: the registry section, the gate metric's
    direction (a metric of the user's own: its mode) and the champion's re-score."""
    return {
        "gate": config.registry,
        "lower_is_better": config.lower_is_better(config.registry.gate_metric),
        "reevaluate": _rescore(config, source, prepared, logger),
    }


def _rescore(
    config: PipelineConfig, source: schema.SourceInfo, prepared: Prepared, logger
) -> gate.Reevaluate:
    """The gate's re-score of a champion measured on other test data, logged."""

    def rescore(champion_dir) -> dict:
        logger.info("the champion was evaluated on other test data; scoring it on this run's test split")
        connected(config, logger)
        kept = sum(prepared.counts.values())
        metrics = scoring.score_on_raw_test_split(
            champion_dir, source, config.data.split, kept, config.evaluation
        )
        metric = config.registry.gate_metric
        if metric in metrics:
            logger.info("champion on this test split: %s %.4f", metric, metrics[metric])
        return metrics

    return rescore


def _publish(
    config: PipelineConfig,
    reg: registration.Registration,
    evaluated: Evaluated,
    drifted: Drifted | None,
    ws,
    logger,
) -> None:
    """The version and the gate's decision in the log; the gate's report, the version's
    model card (also logged with its MLflow run) and a link to the version as Prefect
    artifacts."""
    from trainflow.pipelines.registry import card, registration

    verdict = "champion" if reg.champion else "champion unchanged"
    logger.info("registered %s version %s; %s: %s", reg.name, reg.version, verdict, reg.decision.reason)
    key = render.artifact_key(config.name)
    create_markdown_artifact(
        key=f"{key}-gate",
        markdown=render.gate_report_markdown(reg, config.name, evaluated),
        description=f"{reg.name}: the promotion gate's decision and the test report",
    )
    # The card's "Drift at training time": the drift step's table, or why it had none.
    drift = drifted and (
        render.drift_table(drifted.summary, drifted.rows) if drifted.rows else drifted.summary
    )
    create_markdown_artifact(
        key=f"{key}-card",
        markdown=card.write_card(ws, reg, config, evaluated.headline, drift=drift),
        description=f"{reg.name} version {reg.version}: the model card",
    )
    create_link_artifact(
        key=f"{key}-model",
        link=registration.model_link(ws, reg),
        link_text=f"{reg.name} version {reg.version}",
        description="The registered model version",
    )
