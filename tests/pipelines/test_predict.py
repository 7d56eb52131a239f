"""Batch prediction's input and output checks: in the driver, with no Ray."""

import pandas as pd
import pytest

from trainflow.pipelines.data.schema import DataError
from trainflow.pipelines.evaluation.predict_input import check_output, inspect_input


def test_an_input_is_checked_for_the_models_features_before_reading_rows(tmp_path):
    pd.DataFrame({"id": [1], "a": [1.0], "b": [2.0]}).to_parquet(tmp_path / "part-0.parquet")
    pd.DataFrame({"id": [2], "a": [3.0], "b": [4.0]}).to_parquet(tmp_path / "part-1.parquet")
    info = inspect_input(str(tmp_path), ["a", "b"])
    assert (info.format, len(info.files), info.columns) == ("parquet", 2, ["id", "a", "b"])
    with pytest.raises(
        DataError, match=r"lacks the feature columns 'c', 'd' that the model .* are: id, a, b"
    ):
        inspect_input(str(tmp_path), ["a", "c", "d"])


def test_an_input_of_other_columns_altogether_is_refused_in_a_line_that_stays_short(tmp_path):
    pd.DataFrame({f"pixel_{i}_{j}": [0.0] for i in range(8) for j in range(8)}).to_csv(
        tmp_path / "rows.csv", index=False
    )
    with pytest.raises(DataError) as refused:
        inspect_input(str(tmp_path / "rows.csv"), [f"pixel_{i}" for i in range(64)])
    message = str(refused.value)
    assert "'pixel_0', 'pixel_1'," in message and "'pixel_9', ... (64 in all) that the model" in message
    assert message.endswith("pixel_2_3, ... (64 in all)") and len(message) < 600, message


@pytest.mark.parametrize(
    "name, message",
    [
        ("rows.txt", r"rows.txt: unsupported file type '.txt'; use one of .csv, .parquet, .pq"),
        ("missing.csv", r"missing.csv: no such file or folder"),
        ("empty", r"empty: no .csv, .parquet, .pq files in this folder"),
        ("mixed", r"mixed: mixes csv and parquet files; keep one format"),
    ],
)
def test_unreadable_inputs_are_named(tmp_path, name, message):
    (tmp_path / "rows.txt").write_text("a,b\n1,2\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "mixed").mkdir()
    pd.DataFrame({"a": [1.0]}).to_csv(tmp_path / "mixed" / "x.csv", index=False)
    pd.DataFrame({"a": [1.0]}).to_parquet(tmp_path / "mixed" / "y.parquet")
    with pytest.raises(DataError, match=message):
        inspect_input(str(tmp_path / name), ["a"])


def test_an_output_must_be_a_new_folder(tmp_path):
    assert check_output(str(tmp_path / "new")) == tmp_path / "new"
    with pytest.raises(DataError, match="already exists; choose a new folder"):
        check_output(str(tmp_path))
    with pytest.raises(DataError, match=r"give a folder .*not a file name"):
        check_output(str(tmp_path / "out.parquet"))
