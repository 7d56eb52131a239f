"""A text model trained through a preprocess.transform (examples/text_classification: a
tokenizing transform, an EmbeddingBag model) answers raw text wherever it predicts:
load_model, batch prediction on Ray Data actors, the served /predict on Ray Serve. And a
model of two inputs receives both columns by name, streamed from Ray Data. On the session's Ray cluster and
Prefect server; the example's modules are on this driver's path only, so every Ray
worker that needs them gets them shipped."""

import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import trainflow
from tests.web import http, start_serve
from trainflow.config import load_config
from trainflow.flows.batch_predict import batch_predict
from trainflow.flows.training import training_pipeline

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "text_classification"
NAME = "texts-test"
QUESTIONS = [
    "Return the indices of the maximum values along an axis of the array.",
    "Applies a 2D convolution over an input tensor composed of several planes.",
    "Group the DataFrame rows by the values of a column and return the groups.",
]


@pytest.fixture(scope="module")
def texts_model(ray_cluster, prefect_harness, module_trainflow_home):
    """The example, trained a few epochs and registered as NAME version 1."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(EXAMPLE))
        config = load_config(
            EXAMPLE / "texts.yaml",
            [
                f"name={NAME}",
                f"data.source={EXAMPLE / 'texts.csv'}",
                "train.epochs=6",
                "registry.min_value=null",
            ],
        )
        state = training_pipeline(config=config, return_state=True)
        assert state.is_completed(), state.message
        yield state.result()
    for module in ("text_tokens", "text_bag"):
        sys.modules.pop(module, None)


def test_the_text_model_answers_raw_text_through_load_model(texts_model):
    model = trainflow.load_model(f"{NAME}@champion")
    assert model.preprocessor.raw_columns == ["text"]
    assert model.spec["inputs"] == {"tokens": {"shape": [24], "dtype": "int64"}}
    texts = pd.read_csv(EXAMPLE / "texts.csv")
    accuracy = (model.predict(texts[["text"]]) == texts["library"].to_numpy()).mean()
    assert accuracy > 0.7, accuracy
    assert set(model.predict(pd.DataFrame({"text": QUESTIONS}))) <= {"numpy", "pandas", "torch"}


def test_batch_prediction_takes_the_raw_text(texts_model, tmp_path):
    rows = pd.DataFrame({"id": np.arange(40), "text": pd.read_csv(EXAMPLE / "texts.csv")["text"][:40]})
    rows.to_csv(tmp_path / "input.csv", index=False)
    result = batch_predict(model=f"{NAME}/1", input=str(tmp_path / "input.csv"), output=str(tmp_path / "out"))
    assert result.rows == 40
    out = pd.read_parquet(tmp_path / "out").sort_values("id")
    assert "text" not in out.columns and list(out.columns[:2]) == ["id", "prediction"]
    expected = trainflow.load_model(f"{NAME}/1").predict(rows[["text"]])
    assert out["prediction"].tolist() == expected.tolist()


def test_the_served_endpoint_takes_the_raw_text(texts_model):
    import socket

    from ray import serve

    from trainflow.pipelines.serving import QUIET_LOGS, app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_serve(port)
    try:
        serve.run(
            app(NAME, cpus_per_replica=0.2), name="texts", route_prefix="/texts", logging_config=QUIET_LOGS
        )
        url = f"http://127.0.0.1:{port}/texts"
        assert http.get(f"{url}/model").json()["input_columns"] == ["text"]
        answer = http.post(f"{url}/predict", json={"rows": [{"text": q} for q in QUESTIONS]})
        assert answer.status_code == 200, answer.text
        expected = trainflow.load_model(f"{NAME}/1").predict(pd.DataFrame({"text": QUESTIONS}))
        assert answer.json()["predictions"] == expected.tolist()
        refused = http.post(f"{url}/predict", json={"rows": [{"text": 3}]})
        assert refused.status_code == 422 and refused.json()["field"] == "rows[0].text"
    finally:
        serve.shutdown()


TWO_INPUTS = """
import numpy as np
import torch
from torch import nn


def two_columns(batch):
    out = batch.drop(columns=["text"])
    out["ids"] = [np.array([len(w) for w in t.split()][:6] + [0] * 6)[:6] for t in batch["text"]]
    out["shape"] = [np.array([len(t), t.count(" "), t.count(",")], dtype=np.float64) for t in batch["text"]]
    return out


class TwoInputs(nn.Module):
    def __init__(self, inputs, num_outputs):
        super().__init__()
        self.embed = nn.EmbeddingBag(64, 8)
        self.head = nn.Linear(8 + inputs["shape"][0], num_outputs)

    def forward(self, x):
        if set(x) != {"ids", "shape"} or x["ids"].dtype != torch.int64:
            raise TypeError(f"expected ids (int64) and shape by name, got {sorted(x)}")
        return self.head(torch.cat([self.embed(x["ids"].clamp(max=63)), x["shape"]], dim=1))
"""


def test_a_two_input_model_receives_both_columns_by_name(
    ray_cluster, prefect_harness, module_trainflow_home, tmp_path
):
    (tmp_path / "two_inputs_net.py").write_text(textwrap.dedent(TWO_INPUTS))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))
        config = load_config(
            {
                "name": "texts-two-inputs",
                "data": {"source": str(EXAMPLE / "texts.csv"), "label_column": "library"},
                "preprocess": {"transform": "two_inputs_net:two_columns"},
                "model": {"kind": "two_inputs_net:TwoInputs"},
                "train": {"epochs": 1, "batch_size": 32, "in_memory": "never"},  # streamed from Ray Data
                "scaling": {"num_workers": 1},
                "registry": {"min_value": None},
            }
        )
        state = training_pipeline(config=config, return_state=True)
        assert state.is_completed(), state.message
        model = trainflow.load_model("texts-two-inputs/1")
        assert model.spec["by_name"] and list(model.spec["inputs"]) == ["ids", "shape"]
        assert len(model.predict(pd.DataFrame({"text": QUESTIONS}))) == 3
    sys.modules.pop("two_inputs_net", None)
