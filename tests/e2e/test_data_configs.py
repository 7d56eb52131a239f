"""The bundled tabular and image-folder configs, end to end through `trainflow run`."""

import re

import numpy as np
import pytest

from tests.e2e.test_cli import REPO, trainflow

pytestmark = pytest.mark.slow


def summary_of(out) -> str:
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout[out.stdout.index("model       ") :]


def test_churn_csv_with_categorical_columns_runs_and_a_second_run_is_cached(tmp_path):
    home = tmp_path / "home"
    args = ("run", "configs/churn.yaml", "--set", "train.epochs=1", "--set", "scaling.num_workers=1")
    first = summary_of(trainflow(*args, home=home))
    assert "churn version 1" in first and "cache" not in first
    second = summary_of(trainflow(*args, home=home))
    assert "churn version 2" in second
    assert "cache       ingest, preprocess skipped: same data and config as an earlier run" in second


def test_shapes_image_folder_runs_and_predicts_class_names(tmp_path):
    from PIL import Image

    from trainflow.pipelines.checkpoint import load_checkpoint

    out = trainflow("run", "configs/shapes.yaml", "--set", "train.epochs=1", home=tmp_path / "home")
    summary = summary_of(out)
    assert "shapes version 1" in summary
    checkpoint = re.search(r"checkpoint  (\S+)", summary).group(1)
    # The class map travels in the checkpoint: raw images in, folder names out.
    model = load_checkpoint(REPO / checkpoint if not checkpoint.startswith("/") else checkpoint)
    assert model.classes == ["checker", "horizontal", "vertical"]
    assert model.preprocessor.image["shape"] == [3, 16, 16]
    images = [
        np.asarray(Image.open(p)) for p in sorted((REPO / "configs/data/shapes/vertical").glob("*.png"))[:4]
    ]
    import pandas as pd

    predicted = model.predict(pd.DataFrame({"image": images}))
    assert set(predicted) <= {"checker", "horizontal", "vertical"} and len(predicted) == 4


def test_a_bad_row_stops_the_run_before_training_with_one_line_naming_it(tmp_path):
    import pandas as pd

    bad = pd.read_csv(REPO / "configs" / "data" / "churn.csv")
    bad.loc[[3, 7], "monthly_fee"] = float("inf")
    bad.to_csv(tmp_path / "bad.csv", index=False)
    out = trainflow(
        "run", "configs/churn.yaml", "--set", f"data.source={tmp_path / 'bad.csv'}", home=tmp_path / "home"
    )
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert re.fullmatch(
        r"error: data\.source .*bad\.csv: column 'monthly_fee' holds inf in 2 of 400 rows", errors[0]
    )
    assert not list((tmp_path / "home").glob("runs/*"))  # no training started
