"""Batch prediction: a registered model over new data, into Parquet."""

# No `from __future__ import annotations`: Prefect builds the flow's parameter model
# from these annotations.

import time

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from trainflow import run_checks
from trainflow.cluster import ray_session
from trainflow.run_checks import PredictChecks
from trainflow.tasks import check_input, predict, render, resolve_model
from trainflow.tasks.logs import one_line_expected_errors
from trainflow.tasks.predict import Predicted


@flow(name="batch-predict", flow_run_name="predict-{model}", persist_result=False)
def batch_predict(
    model: str,
    input: str,
    output: str,
    batch_size: int = 1024,
    concurrency: int = 1,
    use_gpu: bool = False,
    ray_address: str | None = None,
    checked: PredictChecks | None = None,
) -> Predicted:
    """Predict every row of ``input`` with a registered model and write Parquet to ``output``.

    Args:
        model: ``NAME@ALIAS``, ``NAME/VERSION`` or ``models:/NAME@ALIAS``.
        input: a Parquet or CSV file, or a folder of them, holding the model's feature columns.
        output: a new folder; written complete or not at all.
        batch_size: rows per batch in each actor.
        concurrency: actors in the pool, each holding the model once.
        use_gpu: one GPU per actor.
        ray_address: a running Ray cluster; None: RAY_ADDRESS, else a local one.
        checked: the caller's checks (``run_checks.before_predict``); None: the flow checks."""
    one_line_expected_errors()
    start = time.perf_counter()
    # resolve the model and check the input and the cluster's address, before Ray starts
    ref = checked.model if checked else resolve_model(model)
    info = checked.input if checked else check_input(input, output, ref)
    cluster = ref.cluster(ray_address)
    if not checked:
        run_checks.cluster(cluster, workers=None, gpus_per_actor=1 if use_gpu else 0)
    # predict: no warm-up workers, the prediction's actor pool starts processes of its own
    with ray_session(cluster):
        predicted = predict(ref, info, output, batch_size, concurrency, use_gpu)
    predicted = predicted.model_copy(update={"seconds": time.perf_counter() - start})
    create_markdown_artifact(
        key=f"{render.artifact_key(ref.name)}-predictions",
        markdown=render.predictions_markdown(
            ref.name, ref.version, predicted.rows, input, output, predicted.seconds, concurrency, batch_size
        ),
    )
    return predicted
