"""Whether a cluster can run what a config asks of it, before any Ray worker starts: the
training workers' CPUs and GPUs with a CPU left for Ray Data, a sweep's trials, a batch
prediction's GPU actors. Ray's own behaviour is to wait, forever, for what is not there."""

from __future__ import annotations

import logging
import math
import time

from trainflow import ray_internals
from trainflow.cluster.checks import PreflightError, check_cluster
from trainflow.cluster.session import current_session, ray_address, started_local_cluster
from trainflow.config import PipelineConfig, ScalingSection, SweepConfig

log = logging.getLogger("trainflow")


# Ray Data needs at least one CPU of its own for reads and map_batches while the
# training workers hold theirs; with none left a run waits forever.
DATA_CPU_RESERVE = 1.0


def worker_resources(scaling: ScalingSection) -> tuple[float, float]:
    """(CPUs, GPUs) that one training worker asks for, as Ray Train reads ScalingConfig."""
    res = scaling.resources_per_worker
    cpu = float(res.get("CPU", 1.0))
    gpu = float(res.get("GPU", 1.0 if scaling.use_gpu else 0.0))
    return cpu, gpu


def fit_gpu_actors(gpus_per_actor: float, total: dict[str, float]) -> None:
    """PreflightError when a cluster with ``total`` resources has no room for one actor
    of ``gpus_per_actor`` GPUs (batch prediction's ``--gpu``): Ray Data would wait for a
    GPU forever instead of failing. Fewer GPUs than actors is fine: the pool runs on the
    actors that start."""
    gpus = total.get("GPU", 0.0)
    if gpus_per_actor and gpus < gpus_per_actor:
        raise PreflightError(
            f"use_gpu (--gpu) asks for {gpus_per_actor:g} GPU per actor, the Ray cluster has {gpus:g}: "
            "predict without --gpu, or run on a cluster with GPUs"
        )


def fit_scaling(scaling: ScalingSection, total: dict[str, float]) -> ScalingSection:
    """The scaling to run on a cluster with ``total`` resources, or PreflightError saying
    what was asked, what the cluster has and what to change.

    With ``on_cpu_shortage: shrink``, workers that leave Ray Data no CPU get a smaller
    CPU share each instead (returned; the caller logs it).
    """
    cpus = total.get("CPU", 0.0)
    gpus = total.get("GPU", 0.0)
    n = scaling.min_workers  # an elastic run starts with them, and grows when there is room
    asked = f"at least {n}" if scaling.elastic else f"{n}"
    cpu_each, gpu_each = worker_resources(scaling)
    if gpu_each and n * gpu_each > gpus:
        raise PreflightError(
            f"scaling asks for {asked} workers x {gpu_each:g} GPU = {n * gpu_each:g} GPUs, "
            f"the Ray cluster has {gpus:g}: set scaling.use_gpu=false, or run on a cluster with GPUs"
        )
    for name, amount in scaling.resources_per_worker.items():
        if name in ("CPU", "GPU"):
            continue
        if n * amount > total.get(name, 0.0):
            raise PreflightError(
                f"scaling.resources_per_worker.{name}: {asked} workers x {amount:g} = {n * amount:g}, "
                f"the Ray cluster has {total.get(name, 0.0):g}"
            )
    needed = n * cpu_each + DATA_CPU_RESERVE
    if needed <= cpus:
        return scaling
    fit = int(max(cpus - DATA_CPU_RESERVE, 0.0) / n * 100) / 100  # rounded down to 0.01
    if scaling.on_cpu_shortage == "shrink" and fit >= 0.01:
        return scaling.model_copy(
            update={"resources_per_worker": {**scaling.resources_per_worker, "CPU": fit}}
        )
    raise PreflightError(
        f"scaling asks for {asked} workers x {cpu_each:g} CPU plus {DATA_CPU_RESERVE:g} CPU for "
        f"Ray Data = {needed:g} CPUs, the Ray cluster has {cpus:g}: set "
        f"scaling.resources_per_worker.CPU to at most {fit:g}, lower scaling.num_workers, "
        "or set scaling.on_cpu_shortage=shrink"
    )


