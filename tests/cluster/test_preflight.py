"""Preflight: what the config asks of the cluster is checked before fit(), not waited on."""

import logging
import time

import pytest

from tests.cluster.hang import answers
from trainflow.cluster.checks import PreflightError
from trainflow.cluster.preflight import fit_scaling, preflight
from trainflow.config import PipelineConfig, ScalingSection


def config(**scaling) -> PipelineConfig:
    return PipelineConfig(scaling=ScalingSection(**scaling))


def cluster_gpus() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def test_more_gpus_than_the_cluster_has_fail_at_once(ray_cluster):
    # One worker more than the cluster has GPUs: 0 on a CPU machine, any number elsewhere.
    gpus = cluster_gpus()
    n = gpus + 1
    with pytest.raises(
        PreflightError,
        match=rf"{n} workers x 1 GPU = {n} GPUs, the Ray cluster has {gpus}: set scaling.use_gpu=false",
    ):
        answers(lambda: preflight(config(num_workers=n, use_gpu=True)))


def test_gpu_workers_fit_a_cluster_that_declares_gpus(ray_cluster):
    import ray

    total = {**ray.cluster_resources(), "GPU": 2.0}
    gpu = ScalingSection(num_workers=2, use_gpu=True)
    assert fit_scaling(gpu, total) is gpu
    with pytest.raises(PreflightError, match=r"3 workers x 1 GPU = 3 GPUs, the Ray cluster has 2"):
        fit_scaling(ScalingSection(num_workers=3, use_gpu=True), total)


def test_more_cpus_than_the_cluster_has_fail_with_what_fits(ray_cluster):
    import ray

    cpus = ray.cluster_resources()["CPU"]
    with pytest.raises(PreflightError, match=r"set scaling.resources_per_worker.CPU to at most"):
        answers(lambda: preflight(config(num_workers=int(cpus) + 1, resources_per_worker={"CPU": 1})))
    # Workers that take every CPU leave none for Ray Data: the run would hang.
    with pytest.raises(PreflightError, match=r"plus 1 CPU for Ray Data"):
        preflight(config(num_workers=int(cpus), resources_per_worker={"CPU": 1}))


def test_an_elastic_run_needs_its_min_workers_to_fit_not_its_max():
    total = {"CPU": 2.0}
    elastic = ScalingSection(num_workers=(1, 8), resources_per_worker={"CPU": 1})
    assert fit_scaling(elastic, total) is elastic
    with pytest.raises(PreflightError, match=r"scaling asks for at least 2 workers x 1 CPU plus 1 CPU"):
        fit_scaling(ScalingSection(num_workers=(2, 8), resources_per_worker={"CPU": 1}), total)


def test_an_elastic_run_on_a_local_cluster_grows_only_as_far_as_ray_data_keeps_a_cpu(ray_cluster, caplog):
    import ray

    cpus = ray.cluster_resources()["CPU"]
    fits = int((cpus - 1) / 0.5)  # half-CPU workers beside Ray Data's CPU
    with caplog.at_level(logging.WARNING, logger="trainflow"):
        scaling = preflight(config(num_workers=(1, fits + 5), resources_per_worker={"CPU": 0.5})).scaling
    assert scaling.num_workers == (1, fits)
    assert f"this local Ray cluster holds {fits} workers beside Ray Data's CPU" in caplog.text
    within = config(num_workers=(1, fits), resources_per_worker={"CPU": 0.5})
    assert preflight(within).scaling.num_workers == (1, fits)


def test_shrink_gives_each_worker_what_fits_and_says_so(ray_cluster, caplog):
    import ray

    cpus = ray.cluster_resources()["CPU"]
    asked = config(num_workers=int(cpus), resources_per_worker={"CPU": 1}, on_cpu_shortage="shrink")
    with caplog.at_level(logging.WARNING, logger="trainflow"):
        run = preflight(asked)
    each = run.scaling.resources_per_worker["CPU"]
    assert 0 < each <= (cpus - 1) / int(cpus)
    assert "leaves Ray Data no CPU" in caplog.text and f"with {each:g} CPU each" in caplog.text
    assert run.train == asked.train and asked.scaling.resources_per_worker == {"CPU": 1}


def test_an_autoscaling_wait_asks_for_the_resources_then_gives_up(ray_cluster):
    gpus = cluster_gpus()
    start = time.monotonic()
    with pytest.raises(PreflightError, match=rf"the Ray cluster has {gpus}: .*\(waited 2 s\)"):
        answers(lambda: preflight(config(num_workers=gpus + 1, use_gpu=True, wait_for_resources_s=2)))
    assert time.monotonic() - start >= 2  # it did wait for the scale-up it asked for


def test_unknown_custom_resources_fail(ray_cluster):
    with pytest.raises(
        PreflightError, match=r"resources_per_worker.TPU: 2 workers x 1 = 2, the Ray cluster has 0"
    ):
        preflight(config(num_workers=2, resources_per_worker={"CPU": 0.5, "TPU": 1}))


def test_the_default_scaling_fits_a_two_core_machine(ray_cluster):
    assert preflight(PipelineConfig()) == PipelineConfig()


def test_sweep_concurrency_fits_trials_beside_a_cpu_for_ray_data():
    from trainflow.cluster.preflight import sweep_concurrency
    from trainflow.config import SweepConfig

    one_worker = SweepConfig(space={"train.lr": {"choice": [0.1]}})  # 1 worker x 0.5 CPU
    assert sweep_concurrency(one_worker, {"CPU": 2.0}) == 2
    assert sweep_concurrency(one_worker, {"CPU": 8.0}) == 14
    assert sweep_concurrency(one_worker.model_copy(update={"max_concurrent": 3}), {"CPU": 8.0}) == 3
    gpus = one_worker.model_copy(
        update={"scaling": ScalingSection(num_workers=2, use_gpu=True, resources_per_worker={"CPU": 1})}
    )
    assert sweep_concurrency(gpus, {"CPU": 16.0, "GPU": 4.0}) == 2
    too_big = one_worker.model_copy(update={"scaling": ScalingSection(num_workers=4)})
    with pytest.raises(
        PreflightError, match=r"one sweep trial does not fit: .*set sweep\.scaling\.resources_per_worker"
    ):
        sweep_concurrency(too_big, {"CPU": 2.0})
