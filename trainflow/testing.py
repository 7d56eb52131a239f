"""Pytest fixtures for testing flows locally, with the real Ray, Prefect and MLflow.

Use them from your own ``conftest.py``::

    pytest_plugins = ["trainflow.testing"]

    def test_my_config(ray_cluster, prefect_harness, trainflow_home):
        result = training_pipeline(config=load_config("configs/mine.yaml", ["train.epochs=1"]))
        assert result.registered.version == "1"

``ray_cluster`` and ``prefect_harness`` start once per session (each takes seconds to
start, longer than a small test runs); ``trainflow_home`` gives each test its
own working folders and MLflow registry (a copy of an empty one made once per session),
and ``module_trainflow_home`` gives a module's tests one, so that data prepared by the
first run is reused by the others.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


def small_config(**sections) -> dict:
    """A digits config that trains in seconds: an MLP, one epoch, one half-CPU worker.

    One worker, since each worker is a process that imports torch: a test about several
    workers (sharding, DDP, a rank other than 0) asks for them,
    ``small_config(scaling={"num_workers": 2})``. Sections given are merged into these.
    """
    config: dict = {
        "name": "digits-test",
        "model": {"kind": "mlp", "hidden_sizes": [32]},
        "train": {"epochs": 1, "batch_size": 32, "lr": 0.01},
        "scaling": {"num_workers": 1},
        "registry": {"min_value": None},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the session, with at least 2 CPUs (the default scaling's need)."""
    import ray

    from trainflow.cluster.quiet import LOCAL_CLUSTER_ENV, configure_ray_data, quiet_token_auth_notice
    from trainflow.cluster.session import ray_init_kwargs
    from trainflow.cluster.watch import cluster_marked, end_cluster
    from trainflow.ray_internals import drop_worker_noise
    from trainflow.ray_internals.switches import agent_port_of_the_systems_choosing

    if ray.is_initialized():
        yield
        return
    # What trainflow gives the local clusters it starts (no preemption watcher, Ray's
    # token-auth notice dropped), for the session's.
    for key, value in LOCAL_CLUSTER_ENV.items():
        os.environ.setdefault(key, value)
    quiet_token_auth_notice()
    # Always a cluster of the session's own, never one that `ray start` left running.
    agent_port_of_the_systems_choosing()  # as trainflow's own local clusters: other nodes may run here
    with cluster_marked() as mark:
        ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), **ray_init_kwargs())
    drop_worker_noise()
    configure_ray_data()
    yield
    ray.shutdown()
    end_cluster(mark)


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """Prefect's temporary test server and database, once per session."""
    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture(scope="session")
def empty_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded MLflow registry database with its tables created and nothing in it,
    made once per session by trainflow's own registry code. Each home below starts from a
    copy: creating the tables runs MLflow's migrations, CPU that each test would pay again,
    and a copy of an empty one is the same registry."""
    from trainflow.pipelines.registry import store
    from trainflow.workspace import Workspace

    ws = Workspace(tmp_path_factory.mktemp("empty-registry")).ensure()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        store.client(ws)
    return ws.mlflow_db


def _new_home(home: Path, empty_registry: Path) -> Path:
    home.mkdir(parents=True)
    shutil.copyfile(empty_registry, home / empty_registry.name)
    return home


@pytest.fixture
def trainflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_registry: Path) -> Path:
    """A fresh TRAINFLOW_HOME (cache, runs, embedded MLflow registry) for one test."""
    home = _new_home(tmp_path / "trainflow-home", empty_registry)
    monkeypatch.setenv("TRAINFLOW_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture(scope="module")
def module_trainflow_home(tmp_path_factory: pytest.TempPathFactory, empty_registry: Path) -> Iterator[Path]:
    """One TRAINFLOW_HOME for a module's tests: the first run prepares its data's splits and
    the others find them in the cache. Give each test's model a name of its own, so that
    what one test registers does not change what another finds in the registry."""
    home = _new_home(tmp_path_factory.mktemp("module-home") / "trainflow-home", empty_registry)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINFLOW_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield home
