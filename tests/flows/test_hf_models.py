"""Pretrained Hugging Face transformers through the flow: ``model.kind: hf:<folder>`` with
``preprocess.tokenizer``, fine-tuned whole (a classifier) and through a LoRA adapter (a
regression), registered, answering raw text through load_model, batch prediction and the
served endpoint. No network: the "pretrained" model is a two-layer BERT and a WordPiece
tokenizer trained on the texts (examples/hf_text/make_tiny_model.py), saved with
``save_pretrained`` as a hub download would be. On the session's Ray cluster and Prefect
server."""

import json
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import trainflow
from tests.commands import trainflow as trainflow_cli
from tests.web import http, start_serve
from trainflow.config import load_config
from trainflow.flows.batch_predict import batch_predict
from trainflow.flows.training import training_pipeline

from .test_training_pipeline import read_artifacts

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TEXTS = EXAMPLES / "text_classification" / "texts.csv"
NAME, LORA_NAME = "hf-texts", "hf-lengths"
QUESTIONS = [
    "Return the indices of the maximum values along an axis of the array.",
    "Applies a 2D convolution over an input tensor composed of several planes.",
    "Group the DataFrame rows by the values of a column and return the groups.",
]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    sys.path.insert(0, str(EXAMPLES / "hf_text"))
    try:
        from make_tiny_model import make_tiny_model
    finally:
        sys.path.remove(str(EXAMPLES / "hf_text"))
    return make_tiny_model(tmp_path_factory.mktemp("hub") / "tiny-bert", pd.read_csv(TEXTS)["text"].tolist())


def _trained(overrides: dict):
    state = training_pipeline(config=load_config(overrides), return_state=True)
    assert state.is_completed(), state.message
    return state.result()


@pytest.fixture(scope="module")
def classifier(tiny_bert, ray_cluster, prefect_harness, module_trainflow_home):
    """The tiny BERT fine-tuned whole to tell the texts' libraries apart: NAME version 1."""
    return _trained(
        {
            "name": NAME,
            "data": {"source": str(TEXTS), "label_column": "library"},
            "preprocess": {"tokenizer": {"column": "text", "max_length": 32}},
            "model": {"kind": f"hf:{tiny_bert}"},
            "train": {"epochs": 6, "batch_size": 32, "lr": 0.005},
            "registry": {"min_value": None},
        }
    )


@pytest.fixture(scope="module")
def regression(tiny_bert, ray_cluster, prefect_harness, module_trainflow_home, tmp_path_factory):
    """Each text's number of words, learned through a LoRA adapter merged when loaded: LORA_NAME v1."""
    texts = pd.read_csv(TEXTS)[["text"]]
    texts["words"] = texts["text"].str.split().str.len().astype(float)
    source = tmp_path_factory.mktemp("lengths") / "lengths.csv"
    texts.to_csv(source, index=False)
    return _trained(
        {
            "name": LORA_NAME,
            "data": {"source": str(source), "label_column": "words"},
            "objective": "regression",
            "preprocess": {"tokenizer": {"name": str(tiny_bert), "max_length": 32}},
            "model": {"kind": f"hf:{tiny_bert}"},
            "train": {"epochs": 6, "batch_size": 32, "lr": 0.01, "lora": {"r": 4, "merge": True}},
            "registry": {"min_value": None},
        }
    )


def test_a_fine_tuned_classifier_answers_raw_text_with_label_names(classifier):
    model = trainflow.load_model(f"{NAME}@champion")
    assert model.preprocessor.raw_columns == ["text"]
    assert set(model.spec["inputs"]) >= {"input_ids", "attention_mask"}
    assert model.spec["hf"]["config"]["id2label"] == {"0": "numpy", "1": "pandas", "2": "torch"}
    # The tokenizer went with the registered version; the base model's folder is not needed.
    assert (model.path / "tokenizer" / "tokenizer.json").is_file()
    texts = pd.read_csv(TEXTS)
    accuracy = (model.predict(texts[["text"]]) == texts["library"].to_numpy()).mean()
    assert accuracy > 0.5, accuracy  # three classes, the largest a third of the rows
    assert set(model.predict(pd.DataFrame({"text": QUESTIONS}))) <= {"numpy", "pandas", "torch"}
    counts = model.spec["parameters"]
    assert counts["trainable"] == counts["total"]


