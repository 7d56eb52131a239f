"""Batch prediction: a registered model over new data, into Parquet."""

# No `from __future__ import annotations`: Prefect builds the flow's parameter model
# from these annotations.

import time

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from trainflow import checks
from trainflow.cluster.checks import check_shipped
from trainflow.cluster.session import ray_session
from trainflow.flows.logs import one_line_expected_errors
from trainflow.tasks import render
from trainflow.tasks.predict import Predicted, check_input, predict, resolve_model


@flow(name="batch-predict", flow_run_name="predict-{model}", persist_result=False)
def batch_predict(
    model: str,
    input: str,
    output: str,
    batch_size: int = 1024,
    concurrency: int = 1,
    use_gpu: bool = False,
    ray_address: str | None = None,
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
    """
    one_line_expected_errors()
    start = time.perf_counter()
    # resolve the model and check the input and the cluster's address, before Ray starts
    ref = resolve_model(model)
    info = check_input(input, output, ref)
    cluster = ref.cluster(ray_address)
    checks.cluster(cluster, workers=None, gpus_per_actor=1 if use_gpu else 0)
    # predict: no warm-up workers, the prediction's actor pool starts processes of its own
    with ray_session(cluster):
        # on a cluster started elsewhere: its versions, and that it imports a user's model
        check_shipped(get_run_logger(), module=cluster.model.user_module)
        rows = predict(info, output, ref, batch_size, concurrency, use_gpu)
    result = Predicted(
        model=ref.uri,
        version=ref.version,
        input=input,
        output=output,
        rows=rows,
        seconds=time.perf_counter() - start,
    )
    create_markdown_artifact(
        key=f"{render.artifact_key(ref.name)}-predictions",
        markdown=render.predictions_markdown(
            ref.name, ref.version, rows, input, output, result.seconds, concurrency, batch_size
        ),
    )
    return result
