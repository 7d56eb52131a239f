"""model.kind's three forms built from their specs: trainflow's own, torchvision's
architectures and a user's module; weights, freeze, and the errors, each one line."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from trainflow.config import ConfigError, ModelConfig, load_config
from trainflow.pipelines.models.build import build_model, first_conv, initial_model, model_spec
from trainflow.pipelines.models.checkpoint import load_checkpoint
from trainflow.pipelines.models.kinds import check_model

FIXTURE = Path(__file__).parent.parent / "data" / "checkpoint-0.1.0"


def spec_of(kind, shape=(1, 16, 16), outputs=3, **model):
    features = int(torch.tensor(shape).prod())
    return model_spec(ModelConfig(kind=kind, **model), features, outputs, image_shape=list(shape))


@pytest.mark.parametrize(
    "name, first, args",
    [
        ("resnet18", "conv1", {}),
        ("mobilenet_v3_small", "features.0.0", {}),
        ("efficientnet_b0", "features.0.0", {}),
        ("convnext_tiny", "features.0.0", {}),
        ("vit_b_16", "conv_proj", {"image_size": 32}),
    ],
)
def test_torchvision_architectures_take_one_channel_images_through_a_new_first_conv(name, first, args):
    spec = spec_of(f"torchvision:{name}", shape=(1, 32, 32), args=args)
    json.dumps(spec)
    model = build_model(spec)
    conv_name, conv = first_conv(model.net)
    reference = first_conv(getattr(__import__("torchvision.models").models, name)(**args))[1]
    assert conv_name == first and conv.in_channels == 1
    for attr in ("out_channels", "kernel_size", "stride", "padding", "dilation"):
        assert getattr(conv, attr) == getattr(reference, attr), attr
    assert (conv.bias is None) == (reference.bias is None)
    assert model.eval()(torch.randn(4, 32 * 32)).shape == (4, 3)
    assert spec["input_shape"] == [1, 32, 32] and spec["num_outputs"] == 3


def test_three_channels_keep_torchvisions_own_first_conv_and_the_spec_counts_parameters():
    spec = spec_of("torchvision:resnet18", shape=(3, 16, 16), outputs=5)
    model = build_model(spec)
    assert model.net.conv1.in_channels == 3 and model.net.fc.out_features == 5
    total = sum(p.numel() for p in model.parameters())
    assert spec["parameters"] == {"total": total, "trainable": total}


def test_freeze_keeps_named_prefixes_frozen_and_counts_what_trains():
    spec = spec_of("torchvision:resnet18", freeze=["conv1", "layer1"])
    model = initial_model(spec)
    frozen = {n for n, p in model.net.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith(("conv1.", "layer1.")) for n in frozen)
    assert model.net.layer2[0].conv1.weight.requires_grad and model.net.fc.weight.requires_grad
    counts = spec["parameters"]
    assert counts["total"] - counts["trainable"] == sum(
        p.numel() for n, p in model.net.named_parameters() if n in frozen
    )
    with pytest.raises(
        ConfigError, match=r"^model\.freeze 'layer9' names no parameter .*: conv1, bn1, layer1"
    ):
        spec_of("torchvision:resnet18", freeze=["layer9"])


def test_a_weights_file_loads_by_name_with_a_new_head_and_an_adapted_first_conv(tmp_path):
    torch.manual_seed(0)
    source = __import__("torchvision.models").models.resnet18()  # 3 channels, 1,000 classes
    torch.save(source.state_dict(), tmp_path / "r18.pt")
    spec = spec_of("torchvision:resnet18", weights=str(tmp_path / "r18.pt"))
    assert spec["weights_file"] == str((tmp_path / "r18.pt").resolve())
    model = initial_model(spec).net
    assert torch.equal(model.layer3[1].conv2.weight, source.layer3[1].conv2.weight)
    # One grey channel reads as the sum of the pretrained filter's red, green and blue.
    assert torch.allclose(model.conv1.weight[:, 0], source.conv1.weight.sum(dim=1), atol=1e-6)
    assert model.fc.out_features == 3  # the head starts anew for the data's classes
    # A checkpoint rebuilds the architecture alone: the weights are provenance.
    assert not torch.equal(build_model(spec).net.layer3[1].conv2.weight, source.layer3[1].conv2.weight)
    torch.save({"conv1.weight": torch.zeros(64, 3, 3, 3)}, tmp_path / "bad.pt")
    with pytest.raises(
        ConfigError, match=r"^model\.weights .*bad\.pt: conv1\.weight has shape \[64, 3, 3, 3\]"
    ):
        spec_of("torchvision:resnet18", weights=str(tmp_path / "bad.pt"))


def test_a_torchvision_weights_name_not_in_the_hub_cache_says_where_to_put_it(tmp_path, monkeypatch):
    import torch.hub

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    # No network, on any machine: torch's own download code runs against a loopback port
    # where nothing listens.
    from torchvision.models import ResNet18_Weights

    monkeypatch.setattr(
        ResNet18_Weights.IMAGENET1K_V1.value, "url", "http://127.0.0.1:9/resnet18-f37072fd.pth"
    )
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    expected = tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    with pytest.raises(ConfigError) as caught:
        check_model(ModelConfig(kind="torchvision:resnet18", weights="ResNet18_Weights.DEFAULT"))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("model.weights ResNet18_Weights.DEFAULT: ")
    assert message.endswith(f"download http://127.0.0.1:9/resnet18-f37072fd.pth to {expected}")
    with pytest.raises(
        ConfigError, match=r"^model\.weights NoSuch_Weights\.X: not a torchvision weights name"
    ):
        check_model(ModelConfig(kind="torchvision:resnet18", weights="NoSuch_Weights.X"))
    with pytest.raises(ConfigError, match=r"^model\.weights /no/such\.pt: no such file"):
        check_model(ModelConfig(kind="torchvision:resnet18", weights="/no/such.pt"))


def write_module(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return folder


USER_MODULE = """
    from torch import nn

    def build(input_shape, num_outputs, width=8):
        c, h, w = input_shape
        return nn.Sequential(nn.Conv2d(c, width, 3, padding=1), nn.ReLU(), nn.Flatten(),
                             nn.Linear(width * h * w, num_outputs))

    def table(input_shape, num_outputs):
        return nn.Linear(input_shape[0], num_outputs)

    def not_a_model(input_shape, num_outputs):
        return {"layers": 2}

    def broken(input_shape, num_outputs):
        raise RuntimeError("no such layer size")
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(write_module(tmp_path / "code", "kinds_user_net", USER_MODULE)))
    yield "kinds_user_net"
    sys.modules.pop("kinds_user_net", None)