def test_batch_prediction_and_the_served_endpoint_take_the_raw_text(classifier, tmp_path):
    from ray import serve

    from trainflow.pipelines.serving import QUIET_LOGS, app

    rows = pd.DataFrame({"id": np.arange(30), "text": pd.read_csv(TEXTS)["text"][:30]})
    rows.to_csv(tmp_path / "input.csv", index=False)
    result = batch_predict(model=f"{NAME}/1", input=str(tmp_path / "input.csv"), output=str(tmp_path / "out"))
    assert result.rows == 30
    out = pd.read_parquet(tmp_path / "out").sort_values("id")
    expected = trainflow.load_model(f"{NAME}/1").predict(rows[["text"]])
    assert out["prediction"].tolist() == expected.tolist()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_serve(port)
    try:
        serve.run(app(NAME, cpus_per_replica=0.2), name="hf", route_prefix="/hf", logging_config=QUIET_LOGS)
        answer = http.post(
            f"http://127.0.0.1:{port}/hf/predict", json={"rows": [{"text": q} for q in QUESTIONS]}
        )
        assert answer.status_code == 200, answer.text
        expected = trainflow.load_model(f"{NAME}/1").predict(pd.DataFrame({"text": QUESTIONS}))
        assert answer.json()["predictions"] == expected.tolist()
    finally:
        serve.shutdown()


def test_a_lora_regression_trains_the_adapter_alone_and_loads_merged_or_not(regression, tiny_bert, tmp_path):
    model = trainflow.load_model(f"{LORA_NAME}@champion")
    counts = model.spec["parameters"]
    assert counts["trainable"] < counts["total"] / 4, counts  # the adapter and the head
    assert model.spec["lora"]["r"] == 4
    # The run's checkpoint holds what trained, the adapter and the head; the registered
    # version the whole model, base and adapter, so it loads where the base model is not.
    trained = torch.load(Path(regression.checkpoint) / "model.pt", weights_only=True)
    registered = torch.load(model.path / "model.pt", weights_only=True)
    assert sum(v.numel() for v in trained.values()) == counts["trainable"]
    assert set(trained) < set(registered) and any(".base_layer." in k for k in registered)
    # Merged when loaded: a plain transformers model, no LoRA layer left.
    names = [name for name, _ in model.model.named_modules()]
    assert not any("lora" in name for name in names)
    texts = pd.read_csv(TEXTS)[["text"]]
    merged = model.predict(texts)
    words = texts["text"].str.split().str.len().to_numpy()
    assert np.corrcoef(merged, words)[0, 1] > 0.5
    # The same checkpoint, kept as base plus adapter, predicts the same numbers.
    apart = tmp_path / "apart"
    shutil.copytree(model.path, apart)
    spec = json.loads((apart / "model.json").read_text())
    spec["lora"]["merge"] = False
    (apart / "model.json").write_text(json.dumps(spec))
    from trainflow.pipelines.models.checkpoint import load_checkpoint

    unmerged = load_checkpoint(apart)
    assert any("lora_A" in name for name, _ in unmerged.model.named_modules())
    np.testing.assert_allclose(unmerged.predict(texts), merged, rtol=1e-4, atol=1e-4)
    card = next(a.data for a in read_artifacts() if a.key == f"{LORA_NAME}-card")
    assert f"| model kind | `hf:{tiny_bert}` |" in card
    assert "| LoRA adapter | r 4, alpha 16, dropout 0.05, on PEFT's defaults; merged into the base" in card


