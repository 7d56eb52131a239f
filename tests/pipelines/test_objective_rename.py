"""A regression registered by a release before ``objective`` (its checkpoint's
preprocessor.json and config.json spell ``task``) loads, predicts, reports its objective and
rebuilds its exact config, as one registered now does."""

import json
import warnings

import mlflow
import numpy as np
import pytest

from tests.pipelines.test_pyfunc import mlflow_registry  # noqa: F401 - a fixture
from tests.pipelines.test_registry import FRAME, make_checkpoint
from trainflow.config import PipelineConfig, RegistryConfig, RenamedKey
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.registry import lineage, registration, reproduce, versions
from trainflow.pipelines.registry.lineage import CONFIG_HASH_TAG, DATA_FINGERPRINT_TAG, GIT_COMMIT_TAG

PRE = Preprocessor(
    ["a", "b"], "y", [], scaler="none", objective="regression", label_offset=150.0, label_scale=70.0
)
CONFIG = PipelineConfig(objective="regression", registry=RegistryConfig(gate_metric="rmse", min_value=None))


def _register(ws, folder, old: bool) -> registration.Registration:
    """A regression's version; ``old``: its files as the release before the rename wrote them."""
    make_checkpoint(folder, seed=1, pre=PRE)
    config = CONFIG.model_dump(mode="json")
    preprocessor = PRE.to_dict()
    if old:
        config["task"] = config.pop("objective")
        preprocessor["task"] = preprocessor.pop("objective")
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "preprocessor.json").write_text(json.dumps(preprocessor))
    tags = {CONFIG_HASH_TAG: CONFIG.config_hash(), DATA_FINGERPRINT_TAG: "d", GIT_COMMIT_TAG: "c"}
    return registration.register_checkpoint(
        ws,
        name="old" if old else "new",
        checkpoint_dir=str(folder),
        params={},
        metrics={"rmse": 50.0, "mae": 40.0, "r2": 0.4},
        history=[{"epoch": 1, "train_loss": 0.9}],
        tags={lineage.TEST_FINGERPRINT_TAG: "t", **tags},
        gate=CONFIG.registry,
    )


def test_a_version_registered_before_the_rename_loads_predicts_and_rebuilds_its_config(
    mlflow_registry,  # noqa: F811
    tmp_path,
):
    ws = mlflow_registry
    _register(ws, tmp_path / "old", old=True)
    _register(ws, tmp_path / "new", old=False)
    assert "task" in json.loads((tmp_path / "old" / "preprocessor.json").read_text())
    old = versions.load_model("old@champion", ws)
    new = versions.load_model("new@champion", ws)
    assert old.objective == new.objective == old.task == "regression"
    expected = new.predict(FRAME)
    np.testing.assert_array_equal(old.predict(FRAME), expected)  # in the label's units, as the new one
    np.testing.assert_array_equal(mlflow.pyfunc.load_model("models:/old@champion").predict(FRAME), expected)
    # Its exact config is rebuilt, hashing as registered, without a warning the user cannot act on.
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedKey)
        found = reproduce.original(ws, "old/1")
    assert found.config == CONFIG


def test_a_preprocessor_saved_with_task_reads_it_as_objective():
    state = {**PRE.to_dict()}
    state["task"] = state.pop("objective")
    assert Preprocessor.from_dict(state) == PRE
    assert "objective" in PRE.to_dict() and "task" not in PRE.to_dict()
    with pytest.raises(TypeError):
        Preprocessor.from_dict({**PRE.to_dict(), "bogus": 1})
