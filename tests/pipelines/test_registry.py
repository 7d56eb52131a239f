import shutil

import numpy as np
import pandas as pd
import pytest

from trainflow.config import ModelConfig, PipelineConfig, RegistryConfig
from trainflow.pipelines import registry
from trainflow.pipelines.checkpoint import save_checkpoint
from trainflow.pipelines.models import build_model, model_spec
from trainflow.pipelines.preprocess import Preprocessor
from trainflow.runtime import workspace


def make_checkpoint(folder, seed=0):
    import torch

    torch.manual_seed(seed)
    spec = model_spec(ModelConfig(kind="mlp", hidden_sizes=[4]), 2, 2)
    save_checkpoint(
        folder,
        model=build_model(spec),
        spec=spec,
        preprocessor=Preprocessor(["a", "b"], "label", [0, 1], False).to_dict(),
        config=PipelineConfig().model_dump(mode="json"),
        metrics={"epoch": 1},
    )
    return str(folder)


def register(ws, folder, accuracy, gate=None, fingerprint="test-a"):
    return registry.register_checkpoint(
        ws,
        name="toy",
        checkpoint_dir=folder,
        params={"train": {"lr": 0.1}},
        metrics={"accuracy": accuracy, "macro_f1": accuracy},
        history=[{"epoch": 1, "train_loss": 0.9}, {"epoch": 2, "train_loss": 0.5}],
        tags={registry.TEST_FINGERPRINT_TAG: fingerprint},
        gate=gate or RegistryConfig(min_value=0.5),
    )


def test_gate_promotes_only_a_better_model(trainflow_home, tmp_path):
    ws = workspace()
    first = register(ws, make_checkpoint(tmp_path / "c1"), 0.80)
    assert first.version == "1" and first.champion
    worse = register(ws, make_checkpoint(tmp_path / "c2"), 0.70)
    assert worse.version == "2" and not worse.champion
    assert "improvement -0.1000 < 0.0" in worse.decision.reason
    better = register(ws, make_checkpoint(tmp_path / "c3"), 0.90)
    assert better.champion and better.decision.champion_version == "1"
    assert better.decision.same_test_data is True
    c = registry.client(ws)
    assert str(c.get_model_version_by_alias("toy", "champion").version) == "3"
    v2 = c.get_model_version("toy", "2")
    assert v2.tags["gate.passed"] == "False" and v2.tags["gate.candidate"] == "0.7"
    run = c.get_run(better.run_id)
    assert run.data.params["train.lr"] == "0.1" and run.data.metrics["test_accuracy"] == 0.9
    assert [m.step for m in c.get_metric_history(better.run_id, "train_loss")] == [1, 2]


def test_min_value_blocks_even_the_first_model(trainflow_home, tmp_path):
    reg = register(workspace(), make_checkpoint(tmp_path / "c"), 0.4, gate=RegistryConfig(min_value=0.9))
    assert not reg.champion and "below min_value 0.9" in reg.decision.reason


def test_decide_with_a_required_improvement():
    gate = RegistryConfig(min_improvement=0.02, min_value=0.5)
    assert not registry.decide("accuracy", 0.91, 0.90, gate, champion_version="1").passed
    assert registry.decide("accuracy", 0.93, 0.90, gate, champion_version="1").passed


def test_a_registered_model_loads_after_its_checkpoint_folder_is_gone(trainflow_home, tmp_path):
    ws = workspace()
    folder = make_checkpoint(tmp_path / "run" / "checkpoint", seed=3)
    register(ws, folder, 0.8)
    frame = pd.DataFrame({"a": [0.1, -2.0, 3.0], "b": [1.0, 0.0, -1.0]})
    from trainflow.pipelines.checkpoint import load_checkpoint

    expected = load_checkpoint(folder).predict_proba(frame)
    shutil.rmtree(tmp_path / "run")
    for uri in ("toy", "toy@champion", "toy/1", "models:/toy@champion", "models:/toy/1"):
        np.testing.assert_allclose(registry.load_model(uri, ws).predict_proba(frame), expected, rtol=1e-6)


def test_bad_model_uris(trainflow_home):
    from mlflow.exceptions import MlflowException

    with pytest.raises(ValueError, match="use NAME@ALIAS"):
        registry.resolve(workspace(), "a/b/c")
    with pytest.raises(MlflowException):
        registry.resolve(workspace(), "nobody@champion")