def test_a_users_callable_gets_the_input_shape_outputs_and_args(user_module):
    spec = spec_of(f"{user_module}:build", shape=(1, 6, 6), outputs=4, args={"width": 5})
    assert spec["args"] == {"width": 5} and spec["input_shape"] == [1, 6, 6]
    model = build_model(spec)
    assert model.net[0].out_channels == 5 and model(torch.randn(2, 36)).shape == (2, 4)
    table = model_spec(ModelConfig(kind=f"{user_module}:table"), 7, 2)
    assert table["input_shape"] == [7] and build_model(table)(torch.randn(3, 7)).shape == (3, 2)


@pytest.mark.parametrize(
    "kind, message",
    [
        (
            "torchvision:resnet9000",
            r"no classification architecture 'resnet9000' .*close names: resnet50, .*resnet18",
        ),
        ("nosuch.module:build", r"module 'nosuch' is not importable here; put it on PYTHONPATH"),
        ("{m}:missing", r"module kinds_user_net has no 'missing'"),
        (
            "{m}:not_a_model",
            r"not_a_model\(input_shape=\[1, 16, 16\], num_outputs=3\) returned a dict, not a torch",
        ),
        ("{m}:broken", r"broken\(.*\) raised RuntimeError: no such layer size"),
        ("{m}:table", r"does not take 1-channel images of 16x16: RuntimeError"),
    ],
)
def test_a_kind_that_cannot_build_fails_in_one_line_naming_it(user_module, kind, message):
    kind = kind.format(m=user_module)
    with pytest.raises(ConfigError) as caught:
        check_model(ModelConfig(kind=kind))
        spec_of(kind)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"model.kind {kind}: ")
    assert __import__("re").search(message, str(caught.value)), str(caught.value)


