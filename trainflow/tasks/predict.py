"""The batch prediction steps: resolve a registered model, check the input, predict."""

from __future__ import annotations

import time

from prefect import get_run_logger
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from trainflow import run_checks
from trainflow.cluster.checks import check_shipped
from trainflow.cluster.session import connected
from trainflow.pipelines.evaluation import predict as prediction
from trainflow.pipelines.evaluation.predict_input import InputInfo
from trainflow.pipelines.registry import lineage, versions
from trainflow.run_checks import ModelRef
from trainflow.tasks.steps import step


class Predicted(BaseModel):
    """What the predict step wrote, and from what."""

    model: str
    """The model asked for, as MLflow names it (``models:/digits@champion``)."""
    version: str
    """The version number that predicted."""
    input: str
    """The rows read: a file, a folder or a URI."""
    output: str
    """Where the predictions were written."""
    rows: int
    """Rows predicted."""
    seconds: float
    """Wall time of the prediction."""


def _retry_unless_refused(_task, _task_run, state) -> bool:
    # An unknown model or an altered checkpoint stays so; a registry that was busy may not.
    error = state.result(raise_on_failure=False)
    return not isinstance(error, versions.RegistryError | lineage.IntegrityError)


@step(
    name="resolve-model",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=[2, 10],
    retry_condition_fn=_retry_unless_refused,
)
def resolve_model(model: str) -> ModelRef:
    """The registered version behind NAME@ALIAS, NAME/VERSION or models:/..., checked and
    local, pinned to its version."""
    ref = run_checks.model(model, pin=True)
    get_run_logger().info(
        "%s is %s version %s (%d features)", model, ref.name, ref.version, len(ref.input_columns)
    )
    return ref


@step(name="check-input", cache_policy=NO_CACHE)
def check_input(input: str, output: str, model: ModelRef) -> InputInfo:
    """The input holds every feature the model needs, and the output is free: in this
    process, before any Ray worker starts."""
    info = run_checks.predict_input(input, output, model)
    get_run_logger().info("input %s (%s, %d files)", info.path, info.format, len(info.files))
    return info


@step(name="predict", cache_policy=NO_CACHE)
def predict(
    model: ModelRef | str,
    input: InputInfo | str,
    output: str,
    batch_size: int = 1024,
    concurrency: int = 1,
    use_gpu: bool = False,
) -> Predicted:
    """Every row of ``input`` through a pool of ``concurrency`` Ray Data actors, each
    holding ``model`` (a registered version, or its reference) with its saved
    preprocessing, into Parquet in the new folder ``output``; connects to Ray when the
    caller has not. A model or input given by name is checked first."""
    start = time.perf_counter()
    ref = model if isinstance(model, ModelRef) else run_checks.model(model, pin=True)
    info = input if isinstance(input, InputInfo) else run_checks.predict_input(input, output, ref)
    _connected(ref)
    rows = _predicted_rows(ref, info, output, batch_size, concurrency, use_gpu)
    get_run_logger().info("wrote %d predictions of %s v%s to %s", rows, ref.name, ref.version, output)
    seconds = time.perf_counter() - start
    return Predicted(
        model=ref.uri, version=ref.version, input=info.path, output=output, rows=rows, seconds=seconds
    )


def _predicted_rows(
    ref: ModelRef, info: InputInfo, output: str, batch_size: int, concurrency: int, use_gpu: bool
) -> int:
    """Predict ``info``'s rows with ``ref`` into ``output`` on Ray Data; the rows written."""
    return prediction.predict_to_parquet(
        info,
        ref.checkpoint,
        output,
        version=ref.version,
        input_columns=ref.input_columns,
        batch_size=batch_size,
        concurrency=concurrency,
        num_gpus=1 if use_gpu else 0,
    )


def _connected(ref: ModelRef) -> None:
    """Ray, connected when the caller has not; on a cluster started elsewhere, checked to
    run this driver's versions and import the model's module."""
    cluster = ref.cluster()
    connected(cluster, get_run_logger())
    check_shipped(get_run_logger(), modules=cluster.user_modules)