def _say_once(key: tuple[str, str], logger, message: str, *args) -> None:
    """Log a warning once per session (every time without one)."""
    session = current_session()
    if session is None or key not in session.verified:
        logger.warning(message, *args)
        if session is not None:
            session.verified.add(key)


def _grow_within(scaling: ScalingSection, total: dict[str, float]) -> ScalingSection:
    """An elastic ``scaling`` whose most workers fit beside Ray Data's CPU on a cluster that
    no autoscaler grows (``total``): Ray Train grows the group into every free CPU, and a
    streamed split's reads then wait forever for one."""
    cpu_each, gpu_each = worker_resources(scaling)
    room = [(total.get("CPU", 0.0) - DATA_CPU_RESERVE) / cpu_each if cpu_each else math.inf]
    room += [total.get("GPU", 0.0) / gpu_each] if gpu_each else []
    custom = {k: v for k, v in scaling.resources_per_worker.items() if k not in ("CPU", "GPU") and v}
    room += [total.get(k, 0.0) / v for k, v in custom.items()]
    most = max(scaling.min_workers, min(scaling.max_workers, math.floor(min(room) + 1e-9)))
    if most == scaling.max_workers:
        return scaling
    return scaling.model_copy(update={"num_workers": (scaling.min_workers, most)})


def _worker_bundles(scaling: ScalingSection) -> list[dict[str, float]]:
    cpu, gpu = worker_resources(scaling)
    bundle = {**scaling.resources_per_worker, "CPU": cpu, **({"GPU": gpu} if gpu else {})}
    return [bundle] * scaling.min_workers + [{"CPU": DATA_CPU_RESERVE}]


def preflight(config: PipelineConfig, logger: logging.Logger | logging.LoggerAdapter = log) -> PipelineConfig:
    """Fail now, with what to change, when the cluster cannot run the training workers, where
    Ray would wait without end (for GPUs that do not exist, or CPUs the workers and Ray Data
    both need); return the config to run (its scaling shrunk when the config allows it, said
    once per session). Then what a cluster needs beyond resources (``checks.check_cluster``).
    On an autoscaling cluster, ``scaling.wait_for_resources_s`` waits that long for the
    autoscaler."""
    import ray

    scaling = config.scaling
    if scaling.in_process:  # no workers: the flow's own process trains
        _in_process_here()
        check_cluster(config, logger)
        return config
    fitted = _fitted_scaling(scaling, logger)
    if fitted is not scaling:
        _say_once(
            ("shrunk", scaling.model_dump_json()),
            logger,
            "scaling.resources_per_worker.CPU %g leaves Ray Data no CPU on this cluster (%g CPUs): "
            "running %d workers with %g CPU each (scaling.on_cpu_shortage=shrink)",
            worker_resources(scaling)[0],
            ray.cluster_resources().get("CPU", 0.0),
            scaling.min_workers,
            fitted.resources_per_worker["CPU"],
        )
    if fitted.elastic and started_local_cluster():
        grown = _grow_within(fitted, ray.cluster_resources())
        if grown is not fitted:
            _say_once(
                ("grown within", scaling.model_dump_json()),
                logger,
                "scaling.num_workers %s: this local Ray cluster holds %d workers beside Ray Data's "
                "CPU; the run grows to %d at most",
                list(scaling.num_workers),
                grown.max_workers,
                grown.max_workers,
            )
        fitted = grown
    check_cluster(config, logger)
    return config.model_copy(update={"scaling": fitted})


def _in_process_here() -> None:
    """PreflightError when this process reaches its cluster through Ray Client, whose
    driver is off the cluster: ``scaling.num_workers`` 0 would train there."""
    from ray.util.client import ray as client

    if client.is_connected():
        raise PreflightError(
            "scaling.num_workers 0 trains in the flow's own process, and this one reaches its Ray "
            "cluster through Ray Client (ray://), off the cluster: give num_workers 1 or more"
        )


