"""The serving step: a registered model behind HTTP on Ray Serve, until stopped."""

from __future__ import annotations

from collections.abc import Callable

from prefect import get_run_logger
from prefect.cache_policies import NO_CACHE

from trainflow.pipelines import serving
from trainflow.tasks.steps import step


@step(name="serve", cache_policy=NO_CACHE)
def serve_endpoint(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    max_replicas: int | None = None,
    cpus_per_replica: float = 1.0,
    ray_address: str | None = None,
    stop_after_s: float | None = None,
    shadow: str | None = None,
) -> str:
    """Serve ``model`` until the run is cancelled (Prefect stops its process with SIGTERM)
    or ``stop_after_s`` after it is ready; returns the URL it served at. The model, the
    port and the replicas' CPUs are checked before Ray starts. ``shadow``: an alias or
    version of the model that also answers every request, off the answer's path."""
    app = _checked_app(model, host, port, replicas, max_replicas, cpus_per_replica, ray_address, shadow)
    one_replica = replicas == 1 and max_replicas is None
    return _served(app, model, host, port, ray_address, stop_after_s, one_replica)


def _served(
    app,
    model: str,
    host: str,
    port: int,
    ray_address: str | None,
    stop_after_s: float | None,
    one_replica: bool = False,
) -> str:
    """Serve ``app`` until stopped, logging where; the URL it served at ("" if never ready)."""
    logger = get_run_logger()
    served: list[str] = []
    serving.serve_until_stopped(
        app,
        host=host,
        port=port,
        on_ready=_announce(logger, model, served),
        ray_address=ray_address,
        stop_after_s=stop_after_s,
        model_kind=serving.model_kind(model),
        one_replica=one_replica,
    )
    logger.info("stopped serving %s", model)
    return served[0] if served else ""


def _checked_app(model, host, port, replicas, max_replicas, cpus_per_replica, ray_address, shadow):
    """The Serve application of ``model``, once the port is free and the replicas fit."""
    application = serving.app(
        model, replicas=replicas, max_replicas=max_replicas, cpus_per_replica=cpus_per_replica, shadow=shadow
    )
    serving.check_port(host, port)
    serving.check_fits((max_replicas or replicas) + bool(shadow), cpus_per_replica, ray_address)
    return application


def _announce(logger, model: str, served: list[str]) -> Callable[[str], None]:
    def ready(url: str) -> None:
        served.append(url)
        logger.info("serving %s at %s (POST %s/predict, GET %s/model, docs %s/docs)", model, *[url] * 4)

    return ready
