"""The batch prediction flow's steps as Prefect tasks."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from trainflow import checks
from trainflow.checks import ModelRef
from trainflow.pipelines import registry
from trainflow.pipelines.evaluation import predict as pr


class Predicted(BaseModel):
    model: str
    version: str
    input: str
    output: str
    rows: int
    seconds: float


def _retry_unless_refused(task, task_run, state) -> bool:
    # An unknown model or an altered checkpoint stays so; a registry that was busy may not.
    error = state.result(raise_on_failure=False)
    return not isinstance(error, registry.RegistryError | registry.IntegrityError)


@task(
    name="resolve-model",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=[2, 10],
    retry_condition_fn=_retry_unless_refused,
)
def resolve_model(model: str) -> ModelRef:
    """The registered version behind NAME@ALIAS, NAME/VERSION or models:/..., checked and local
    (the command's own check, when it checked first)."""
    ref = checks.model(model)
    get_run_logger().info(
        "%s is %s version %s (%d features)", model, ref.name, ref.version, len(ref.input_columns)
    )
    return ref


@task(name="check-input", cache_policy=NO_CACHE)
def check_input(input: str, output: str, model: ModelRef) -> pr.InputInfo:
    """The input holds every feature the model needs, and the output is free: in the driver,
    before any Ray worker starts (the command's own check, when it checked first)."""
    info = checks.predict_input(input, output, model)
    get_run_logger().info("input %s (%s, %d files)", info.path, info.format, len(info.files))
    return info


@task(name="predict", cache_policy=NO_CACHE)
def predict(
    info: pr.InputInfo, output: str, model: ModelRef, batch_size: int, concurrency: int, use_gpu: bool
) -> int:
    """Every row through an actor pool with the model's saved preprocessing, into Parquet."""
    rows = pr.predict_to_parquet(
        info,
        model.checkpoint,
        output,
        version=model.version,
        input_columns=model.input_columns,
        batch_size=batch_size,
        concurrency=concurrency,
        num_gpus=1 if use_gpu else 0,
    )
    get_run_logger().info("wrote %d predictions of %s v%s to %s", rows, model.name, model.version, output)
    return rows