def test_the_trainer_example_registers_the_trainers_checkpoint_which_answers_raw_text(
    tiny_bert, ray_cluster, prefect_harness, module_trainflow_home, tmp_path
):
    """examples/hf_trainer as a user's project runs it: a transformers.Trainer as
    train.loop, through prepare_trainer and RayTrainReportCallback; its save_pretrained
    checkpoint is registered and answers raw text with label names."""
    from tests.commands import trainflow_in_process
    from tests.flows.test_training_pipeline import flow_logs
    from trainflow.pipelines.registry import store
    from trainflow.workspace import workspace

    example = EXAMPLES / "hf_trainer"
    shutil.copy(example / "trainer_loop.py", tmp_path / "trainer_loop.py")
    sets = [f"data.source={TEXTS}", f"model.kind=hf:{tiny_bert}", "train.epochs=3", "registry.min_value=null"]
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))  # as the project's folder is, run from there
        out = trainflow_in_process(
            "run", example / "texts-trainer.yaml", *[a for s in sets for a in ("--set", s)]
        )
    assert out.returncode == 0, out.output

    c = store.client(workspace())
    version = c.get_model_version("hf-trainer-texts", "1")
    run = c.get_run(version.run_id)
    assert run.data.params["train.loop"] == "trainer_loop:train_func"
    reported = sorted(c.get_metric_history(version.run_id, "eval_accuracy"), key=lambda m: m.step)
    assert [m.step for m in reported] == [1, 2, 3]  # an evaluation and a checkpoint each epoch
    best_epoch = int(version.tags["trainflow.best_epoch"])
    assert reported[best_epoch - 1].value == max(m.value for m in reported)
    logs = flow_logs(run.data.tags["prefect.flow_run_id"])
    epoch_lines = [line for line in logs if line.startswith("epoch ")]
    assert [line.split()[1] for line in epoch_lines] == ["1/3", "2/3", "3/3"], epoch_lines

    model = trainflow.load_model("hf-trainer-texts@champion")
    assert model.spec["kind"] == f"hf:{tiny_bert}"
    answers = model.predict(pd.DataFrame({"text": QUESTIONS}))
    assert set(answers) <= set(pd.read_csv(TEXTS)["library"])


def test_the_preparation_tokenizes_each_text_once(tiny_bert, ray_cluster, tmp_path):
    """The preparation's passes (the row checks and the split, the fit, the write) each read
    every batch; the tokenizer runs on each batch once."""
    from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
    from trainflow.pipelines.data import tokenizer
    from trainflow.pipelines.data.prepare import prepare
    from trainflow.pipelines.data.schema import inspect_source

    ref = tokenizer.reference(str(tiny_bert), "text", 16)
    tokenize, texts = tokenizer.load(ref), []
    real = tokenize.tokenizer

    def counted(batch, **kwargs):
        texts.extend(batch)
        return real(batch, **kwargs)

    tokenize.tokenizer = counted
    try:
        info = inspect_source(DataConfig(source=str(TEXTS), label_column="library"), tmp_path, transform=ref)
        texts.clear()  # what the schema's check of a sample tokenized
        pre = PreprocessConfig(tokenizer={"name": str(tiny_bert), "column": "text", "max_length": 16})
        entry = prepare(info, SplitConfig(), pre, tmp_path)
    finally:
        tokenize.tokenizer = real
    rows = len(pd.read_csv(TEXTS))
    assert sum(entry.counts.values()) == rows
    assert len(texts) == rows


