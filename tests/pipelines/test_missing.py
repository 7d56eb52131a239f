"""Missing values as a user's own CSV holds them: a blank cell (empty or only whitespace)
is missing like a null, never a class; the label column is checked before any Ray worker
starts, naming the column and the count; data.missing=drop drops and counts those rows."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from trainflow.config import ConfigError, DataConfig, load_config
from trainflow.pipelines.data import missing
from trainflow.pipelines.data.missing import blanks_as_null, check_labels
from trainflow.pipelines.data.schema import DataError, inspect_source


def churn(n=60, blank=(3, 10, 41), blanks=("", "  ", "\t")) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "tenure": rng.integers(1, 72, n),
            "contract": rng.choice(["month", "year"], n),
            "churned": np.where(np.arange(n) % 3 == 0, "yes", "no").astype(object),
        }
    )
    for row, cell in zip(blank, blanks, strict=False):
        df.loc[row, "churned"] = cell
    return df


def csv_source(tmp_path, df=None, **data) -> DataConfig:
    (df if df is not None else churn()).to_csv(tmp_path / "churn.csv", index=False)
    return DataConfig(
        source=str(tmp_path / "churn.csv"), label_column="churned", categorical_columns=["contract"], **data
    )


def test_a_csv_batchs_blank_cells_are_null_and_the_rest_as_they_were():
    batch = pa.record_batch({"s": ["", " ", "\t \n", "no", " yes "], "x": [1, 2, 3, 4, 5]})
    out = blanks_as_null(batch)
    assert out.column("s").to_pylist() == [None, None, None, "no", " yes "]
    assert out.column("x").to_pylist() == [1, 2, 3, 4, 5]
    plain = pa.record_batch({"x": [1.0, 2.0]})
    assert blanks_as_null(plain) is plain


def test_blank_labels_fail_before_ray_naming_the_column_and_the_count(tmp_path):
    info = inspect_source(csv_source(tmp_path))
    with pytest.raises(
        DataError,
        match=r"column 'churned' has 3 missing values \(blank, null or NaN\) in 60 "
        r"rows; set data\.missing=drop",
    ):
        check_labels(info)


def test_under_drop_blank_labels_are_counted_and_never_a_class(tmp_path, ray_cluster):
    from trainflow.config import PreprocessConfig, SplitConfig
    from trainflow.pipelines.data.prepare import prepare

    info = inspect_source(csv_source(tmp_path, missing="drop"))
    assert check_labels(info) == 3
    entry = prepare(info, SplitConfig(), PreprocessConfig(), tmp_path / "cache")
    assert entry.dropped == 3 and sum(entry.counts.values()) == 57
    assert entry.preprocessor.classes == ["no", "yes"]


def test_labels_outside_the_declared_classes_are_counted_with_what_to_do(tmp_path):
    df = churn(blank=())
    df.loc[[1, 2], "churned"] = "maybe"
    info = inspect_source(csv_source(tmp_path, df, classes=["no", "yes"]))
    with pytest.raises(
        DataError,
        match=r"2 rows of .*churn\.csv hold labels 'maybe' outside data\.classes "
        r"\['no', 'yes'\]; list them in data\.classes, or remove those rows",
    ):
        check_labels(info)


def test_a_parquet_files_null_labels_and_data_limit(tmp_path):
    df = churn(blank=())
    df.loc[[50, 55], "churned"] = None
    df.to_parquet(tmp_path / "churn.parquet")
    cfg = dict(
        source=str(tmp_path / "churn.parquet"), label_column="churned", categorical_columns=["contract"]
    )
    with pytest.raises(DataError, match=r"has 2 missing values"):
        check_labels(inspect_source(DataConfig(**cfg)))
    assert check_labels(inspect_source(DataConfig(**cfg, limit=50))) == 0  # the rows it reads hold none


def test_a_source_past_the_bound_is_left_to_the_checks_of_the_prepared_rows(tmp_path, monkeypatch):
    info = inspect_source(csv_source(tmp_path))
    monkeypatch.setattr(missing, "SCAN_BYTES", info.bytes - 1)
    assert check_labels(info) is None


def test_yaml_yes_and_no_read_as_booleans_are_named_with_the_quoted_form(tmp_path):
    config = tmp_path / "churn.yaml"
    config.write_text("data:\n  label_column: churned\n  classes: [no, yes]\n")
    with pytest.raises(
        ConfigError,
        match=r"data\.classes: \[False, True\] are booleans: YAML reads unquoted "
        r"no/yes.*classes: \['no', 'yes'\]",
    ):
        load_config(config)
    config.write_text("data:\n  label_column: churned\n  classes: ['no', 'yes']\n")
    assert load_config(config).data.classes == ["no", "yes"]
    with pytest.raises(ConfigError, match=r"data\.label_column: .*\(got True\): YAML reads unquoted"):
        load_config(None, ["data.label_column=yes"])
