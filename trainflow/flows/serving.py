"""Serving as a Prefect flow: a deployment (re)starts the HTTP endpoint of a registered
model, which runs as long as the flow run does."""

# No `from __future__ import annotations`: Prefect builds the flow's parameter model
# from these annotations.

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from trainflow.tasks.logs import one_line_expected_errors
from trainflow.tasks.render import artifact_key
from trainflow.tasks.serving import serve_endpoint


@flow(name="shadow-report", flow_run_name="shadow-report-{model}", persist_result=False)
def shadow_report(model: str = "digits") -> dict:
    """Publish what shadowing a challenger showed (``trainflow models serve MODEL --shadow
    ALIAS``): per pair of versions, the answers' agreement or difference, each model's
    time, and the labelled feedback's score, as the ``<model>-shadow`` Markdown artifact.
    Returns the comparison as ``GET /shadow`` shows it.

    Args:
        model: the registered model's name.
    """
    from trainflow.pipelines.serving import shadow
    from trainflow.workspace import workspace

    one_line_expected_errors()
    summary = shadow.read_shadow(workspace(), model)
    create_markdown_artifact(
        key=f"{artifact_key(model)}-shadow",
        markdown=shadow.summary_markdown(summary),
        description=f"{model}: the champion's answers beside its shadowed challenger's",
    )
    return summary


@flow(name="serve-model", flow_run_name="serve-{model}", persist_result=False)
def serve_model(
    model: str = "digits@champion",
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    max_replicas: int | None = None,
    cpus_per_replica: float = 1.0,
    ray_address: str | None = None,
    stop_after_s: float | None = None,
    shadow: str | None = None,
) -> str:
    """Serve a registered model over HTTP on Ray Serve until the flow run is cancelled;
    returns the URL it served at.

    Args:
        model: ``NAME``, ``NAME@ALIAS`` (followed as it moves) or ``NAME/VERSION``.
        host: the address to listen on; 127.0.0.1 keeps it on this machine.
        port: the HTTP port.
        replicas: Serve replicas, each holding the model once.
        max_replicas: instead, from one up to this many as the load asks.
        cpus_per_replica: CPUs Ray reserves per replica.
        ray_address: a running Ray cluster; None: RAY_ADDRESS, else a local one.
        stop_after_s: stop this long after the endpoint is ready; None: when cancelled.
        shadow: an alias or version that also answers every request, off the answers'
            path (``GET /shadow``)."""
    one_line_expected_errors()
    return serve_endpoint(
        model, host, port, replicas, max_replicas, cpus_per_replica, ray_address, stop_after_s, shadow
    )
