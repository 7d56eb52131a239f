"""The training pipeline: ingest -> preprocess -> train -> evaluate -> register."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from trainflow.config import PipelineConfig
from trainflow.runtime import preflight, ray_session
from trainflow.tasks import evaluate, ingest, preprocess, register, train
from trainflow.tasks.results import PipelineResult
from trainflow.tasks.steps import artifact_key


def _run_name() -> str:
    config = flow_run.parameters.get("config")
    if not isinstance(config, PipelineConfig):
        config = PipelineConfig.model_validate(config or {})
    return f"{config.name}-{config.config_hash()[:8]}"


# The bundled digits job: what a deployment runs when given no config.
DEFAULT_CONFIG = PipelineConfig()


def timed(step, *args) -> tuple[Any, float]:
    """Call a task and measure its wall time, retries included, for the run's summary."""
    start = time.perf_counter()
    out = step(*args)
    return out, time.perf_counter() - start


@flow(name="training-pipeline", flow_run_name=_run_name)
def training_pipeline(config: PipelineConfig = DEFAULT_CONFIG) -> PipelineResult:
    """Train, evaluate and register one model from one config."""
    logger = get_run_logger()
    timings: dict[str, float] = {}

    # ingest: in the driver, before any Ray worker starts, so bad input fails fast
    ingested, timings["ingest"] = timed(ingest, config)

    with ray_session(config):
        preflight(config.scaling)
        # preprocess
        prepared, timings["preprocess"] = timed(preprocess, config, ingested)
        # train: one Ray run per flow run, so a retry of the task resumes it
        run_name = f"{config.name}-{str(flow_run.id or 'local')[:8]}"
        trained, timings["train"] = timed(train, config, prepared, run_name)
        # evaluate
        evaluated, timings["evaluate"] = timed(evaluate, config, prepared, trained)

    # register: the champion alias moves only if the gate passes
    registered, timings["register"] = timed(register, config, ingested, prepared, trained, evaluated)

    result = PipelineResult(
        name=config.name,
        config_hash=config.config_hash(),
        test_metrics=evaluated.headline,
        registered=registered,
        checkpoint=trained.best_checkpoint,
        prepared_reused=prepared.reused,
        timings=timings,
    )
    create_markdown_artifact(key=f"{artifact_key(config.name)}-summary", markdown=summary_markdown(result))
    logger.info("done: %s", one_line(result))
    return result


def one_line(r: PipelineResult) -> str:
    reg = r.registered
    return (
        f"{reg.name} v{reg.version} test accuracy {r.test_metrics['accuracy']:.4f}, "
        f"{'now champion' if reg.champion else 'champion unchanged'}"
    )


def summary_markdown(r: PipelineResult) -> str:
    reg = r.registered
    rows = "\n".join(f"| {step} | {seconds:.1f} |" for step, seconds in r.timings.items())
    metrics = "\n".join(f"| {k} | {v:.4f} |" for k, v in r.test_metrics.items())
    return (
        f"# {reg.name} version {reg.version}\n\n"
        f"{'Promoted to **champion**' if reg.champion else 'Champion unchanged'}: "
        f"{reg.decision['reason']}\n\n"
        f"| test metric | value |\n|---|---|\n{metrics}\n\n"
        f"| step | seconds |\n|---|---|\n{rows}\n\n"
        f"Config hash `{r.config_hash}`; checkpoint `{r.checkpoint}`"
        f"{'; prepared splits reused from the cache' if r.prepared_reused else ''}.\n"
    )
