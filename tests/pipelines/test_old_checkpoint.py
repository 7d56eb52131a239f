"""A checkpoint written by an older trainflow loads and predicts as it did then."""

import json
from pathlib import Path

import numpy as np

from trainflow.pipelines.data.sources import digits_frame
from trainflow.pipelines.models.checkpoint import load_checkpoint

FIXTURE = Path(__file__).parent.parent / "data" / "checkpoint-0.1.0"


def test_a_checkpoint_of_trainflow_0_1_0_predicts_the_classes_it_predicted_then():
    expected = json.loads((FIXTURE / "expected.json").read_text())
    predictor = load_checkpoint(FIXTURE)
    rows = digits_frame().iloc[expected["rows"]].drop(columns=["label"])
    assert predictor.predict(rows).tolist() == expected["predicted"]
    assert predictor.preprocessor.numeric_columns == [f"pixel_{i}" for i in range(64)]


def test_a_cnn_checkpoint_of_trainflow_0_2_0_predicts_as_it_did_then():
    folder = FIXTURE.parent / "checkpoint-0.2.0"
    expected = json.loads((folder / "expected.json").read_text())
    predictor = load_checkpoint(folder)
    rows = digits_frame().iloc[expected["rows"]].drop(columns=["label"])
    assert predictor.objective == "classification"
    assert predictor.predict(rows).tolist() == expected["predicted"]
    np.testing.assert_allclose(predictor.predict_proba(rows), expected["proba"], atol=1e-5)
