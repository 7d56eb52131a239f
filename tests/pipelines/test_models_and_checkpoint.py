import json

import numpy as np
import pandas as pd
import pytest
import torch

from trainflow.config import ConfigError, ModelConfig, PipelineConfig
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.models.build import build_model, initial_model, model_spec
from trainflow.pipelines.models.checkpoint import load_checkpoint, metrics_json, save_checkpoint


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_models_map_features_to_class_logits(kind):
    spec = model_spec(ModelConfig(kind=kind), num_features=64, num_outputs=10)
    json.dumps(spec)
    assert build_model(spec)(torch.randn(5, 64)).shape == (5, 10)


def test_cnn_needs_an_image_shape_that_fits():
    assert model_spec(ModelConfig(kind="cnn", image_shape=[3, 4, 4]), 48, 2)["image_shape"] == [3, 4, 4]
    with pytest.raises(ConfigError, match=r"model\.image_shape: 10 features are not a square image"):
        model_spec(ModelConfig(kind="cnn"), 10, 2)
    with pytest.raises(ConfigError, match=r"model\.image_shape \[1, 4, 4\]: .* the number of features, 64"):
        model_spec(ModelConfig(kind="cnn", image_shape=[1, 4, 4]), 64, 2)


def test_checkpoint_round_trip_predicts_the_same(tmp_path):
    torch.manual_seed(0)
    spec = model_spec(ModelConfig(kind="mlp", hidden_sizes=[8]), 3, 3)
    model = build_model(spec).eval()
    pre = Preprocessor(["a", "b", "c"], "label", ["x", "y", "z"], [1.0, 2.0, 3.0], [1.0, 2.0, 4.0])
    save_checkpoint(
        tmp_path,
        model=model,
        spec=spec,
        preprocessor=pre.to_dict(),
        config=PipelineConfig().model_dump(mode="json"),
        metrics={"epoch": 1},
    )
    loaded = load_checkpoint(tmp_path)
    frame = pd.DataFrame(np.random.default_rng(0).normal(size=(6, 3)), columns=["a", "b", "c"])
    with torch.no_grad():
        expected = model(torch.from_numpy(pre.features(frame))).numpy()
    np.testing.assert_allclose(loaded.predict_logits(pre.features(frame)), expected, rtol=1e-6)
    assert set(loaded.predict(frame)) <= {"x", "y", "z"}
    np.testing.assert_allclose(loaded.predict_proba(frame).sum(axis=1), 1.0, rtol=1e-5)
    assert loaded.config["name"] == "digits"


def test_metrics_json_reads_back_whole_an_epoch_a_line_each_row_encoded_once():
    history = [{"epoch": 1, "val_loss": 0.5}]
    rows: list[str] = []
    metrics_json({**history[0], "history": history}, rows)
    first = rows[0]
    history.append({"epoch": 2, "val_loss": float("nan")})
    text = metrics_json({"epoch": 2, "val_loss": float("nan"), "history": history}, rows)
    assert rows[0] is first and len(rows) == 2  # the first epoch's row, not encoded again
    assert text.splitlines() == [
        "{",
        '  "epoch": 2,',
        '  "val_loss": NaN,',
        '  "history": [',
        '    {"epoch": 1, "val_loss": 0.5},',
        '    {"epoch": 2, "val_loss": NaN}',
        "  ]",
        "}",
    ]
    assert json.loads(text)["history"][0] == history[0]
    # Another run's shorter history with the same list: encoded anew.
    assert json.loads(metrics_json({"history": [{"epoch": 7}]}, rows)) == {"history": [{"epoch": 7}]}
    assert json.loads(metrics_json({"epoch": 1, "history": []})) == {"epoch": 1, "history": []}


def test_a_lora_checkpoint_holds_the_adapter_and_loads_onto_its_base_or_whole(tmp_path):
    """model.pt of a LoRA model holds what trains; it loads onto the base from the hf:
    folder, and complete_weights makes it whole, loading without that folder."""
    from transformers import ViTConfig, ViTForImageClassification

    from trainflow.pipelines.models.checkpoint import complete_weights

    base = tmp_path / "base"
    config = ViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    ViTForImageClassification(config).save_pretrained(base)
    lora = {"r": 2, "alpha": 4, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    spec = model_spec(
        ModelConfig(kind=f"hf:{base}"), 192, 2, image_shape=[3, 8, 8], classes=["a", "b"], lora=lora
    )
    model = initial_model(spec).eval()
    with torch.no_grad():  # an adapter that has trained: B is zeros at the start
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    pre = Preprocessor(
        [], "label", ["a", "b"], image={"shape": [3, 8, 8], "mean": [0.5] * 3, "std": [0.5] * 3}
    )
    folder = tmp_path / "checkpoint"
    save_checkpoint(folder, model=model, spec=spec, preprocessor=pre.to_dict(), config={}, metrics={})
    held = torch.load(folder / "model.pt", weights_only=True)
    assert sum(v.numel() for v in held.values()) == spec["parameters"]["trainable"]
    x = torch.randn(3, 192)
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(load_checkpoint(folder).predict_logits(x.numpy()), expected, rtol=1e-5)
    complete_weights(folder)
    assert len(torch.load(folder / "model.pt", weights_only=True)) == len(model.state_dict())
    for path in base.iterdir():
        path.unlink()  # the base model is gone; the whole checkpoint needs it no more
    np.testing.assert_allclose(load_checkpoint(folder).predict_logits(x.numpy()), expected, rtol=1e-5)


def test_a_checkpoint_missing_a_file_is_refused(tmp_path):
    spec = model_spec(ModelConfig(kind="mlp"), 2, 2)
    save_checkpoint(
        tmp_path,
        model=build_model(spec),
        spec=spec,
        preprocessor=Preprocessor(["a", "b"], "l", [0, 1]).to_dict(),
        config={},
        metrics={},
    )
    (tmp_path / "preprocessor.json").unlink()
    with pytest.raises(FileNotFoundError, match="missing preprocessor.json"):
        load_checkpoint(tmp_path)


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")  # PEFT calling transformers 5
def test_a_peft_adapter_a_loops_trainer_saved_loads_merged_into_the_pretrained_model(tmp_path):
    """A transformers.Trainer of a PEFT model checkpoints its adapter alone
    (``checkpoint/adapter_model.safetensors``, as RayTrainReportCallback reports it): the
    loop's model is the hf: folder's pretrained model with that adapter, and its head, merged in."""
    from peft import LoraConfig, get_peft_model
    from transformers import ViTConfig, ViTForImageClassification

    from trainflow.pipelines.models import hf as hf_models
    from trainflow.pipelines.training.user_loop import loop_model

    base = tmp_path / "base"
    config = ViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    ViTForImageClassification(config).save_pretrained(base)
    spec = model_spec(ModelConfig(kind=f"hf:{base}"), 192, 2, image_shape=[3, 8, 8], classes=["a", "b"])
    # What the user's loop trains: the pretrained model under an adapter of its own.
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], modules_to_save=["classifier"])
    trained = get_peft_model(hf_models.pretrained(spec).net, lora).eval()
    with torch.no_grad():  # an adapter and a head that have trained
        for name, param in trained.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.normal_()
    trained.save_pretrained(tmp_path / "reported" / "checkpoint")
    assert not (tmp_path / "reported" / "checkpoint" / "model.safetensors").exists()
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        expected = trained(pixel_values=x).logits.numpy()

    model = loop_model(tmp_path / "reported", spec, "mine:fit").eval()
    with torch.no_grad():
        np.testing.assert_allclose(model(x.reshape(3, -1)).numpy(), expected, rtol=1e-4, atol=1e-5)
