"""Preflight: what the config asks of the cluster is checked before fit(), not waited on."""

import time

import pytest

from trainflow.config import ScalingSection
from trainflow.runtime import PreflightError, preflight


def test_gpus_asked_of_a_cpu_cluster_fail_at_once(ray_cluster):
    start = time.monotonic()
    with pytest.raises(
        PreflightError, match=r"2 workers x 1 GPU = 2 GPUs, the Ray cluster has 0: set scaling.use_gpu=false"
    ):
        preflight(ScalingSection(num_workers=2, use_gpu=True))
    assert time.monotonic() - start < 10


def test_more_cpus_than_the_cluster_has_fail_with_what_fits(ray_cluster):
    import ray

    cpus = ray.cluster_resources()["CPU"]
    with pytest.raises(PreflightError, match=r"set scaling.resources_per_worker.CPU to at most"):
        preflight(ScalingSection(num_workers=int(cpus) + 1, resources_per_worker={"CPU": 1}))
    # Workers that take every CPU leave none for Ray Data: the run would hang.
    with pytest.raises(PreflightError, match=r"plus 1 CPU for Ray Data"):
        preflight(ScalingSection(num_workers=int(cpus), resources_per_worker={"CPU": 1}))


def test_unknown_custom_resources_fail(ray_cluster):
    with pytest.raises(
        PreflightError, match=r"resources_per_worker.TPU: 2 workers x 1 = 2, the Ray cluster has 0"
    ):
        preflight(ScalingSection(num_workers=2, resources_per_worker={"CPU": 0.5, "TPU": 1}))


def test_the_default_scaling_fits_a_two_core_machine(ray_cluster):
    preflight(ScalingSection())
