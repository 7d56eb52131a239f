"""The training pipeline: ingest -> preprocess -> (drift) -> train -> evaluate -> register."""

# No `from __future__ import annotations` here: Prefect builds the flow's parameter
# model from these annotations, and a deployment's run fails to when they are strings.

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from trainflow import run_checks
from trainflow.cluster import preflight, ray_session
from trainflow.config import ConfigError, PipelineConfig, load_config, smoke_config
from trainflow.files import redacted
from trainflow.run_checks import RunChecks
from trainflow.tasks import (
    evaluate,
    ingest,
    one_training_at_a_time,
    preprocess,
    register,
    render,
    step_times,
    train,
)
from trainflow.tasks.logs import one_line_expected_errors
from trainflow.tasks.results import Evaluated, PipelineResult, Prepared, Registered, Trained
from trainflow.tasks.steps import StepTimes
from trainflow.workspace import storage_location

# The bundled digits job: what a deployment runs when given no config.
DEFAULT_CONFIG = PipelineConfig()
STEPS = ("ingest", "preprocess", "train", "evaluate", "register")  # the summary's, in order


def resolve_config(
    config: PipelineConfig | str, overrides: list[str] | None = None, smoke: bool = False
) -> PipelineConfig:
    """The run's config from a flow parameter: a config (used as it is), or a YAML/JSON
    path in the checkout; ``overrides`` and ``smoke`` applied on top."""
    if isinstance(config, PipelineConfig) and not overrides and not smoke:
        return config
    resolved = load_config(config, overrides or [])
    return smoke_config(resolved) if smoke else resolved


def run_name() -> str:
    """A flow run's name says what ran: the model's name and the config's hash."""
    params = flow_run.parameters
    try:
        config = resolve_config(
            params.get("config", DEFAULT_CONFIG), params.get("overrides"), params.get("smoke", False)
        )
    except ConfigError:
        return "invalid-config"
    return f"{config.name}-{config.config_hash()[:8]}"


# Retries live on the tasks (a retried train task resumes its Ray run); results stay
# small and are not persisted.
@flow(name="training-pipeline", flow_run_name=run_name, persist_result=False)
def training_pipeline(
    config: PipelineConfig | str = DEFAULT_CONFIG,
    overrides: list[str] | None = None,
    smoke: bool = False,
    resume: bool = False,
    checked: RunChecks | None = None,
) -> PipelineResult:
    """Train, evaluate and register one model.

    Args:
        config: the run's config, or the path of a YAML/JSON config in the checkout.
        overrides: dotted overrides applied on top, such as ``["train.lr=0.01"]``.
        smoke: a quick end-to-end check: a sample of the data, one epoch, one worker,
            registered as ``<name>-smoke``.
        resume: continue the latest unfinished training of this config and data from its
            latest checkpoint; refused when that run is of another config or data.
        checked: the caller's checks of this config (``run_checks.before_run``); None: the
            flow checks for itself."""
    one_line_expected_errors()
    config = resolve_config(config, overrides, smoke)
    # check: the model, the source and what the run asks of the cluster, before any Ray worker starts
    checked = checked or run_checks.before_run(config, resume=resume)
    if resume and checked.resume is None:
        get_run_logger().info(
            "no unfinished run of %s under %s to resume: starting a new one",
            config.name,
            redacted(storage_location(config)),
        )
    with step_times() as steps:
        # ingest: skipped (cached) when the input's fingerprint and the data config are unchanged
        source = ingest(config, checked.source)
        # one training of the model at a time, on one Ray session
        with one_training_at_a_time(config), ray_session(config, get_run_logger(), warm=checked.warm):
            # what ScalingConfig asks, against the cluster: fail now rather than wait forever
            fitted = preflight(config, get_run_logger())
            # preprocess: skipped (cached) when its prepared entry exists
            prepared = preprocess(config, source)
            # drift: with a drift section, the train split against the champion's (block stops here)
            drifted = _drifted(config, prepared)
            # train: on the fitted workers, its own Ray run or the one to resume (a retry re-fits them)
            trained = train(
                config, prepared, checked.resume.run_name if checked.resume else None, fitted.scaling
            )
            # evaluate
            evaluated = evaluate(config, prepared, trained)
            # register: the champion alias moves only if the gate passes
            registered = register(config, source, prepared, trained, evaluated, drifted)
    return _summarized(config, prepared, trained, evaluated, registered, steps)


def _drifted(config: PipelineConfig, prepared: Prepared):
    """The drift step's result with a drift section, else None; the step's module is
    imported only then."""
    if not config.drift:
        return None
    from trainflow.tasks import drift

    return drift(config, prepared)


def _summarized(
    config: PipelineConfig,
    prepared: Prepared,
    trained: Trained,
    evaluated: Evaluated,
    registered: Registered,
    steps: StepTimes,
) -> PipelineResult:
    """The run's result, logged and published as its summary artifact."""
    # The drift step is in the summary when it ran (a drift section set).
    ran = (*STEPS[:2], "drift", *STEPS[2:]) if "drift" in steps.seconds else STEPS
    timings, cached = steps.of(ran)
    result = PipelineResult(
        name=config.name,
        config_hash=config.config_hash(),
        test_metrics=evaluated.headline,
        registered=registered,
        checkpoint=trained.best_checkpoint,
        prepared_reused=prepared.reused or "preprocess" in cached,
        timings=timings,
        cached=cached,
    )
    logger = get_run_logger()
    if cached:
        logger.info("%s: cached from an earlier run with the same data and config", " and ".join(cached))
    create_markdown_artifact(
        key=f"{render.artifact_key(config.name)}-summary", markdown=render.summary_markdown(result)
    )
    logger.info("done: %s", render.summary_line(result))
    return result
