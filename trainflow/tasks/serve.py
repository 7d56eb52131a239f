"""The serving flow's step as a Prefect task: a registered model behind HTTP, until stopped."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.pipelines import serving


@task(name="serve", cache_policy=NO_CACHE)
def serve_endpoint(
    model: str,
    host: str,
    port: int,
    replicas: int,
    max_replicas: int | None,
    cpus_per_replica: float,
    ray_address: str | None,
    stop_after_s: float | None,
) -> str:
    """Serve ``model`` until the run is cancelled (Prefect stops its process with SIGTERM)
    or ``stop_after_s`` after it is ready; returns the URL it served at. The model, the
    port and the replicas' CPUs are checked before Ray starts."""
    logger = get_run_logger()
    application = serving.app(
        model, replicas=replicas, max_replicas=max_replicas, cpus_per_replica=cpus_per_replica
    )
    serving.check_port(host, port)
    serving.check_fits(max_replicas or replicas, cpus_per_replica, ray_address)
    served: list[str] = []

    def ready(url: str) -> None:
        served.append(url)
        logger.info(
            "serving %s at %s (POST %s/predict, GET %s/model, docs %s/docs)", model, url, url, url, url
        )

    serving.serve_until_stopped(
        application,
        host=host,
        port=port,
        on_ready=ready,
        ray_address=ray_address,
        stop_after_s=stop_after_s,
        model_kind=serving.model_kind(model),
    )
    logger.info("stopped serving %s", model)
    return served[0] if served else ""
