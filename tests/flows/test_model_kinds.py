"""Training flows with torchvision architectures and a user's own model, on the session's
Ray cluster and Prefect server: trained, registered, loaded and predicting."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import trainflow
from tests.flows.test_training_pipeline import flow_logs, task_runs
from tests.pipelines.test_sources import write_mnist_raw
from trainflow.config import load_config
from trainflow.flows.training import training_pipeline
from trainflow.pipelines.models.build import initial_model
from trainflow.testing import small_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def grey_folder(root: Path, per_class=12, size=32) -> Path:
    """Three classes of grayscale images told apart by brightness."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for k, name in enumerate(["dark", "mid", "light"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(rng.normal(40 + 80 * k, 15, size=(size, size)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(root / name / f"{i}.png")
    return root


def test_a_torchvision_resnet18_fine_tunes_on_grey_images_registers_and_predicts_folder_names(
    tmp_path, ray_cluster, prefect_harness, trainflow_home
):
    root = grey_folder(tmp_path / "grey")
    torch.manual_seed(0)
    weights = tmp_path / "resnet18-imagenet-shaped.pt"  # 3 channels, 1,000 classes, as the hub's
    torch.save(__import__("torchvision.models").models.resnet18().state_dict(), weights)
    config = load_config(
        small_config(
            name="grey-resnet",
            data={"source": str(root), "image_mode": "L", "split": {"val": 0.25, "test": 0.25}},
            preprocess={"image_size": [32, 32]},
            model={"kind": "torchvision:resnet18", "weights": str(weights), "freeze": ["conv1", "layer1"]},
            train={"epochs": 1, "batch_size": 8, "lr": 0.01},
        )
    )
    state = training_pipeline(config=config, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result.registered.version == "1"

    predictor = trainflow.load_model("grey-resnet@champion")
    spec = predictor.spec
    assert spec["kind"] == "torchvision:resnet18" and spec["input_shape"] == [1, 32, 32]
    assert predictor.model.net.conv1.in_channels == 1 and predictor.model.net.fc.out_features == 3
    # The frozen parameters left training bit-identical; the rest moved.
    start = initial_model(spec)
    trained = dict(predictor.model.named_parameters())
    frozen = [n for n, p in start.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith(("net.conv1.", "net.layer1.")) for n in frozen)
    for name, param in start.named_parameters():
        assert torch.equal(trained[name], param) == (name in frozen), name
    counts = spec["parameters"]
    line = f"{counts['trainable']:,} of {counts['total']:,} parameters train"
    assert counts["trainable"] < counts["total"]
    assert any(line in log for log in flow_logs(state.state_details.flow_run_id))

    from PIL import Image

    images = [np.asarray(Image.open(root / name / "0.png")) for name in ("dark", "light")]
    answers = predictor.predict(pd.DataFrame({"image": images}))
    assert set(answers) <= {"dark", "mid", "light"} and len(answers) == 2


def test_the_fashion_mnist_resnet18_config_runs_on_a_small_slice(
    ray_cluster, prefect_harness, trainflow_home
):
    write_mnist_raw(trainflow_home / "cache" / "torchvision" / "FashionMNIST" / "raw", n_train=60, n_test=20)
    config = load_config(
        REPO / "configs" / "fashion-mnist-resnet18.yaml",
        ["data.limit=60", "train.epochs=1", "scaling.num_workers=1", "registry.min_value=0"],
    )
    state = training_pipeline(config=config, return_state=True)
    assert state.is_completed(), state.message
    predictor = trainflow.load_model("fashion-mnist-resnet18/1")
    assert predictor.model.net.conv1.in_channels == 1 and predictor.spec["input_shape"] == [1, 28, 28]
    assert predictor.preprocessor.input_columns == ["image"] and predictor.preprocessor.image["shape"] == [
        1,
        28,
        28,
    ]
    # The dataset's own class names, in its order: what predictions answer.
    assert predictor.classes[:2] == ["T-shirt/top", "Trouser"] and len(predictor.classes) == 10
    answers = predictor.predict(pd.DataFrame({"image": list(np.zeros((2, 28, 28), np.uint8))}))
    assert set(answers) <= set(predictor.classes) and len(answers) == 2


def test_a_users_module_trains_on_workers_that_lack_it_and_loading_needs_it(
    tmp_path, ray_cluster, prefect_harness, trainflow_home, monkeypatch
):
    import ray

    # The example's own model (examples/custom_model/resmlp.py), under a name of this test's.
    code = tmp_path / "code"
    code.mkdir()
    (code / "kinds_flow_net.py").write_text((REPO / "examples" / "custom_model" / "resmlp.py").read_text())
    monkeypatch.syspath_prepend(str(code))  # the driver's path only: the cluster started before

    @ray.remote(num_cpus=0)
    def importable() -> bool:
        import importlib.util

        return importlib.util.find_spec("kinds_flow_net") is not None

    assert not ray.get(importable.remote())  # the session's workers do not have it by themselves
    # The example's config on a small slice, one worker.
    config = load_config(
        REPO / "examples" / "custom_model" / "digits-resmlp.yaml",
        [
            "name=digits-own",
            "model.kind=kinds_flow_net:build",
            "model.args={width: 12, depth: 1, dropout: 0.0}",
            "data.limit=300",
            "train.epochs=2",
            "train.lr=0.01",
            "train.batch_size=32",
            "scaling.num_workers=1",
            "registry.min_value=null",
        ],
    )
    state = training_pipeline(config=config, return_state=True)
    assert state.is_completed(), state.message
    assert state.result().test_metrics["accuracy"] > 0.3
    predictor = trainflow.load_model("digits-own/1")
    assert predictor.spec["args"] == {"width": 12, "depth": 1, "dropout": 0.0}
    assert predictor.model.net[1].out_features == 12

    # Where the module is missing, loading the model fails in one line naming it.
    load = "import trainflow; trainflow.load_model('digits-own/1')"
    out = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, cwd=REPO)
    assert out.returncode != 0
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "model.kind kinds_flow_net:build: module 'kinds_flow_net' is not importable here; put it on "
            "PYTHONPATH or run from the folder that holds it"
        )
    )


# A model module that imports on the driver but not in a Ray worker: as one that imports a
# package only the driver's machine has.
DRIVER_ONLY_NET = """
import ray

if ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
    raise ModuleNotFoundError("No module named 'driver_only_lib'", name="driver_only_lib")

from torch import nn


def build(input_shape, num_outputs, **_):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], num_outputs))
"""


def test_a_model_module_the_workers_cannot_import_fails_the_run_in_one_line_without_retries(
    tmp_path, ray_cluster, prefect_harness, trainflow_home, monkeypatch
):
    code = tmp_path / "code"
    code.mkdir()
    (code / "driver_only_net.py").write_text(DRIVER_ONLY_NET)
    monkeypatch.syspath_prepend(str(code))
    # No retries by Ray Train (failure.max_failures: 0): each would start the workers again.
    config = small_config(name="driver-only", data={"limit": 200}, failure={"max_failures": 0})
    config["model"] = {"kind": "driver_only_net:build"}
    state = training_pipeline(config=config, return_state=True)
    assert state.is_failed()
    assert state.message.count("\n") == 0, state.message
    assert (
        "model.kind driver_only_net:build: importing driver_only_net failed: No module named "
        "'driver_only_lib' (on the Ray Train workers)" in state.message
    ), state.message

    train = [t for t in task_runs(state.state_details.flow_run_id) if t.name.startswith("train")]
    assert [t.run_count for t in train] == [1]  # the train task's retry skips an error that comes back
