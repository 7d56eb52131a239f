"""The sweep pipeline: ingest -> preprocess -> sweep (Ray Tune) -> evaluate -> register the best."""

# No `from __future__ import annotations` here: Prefect builds the flow's parameter
# model from these annotations, and a deployment's run fails to when they are strings.

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from trainflow import run_checks
from trainflow.cluster import ray_session
from trainflow.cluster.preflight import preflight_sweep
from trainflow.config import ConfigError, PipelineConfig
from trainflow.flows.training import resolve_config
from trainflow.run_checks import RunChecks
from trainflow.tasks import evaluate, ingest, one_training_at_a_time, preprocess, register, render, step_times
from trainflow.tasks.logs import one_line_expected_errors
from trainflow.tasks.results import Evaluated, Registered, SweepResult, Swept
from trainflow.tasks.steps import StepTimes
from trainflow.tasks.sweep import sweep


def run_name() -> str:
    params = flow_run.parameters
    try:
        config = resolve_config(params["config"], params.get("overrides"))
    except (ConfigError, KeyError):
        return "invalid-config"
    return f"{config.name}-sweep-{config.config_hash()[:8]}"


@flow(name="sweep-pipeline", flow_run_name=run_name, persist_result=False)
def sweep_pipeline(
    config: PipelineConfig | str, overrides: list[str] | None = None, checked: RunChecks | None = None
) -> SweepResult:
    """Try many settings in parallel on Ray Tune, stop the weak early, register the best.

    Args:
        config: a config with a ``sweep`` section, or the path of a YAML/JSON one.
        overrides: dotted overrides applied on top, such as ``["sweep.trials=16"]``.
        checked: what the caller's checks of this config found (``run_checks.before_run`` with
            ``sweep=True``); None: the flow checks for itself.
    """
    one_line_expected_errors()
    config = resolve_config(config, overrides)
    # check: the sweep section, the source and whether one trial fits the cluster, before
    # any Ray worker starts
    checked = checked or run_checks.before_run(config, sweep=True)
    with step_times() as steps:
        # ingest: cached across runs
        source = ingest(config, checked.source)
        with ray_session(config, get_run_logger(), warm=checked.warm):
            # how many trials fit side by side, each with sweep.scaling's workers
            max_concurrent = preflight_sweep(config, get_run_logger())
            # preprocess once for every trial (cached across runs)
            prepared = preprocess(config, source)
            # sweep: the trials on Ray Tune; ASHA stops the weak ones early
            swept = sweep(config, prepared, max_concurrent=max_concurrent)
            best = PipelineConfig.model_validate(swept.best_config)
            with one_training_at_a_time(config):
                # evaluate the best trial's best checkpoint on the test split
                evaluated = evaluate(best, prepared, swept.trained)
                # register it with the best trial's config; the champion moves only if the gate passes
                registered = register(best, source, prepared, swept.trained, evaluated)
    return _summarized(config, swept, max_concurrent, evaluated, registered, steps)


def _summarized(
    config: PipelineConfig,
    swept: Swept,
    max_concurrent: int,
    evaluated: Evaluated,
    registered: Registered,
    steps: StepTimes,
) -> SweepResult:
    """The sweep's result, logged and published as its artifact."""
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
        timings=steps.of(("ingest", "preprocess", "sweep", "evaluate", "register"))[0],
    )
    best_config = Path(result.best_config_path).read_text()
    create_markdown_artifact(
        key=f"{render.artifact_key(config.name)}-sweep",
        markdown=render.sweep_markdown(result, config.sweep.metric, best_config),
    )
    get_run_logger().info(
        "done: best trial %s registered as %s", swept.best_trial, render.summary_line(result)
    )
    return result