def _fitted_scaling(scaling: ScalingSection, logger) -> ScalingSection:
    """:func:`fit_scaling` on the connected cluster, waiting up to
    ``scaling.wait_for_resources_s`` for an autoscaler to add what is missing."""
    import ray
    from ray.autoscaler.sdk import request_resources

    deadline = time.monotonic() + scaling.wait_for_resources_s
    requested = False
    try:
        while True:
            try:
                return fit_scaling(scaling, ray.cluster_resources())
            except PreflightError as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    if requested:
                        raise PreflightError(f"{e} (waited {scaling.wait_for_resources_s:g} s)") from None
                    raise
                if not requested:
                    logger.info("waiting up to %.0f s for the cluster to scale up: %s", left, e)
                    request_resources(bundles=_worker_bundles(scaling))
                    requested = True
                time.sleep(min(1.0, left))
    finally:
        if requested:
            request_resources(bundles=[])  # the trainer's own placement group holds them now


def preflight_local(config: PipelineConfig, sweep: bool = False, gpus_per_actor: float = 0) -> None:
    """PreflightError now, before Ray starts, when the run will start a local
    Ray cluster that cannot hold its training workers (or one sweep trial, or, given
    ``gpus_per_actor``, one prediction actor): a GPU on a machine without one, more CPUs
    than it has. A run on a cluster elsewhere is checked by :func:`preflight` once
    connected."""
    import ray

    if ray.is_initialized() or ray_address(config):
        return
    total = ray_internals.local_cluster_resources()
    if total is None:
        return
    try:
        if gpus_per_actor:
            fit_gpu_actors(gpus_per_actor, total)
        elif sweep and config.sweep is not None:
            sweep_concurrency(config.sweep, total)
        else:
            fit_scaling(config.scaling, total)
    except PreflightError as e:
        raise PreflightError(
            str(e).replace("the Ray cluster has", "the local Ray cluster on this machine would have")
        ) from None


def sweep_concurrency(sweep: SweepConfig, total: dict[str, float]) -> int:
    """How many trials run at once: each trial's workers (``sweep.scaling``) side by side,
    with one CPU left for Ray Data, capped by ``sweep.max_concurrent``. PreflightError
    when not even one trial fits, saying what to change."""
    scaling = sweep.scaling
    try:
        fit_scaling(scaling.model_copy(update={"on_cpu_shortage": "fail"}), total)
    except PreflightError as e:
        reason = (
            str(e)
            .replace("scaling.", "sweep.scaling.")
            .replace(", or set sweep.scaling.on_cpu_shortage=shrink", "")
        )
        raise PreflightError(f"one sweep trial does not fit: {reason}") from None
    n = scaling.num_workers
    cpu_each, gpu_each = worker_resources(scaling)
    fits = [
        math.floor((total.get("CPU", 0.0) - DATA_CPU_RESERVE) / (n * cpu_each) + 1e-9)
        if cpu_each
        else sweep.trials
    ]
    if gpu_each:
        fits.append(math.floor(total.get("GPU", 0.0) / (n * gpu_each) + 1e-9))
    for name, amount in scaling.resources_per_worker.items():
        if name not in ("CPU", "GPU") and amount:
            fits.append(math.floor(total.get(name, 0.0) / (n * amount) + 1e-9))
    return max(1, min([*fits, sweep.max_concurrent or math.inf]))


def preflight_sweep(config: PipelineConfig, logger: logging.Logger | logging.LoggerAdapter = log) -> int:
    """Fail now when one trial cannot run on the cluster; return how many run at once."""
    import ray

    sweep = config.sweep
    total = ray.cluster_resources()
    concurrency = sweep_concurrency(sweep, total)
    fit_all = sweep_concurrency(sweep.model_copy(update={"max_concurrent": None}), total)
    if sweep.max_concurrent and sweep.max_concurrent > fit_all:
        logger.warning(
            "sweep.max_concurrent %d: the Ray cluster (%g CPUs) fits %d trials of %d workers x %s "
            "at once, with a CPU for Ray Data; running %d at a time",
            sweep.max_concurrent,
            total.get("CPU", 0.0),
            fit_all,
            sweep.scaling.num_workers,
            sweep.scaling.resources_per_worker,
            fit_all,
        )
    check_cluster(config, logger)
    return concurrency