def test_a_model_id_missing_offline_fails_in_one_line_before_ray(tmp_path):
    out = trainflow_cli(
        "run",
        "--set",
        "model.kind=hf:nobody/no-such-model",
        "--set",
        "preprocess.tokenizer={column: text}",
        home=tmp_path / "home",
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [
        "error: model.kind hf:nobody/no-such-model: not in the Hugging Face cache and HF_HUB_OFFLINE is "
        "set; fetch it where the hub answers (hf download nobody/no-such-model) or give a local folder"
    ], out.stderr
    assert not list((tmp_path / "home").glob("runs/*"))


@pytest.fixture(scope="module")
def tiny_vit(tmp_path_factory):
    """A two-layer ViT for 16x16 images and its image processor, as save_pretrained writes them."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    folder = tmp_path_factory.mktemp("hub") / "tiny-vit"
    config = ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    ViTForImageClassification(config).save_pretrained(folder)
    ViTImageProcessor(
        size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    ).save_pretrained(folder)
    return folder


def _colour_folder(root: Path, per_class: int = 24) -> Path:
    """Reddish and bluish noise, 20x20 PNGs (the model takes 16x16) in a folder per class."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, channel in (("blue", 2), ("red", 0)):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 120, size=(20, 20, 3))
            pixels[..., channel] += 120
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
    return root


def test_an_image_model_fine_tunes_through_its_image_processor_and_lora(
    tiny_vit, ray_cluster, prefect_harness, module_trainflow_home, tmp_path
):
    from PIL import Image

    root = _colour_folder(tmp_path / "colours")
    result = _trained(
        {
            "name": "hf-colours",
            "data": {"source": str(root)},
            "model": {"kind": f"hf:{tiny_vit}"},
            "train": {
                "epochs": 4,
                "batch_size": 8,
                "lr": 0.01,
                "lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]},
            },
            "registry": {"min_value": None},
        }
    )
    model = trainflow.load_model("hf-colours@champion")
    # The processor's size and normalization, not the images' own size or statistics.
    assert model.preprocessor.image == {
        "shape": [3, 16, 16],
        "mean": [0.5] * 3,
        "std": [0.5] * 3,
        "augment": False,
    }
    assert model.spec["hf"]["config"]["id2label"] == {"0": "blue", "1": "red"}
    counts = model.spec["parameters"]
    assert counts["trainable"] < counts["total"] / 2
    adapter = torch.load(Path(result.checkpoint) / "model.pt", weights_only=True)
    assert sum(v.numel() for v in adapter.values()) == counts["trainable"]
    assert any(k.startswith("net.net.base_model.model.classifier.") for k in adapter)  # the head trains
    images = [np.asarray(Image.open(path)) for path in sorted(root.glob("*/*.png"))]
    labels = [path.parent.name for path in sorted(root.glob("*/*.png"))]
    accuracy = (model.predict(pd.DataFrame({"image": images})) == np.array(labels)).mean()
    assert accuracy > 0.8, accuracy


@pytest.mark.parametrize(
    ("processor", "expected"),
    [
        ({"size": {"height": 16, "width": 16}, "image_mean": [0.5] * 3, "image_std": [0.2] * 3},
         {"image_size": [16, 16], "image_mean": [0.5] * 3, "image_std": [0.2] * 3}),
        ({"size": {"shortest_edge": 20}, "do_center_crop": True, "crop_size": 16, "do_normalize": False},
         {"image_size": [16, 16], "image_mean": [0.0] * 3, "image_std": [1.0] * 3}),
        (None, {"image_size": [16, 16]}),  # no processor: the model's own image_size
    ],
)  # fmt: skip
def test_an_image_processor_becomes_the_preparations_size_and_normalization(
    tiny_vit, tmp_path, processor, expected
):
    from trainflow.pipelines.models.hf import image_processing

    folder = tmp_path / "model"
    shutil.copytree(tiny_vit, folder)
    (folder / "preprocessor_config.json").unlink()
    if processor is not None:
        (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    assert image_processing(f"hf:{folder}") == expected


def test_lora_on_an_architecture_peft_has_no_default_for_names_the_field(tiny_vit):
    from trainflow.config import ConfigError, ModelConfig
    from trainflow.pipelines.models.build import model_spec

    lora = {"r": 4, "alpha": 16, "dropout": 0.0, "target_modules": None}
    with pytest.raises(
        ConfigError, match=r"^train.lora.target_modules: PEFT has no default for model type vit; .*: .*v_proj"
    ):
        model_spec(
            ModelConfig(kind=f"hf:{tiny_vit}"), 768, 2, image_shape=[3, 16, 16], classes=["a", "b"], lora=lora
        )
