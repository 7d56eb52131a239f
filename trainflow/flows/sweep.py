"""The sweep pipeline: ingest -> preprocess -> sweep (Ray Tune) -> evaluate -> register the best."""

# No `from __future__ import annotations` here: Prefect builds the flow's parameter
# model from these annotations, and a served run fails to when they are strings.

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from trainflow import checks
from trainflow.cluster.preflight import preflight_sweep
from trainflow.cluster.session import ray_session
from trainflow.config import ConfigError, PipelineConfig
from trainflow.flows.logs import one_line_expected_errors
from trainflow.flows.training import one_run_per_model, resolve_config, timed
from trainflow.tasks import evaluate, ingest, preprocess, register, render
from trainflow.tasks.results import SweepResult
from trainflow.tasks.sweep import sweep


def _run_name() -> str:
    params = flow_run.parameters
    try:
        config = resolve_config(params["config"], params.get("overrides"))
    except (ConfigError, KeyError):
        return "invalid-config"
    return f"{config.name}-sweep-{config.config_hash()[:8]}"


@flow(name="sweep-pipeline", flow_run_name=_run_name, persist_result=False)
def sweep_pipeline(config: PipelineConfig | str, overrides: list[str] | None = None) -> SweepResult:
    """Try many settings in parallel on Ray Tune, stop the weak early, register the best.

    Args:
        config: a config with a ``sweep`` section, or the path of a YAML/JSON one.
        overrides: dotted overrides applied on top, such as ``["sweep.trials=16"]``.
    """
    one_line_expected_errors()
    logger = get_run_logger()
    config = resolve_config(config, overrides)
    timings: dict[str, float] = {}

    # check: the sweep section, the source and whether one trial fits the cluster, before
    # any Ray worker starts (the command's own checks, when it checked first)
    checked = checks.before_run(config, sweep=True)
    # ingest: cached across runs
    source, timings["ingest"] = timed(ingest, config, checked.source)
    with ray_session(config, logger, warm=checked.warm):
        # how many trials fit side by side, each with sweep.scaling's workers
        max_concurrent = preflight_sweep(config, logger)
        # preprocess once for every trial (cached across runs)
        prepared, timings["preprocess"] = timed(preprocess, config, source)
        # sweep: the trials on Ray Tune; ASHA stops the weak ones early
        name = f"{config.name}-sweep-{str(flow_run.id or 'local')[:8]}"
        swept, timings["sweep"] = timed(sweep, config, prepared, name, max_concurrent)
        best = PipelineConfig.model_validate(swept.best_config)
        with one_run_per_model(config.name, logger):
            # evaluate the best trial's best checkpoint on the test split
            evaluated, timings["evaluate"] = timed(evaluate, best, prepared, swept.trained)
            # register it with the best trial's config; the champion moves only if the gate passes
            registered, timings["register"] = timed(
                register, best, source, prepared, swept.trained, evaluated
            )

    result = SweepResult(
        name=config.name,
        sweep=swept.name,
        trials=swept.trials,
        best_trial=swept.best_trial,
        best_config_path=swept.best_config_path,
        max_concurrent=max_concurrent,
        test_metrics=evaluated.headline,
        registered=registered,
        checkpoint=swept.trained.best_checkpoint,
        timings=timings,
    )
    best_config = Path(result.best_config_path).read_text()
    create_markdown_artifact(
        key=f"{render.artifact_key(config.name)}-sweep",
        markdown=render.sweep_markdown(result, config.sweep.metric, best_config),
    )
    logger.info("done: best trial %s registered as %s", swept.best_trial, render.summary_line(result))
    return result
