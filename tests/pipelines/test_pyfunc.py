"""Every registered version loads through MLflow's own API, as trainflow loads it."""

import shutil

import mlflow
import numpy as np
import pandas as pd
import pytest

from tests.pipelines.test_registry import FRAME, make_checkpoint, register
from trainflow.pipelines.registry import lineage, store, versions
from trainflow.workspace import workspace


@pytest.fixture
def mlflow_registry(trainflow_home, monkeypatch):
    # trainflow's embedded registry, its experiment made as trainflow makes it (artifacts
    # beside the database); then MLflow pointed at it as a user points it
    # (MLFLOW_TRACKING_URI; the tracking store too, else MLflow opens its default,
    # ./mlflow.db, to download the artifacts). Through the environment, which the test's
    # end restores: mlflow.set_tracking_uri would also set it, and restoring MLflow's
    # previous URI that way leaves MLFLOW_TRACKING_URI naming ./mlflow.db for every later
    # test and subprocess of the session.
    ws = workspace()
    store.experiment_id(store.client(ws), ws)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.tracking_uri(ws))
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", store.tracking_uri(ws))
    return ws


def test_pyfunc_load_model_predicts_as_trainflow_does(mlflow_registry, tmp_path):
    ws = mlflow_registry
    register(ws, make_checkpoint(tmp_path / "c1", seed=1), 0.8)
    model = mlflow.pyfunc.load_model("models:/toy@champion")
    expected = versions.load_model("toy@champion").predict(FRAME)
    np.testing.assert_array_equal(model.predict(FRAME), expected)
    inputs = model.metadata.get_input_schema()
    assert inputs.input_names() == ["a", "b"] and inputs.input_types()[0].name == "double"
    # The signature says double: MLflow refuses integer columns (it will not narrow
    # int64 to float64 silently) and takes them cast.
    ints = pd.DataFrame({"a": [0, -2, 3], "b": [1, 0, -1]})
    with pytest.raises(mlflow.exceptions.MlflowException, match="column a"):
        model.predict(ints)
    np.testing.assert_array_equal(
        model.predict(ints.astype(float)), versions.load_model("toy/1").predict(ints)
    )
    # A frame without a column the model reads is refused by MLflow, naming it.
    with pytest.raises(mlflow.exceptions.MlflowException, match="b"):
        model.predict(FRAME[["a"]])


def test_the_flavor_files_are_registered_and_hashed(mlflow_registry, tmp_path):
    ws = mlflow_registry
    register(ws, make_checkpoint(tmp_path / "c1"), 0.8)
    folder = versions.local_checkpoint(ws, versions.resolve(ws, "toy/1"))
    requirements = (folder / "requirements.txt").read_text().splitlines()
    assert any(r.startswith("trainflow==") for r in requirements)
    assert any(r.startswith("torch==") for r in requirements)
    assert "python_function" in (folder / "MLmodel").read_text()
    (folder / "MLmodel").write_text("altered")
    with pytest.raises(lineage.IntegrityError, match="MLmodel"):
        versions.local_checkpoint(ws, versions.resolve(ws, "toy/1"))


def test_a_version_whose_mlmodel_names_the_old_loader_module_still_loads(mlflow_registry, tmp_path):
    ws = mlflow_registry
    register(ws, make_checkpoint(tmp_path / "c1", seed=1), 0.8)
    folder = versions.local_checkpoint(ws, versions.resolve(ws, "toy/1"))
    mlmodel = (folder / "MLmodel").read_text()
    assert "loader_module: trainflow.pipelines.registry.pyfunc" in mlmodel
    # The same files with MLmodel as older versions carry it: the loader module at its old path.
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    (old / "MLmodel").write_text(
        mlmodel.replace("trainflow.pipelines.registry.pyfunc", "trainflow.pipelines.pyfunc")
    )
    model = mlflow.pyfunc.load_model(str(old))
    np.testing.assert_array_equal(model.predict(FRAME), versions.load_model("toy/1").predict(FRAME))
