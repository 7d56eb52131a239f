"""An example to copy into your own project: check a config end to end before you ship it.

With ``pytest_plugins = ["trainflow.testing"]`` in your ``conftest.py``, the fixtures
give the test a local Ray cluster, Prefect's test server and a private TRAINFLOW_HOME
(cache, runs and MLflow registry). A smoke run trains a sample for one epoch on one
worker and registers it as ``<name>-smoke``, so it takes well under a minute and never
touches the real model's champion.
"""

from pathlib import Path

from trainflow.flows.training import training_pipeline

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "digits.yaml"  # your config here


def test_my_config_runs_end_to_end(ray_cluster, prefect_harness, trainflow_home):
    result = training_pipeline(config=str(CONFIG), smoke=True)

    assert result.registered.name == "digits-smoke"
    assert result.registered.version == "1"
    assert 0.0 < result.test_metrics["accuracy"] <= 1.0
    assert (trainflow_home / "mlflow.db").is_file()