def test_kinds_and_args_are_checked_with_the_config():
    with pytest.raises(ConfigError, match=r"model\.kind: .*must be mlp, cnn, torchvision:<architecture>"):
        load_config({}, ["model.kind=resnet18"])
    with pytest.raises(ConfigError, match=r"model\.args: .*args are for torchvision and your own models"):
        load_config({}, ["model.args={width: 4}"])


def test_a_spec_of_trainflow_0_1_0_still_builds():
    spec = json.loads((FIXTURE / "model.json").read_text())
    assert "num_classes" in spec and "num_outputs" not in spec
    assert build_model(spec)(torch.randn(2, 64)).shape == (2, 10)
    assert load_checkpoint(FIXTURE).spec == spec


def test_a_checkpoint_of_a_users_model_without_its_module_fails_naming_it(tmp_path, user_module):
    from trainflow.pipelines.data.preprocess import Preprocessor
    from trainflow.pipelines.models.checkpoint import save_checkpoint

    spec = model_spec(ModelConfig(kind=f"{user_module}:table"), 2, 2)
    save_checkpoint(
        tmp_path / "ckpt",
        model=build_model(spec),
        spec=spec,
        preprocessor=Preprocessor(["a", "b"], "label", [0, 1]).to_dict(),
        config={},
        metrics={},
    )
    assert isinstance(load_checkpoint(tmp_path / "ckpt").model, nn.Module)
    folder = str(tmp_path / "ckpt")
    code = f"from trainflow.pipelines.models.checkpoint import load_checkpoint\nload_checkpoint({folder!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"model.kind {user_module}:table: module '{user_module}' is not importable here; "
            "put it on PYTHONPATH or run from the folder that holds it"
        )
    )


@pytest.mark.slow  # a Ray Data actor that imports torch
def test_a_users_model_predicts_on_ray_data_actors_whose_workers_lack_its_module(
    ray_cluster, tmp_path, user_module
):
    """Batch prediction, evaluation and the gate's re-scoring load the checkpoint in Ray
    Data actors: the model's module goes with them."""
    import numpy as np
    import pandas as pd
    import ray
    import ray.data

    from trainflow.pipelines.data.preprocess import Preprocessor
    from trainflow.pipelines.evaluation.evaluate import predict_rows
    from trainflow.pipelines.models.checkpoint import save_checkpoint

    @ray.remote(num_cpus=0)
    def importable() -> bool:
        import importlib.util

        return importlib.util.find_spec(user_module) is not None

    assert not ray.get(importable.remote())  # the session's workers do not have it by themselves
    spec = model_spec(ModelConfig(kind=f"{user_module}:table"), 2, 2)
    save_checkpoint(
        tmp_path / "ckpt",
        model=build_model(spec),
        spec=spec,
        preprocessor=Preprocessor(["a", "b"], "label", [0, 1], scaler="none").to_dict(),
        config={},
        metrics={},
    )
    rows = pd.DataFrame({"a": np.linspace(-2, 2, 40), "b": np.linspace(3, -1, 40)})
    got = predict_rows(ray.data.from_pandas(rows), str(tmp_path / "ckpt"), batch_size=16).to_pandas()
    expected = load_checkpoint(tmp_path / "ckpt").predict(rows)
    assert got["prediction"].tolist() == expected.tolist()


def test_a_default_runs_model_imports_no_other_familys_module():
    """The cnn's spec, model and an old checkpoint load through the table of model kinds
    without importing Hugging Face's family, torchvision's or the user's builders."""
    others = (
        "trainflow.pipelines.models.hf",
        "trainflow.pipelines.hf_hub",
        "trainflow.pipelines.models.builders",
    )
    code = textwrap.dedent(
        f"""
        import sys
        from trainflow.config import ModelConfig
        from trainflow.pipelines.models.build import model_spec
        from trainflow.pipelines.models.checkpoint import load_checkpoint
        model_spec(ModelConfig(kind="cnn"), 64, 3)
        load_checkpoint({str(FIXTURE.with_name("checkpoint-0.2.0"))!r})
        libraries = ("transformers", "peft", "torchvision")
        print(sorted(m for m in sys.modules if m in {others!r} or m.split(".")[0] in libraries))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
