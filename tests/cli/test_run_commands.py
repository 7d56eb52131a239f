"""`trainflow validate` and `run` as a user runs them (a subprocess: its exit code and what
it prints), and `predict`'s refusals in this process."""

import pytest

from tests.commands import trainflow, trainflow_in_process
from tests.pipelines.test_registry import make_checkpoint, register
from trainflow.workspace import workspace


@pytest.fixture
def toy(trainflow_home, tmp_path):
    """A registry whose model toy has one version, its champion."""
    register(workspace(), make_checkpoint(tmp_path / "c1"), 0.8)
    return trainflow_home


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "train.learning_rate=0.1"], r"train.learning_rate: unknown key"),
        (["--set", "train.epochs=ten"], r"train.epochs: Input should be a valid integer"),
        (["--set", "data.label_column=target"], r"data.label_column 'target' is not a column"),
        (["--set", "data.source=/no/such/data.csv"], r"data.source /no/such/data.csv: no such file"),
        (["configs/missing.yaml"], r"config file configs/missing.yaml: no such file"),
    ],
)
def test_bad_input_fails_in_one_line_before_ray_and_registers_nothing(tmp_path, args, message):
    import re

    out = trainflow("run", *args, home=tmp_path / "home")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert re.search(message, lines[0])
    # Neither Prefect, Ray nor MLflow started: nothing was written.
    assert not (tmp_path / "home" / "mlflow.db").exists()
    assert not list((tmp_path / "home").glob("runs/*"))
    assert "Ray" not in out.stdout + out.stderr


def test_blank_labels_are_named_with_their_count_by_validate_and_stop_a_run_before_ray(tmp_path):
    from tests.pipelines.test_missing import churn

    churn().to_csv(tmp_path / "churn.csv", index=False)
    config = tmp_path / "churn.yaml"
    config.write_text(
        f"data:\n  source: {tmp_path / 'churn.csv'}\n  label_column: churned\n"
        "  categorical_columns: [contract]\n  classes: ['no', 'yes']\nmodel: {kind: mlp}\n"
    )
    said = (
        f"error: data.source {tmp_path / 'churn.csv'}: column 'churned' has 3 missing values "
        "(blank, null or NaN) in 60 rows; set data.missing=drop to drop such rows\n"
    )
    for command in ("validate", "run"):
        out = trainflow(command, config, home=tmp_path / "home")
        assert (out.returncode, out.stderr) == (2, said)
    assert not list((tmp_path / "home").glob("runs/*")) and "Ray" not in out.stdout + out.stderr
    dropped = trainflow("validate", config, "--set", "data.missing=drop", home=tmp_path / "home")
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.splitlines()[1] == "note: 3 rows without a label are dropped (data.missing=drop)"


def test_validate_checks_config_and_source(tmp_path):
    out = trainflow("validate", "configs/digits.yaml", "--set", "train.epochs=2", home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok: digits (config hash ")


def test_predict_refuses_a_bad_model_input_or_output_before_prefect_and_ray(toy, tmp_path):
    import pandas as pd

    pd.DataFrame({"id": [1, 2], "a": [0.5, 1.0]}).to_csv(tmp_path / "rows.csv", index=False)
    pd.DataFrame({"a": [0.5], "b": [1.0]}).to_parquet(tmp_path / "ok.parquet")
    (tmp_path / "taken").mkdir()
    cases = [
        (["nobody@champion", "rows.csv", "out"], "unknown model 'nobody'; registered models: toy"),
        (["toy/1", "nothing.csv", "out"], "input {tmp}/nothing.csv: no such file or folder"),
        (
            ["toy@champion", "rows.csv", "out"],
            "input {tmp}/rows.csv lacks the feature column 'b' that the model was trained on; "
            "its columns are: id, a",
        ),
        (["toy@champion", "ok.parquet", "taken"], "output {tmp}/taken already exists; choose a new folder"),
    ]
    for (model, rows, out), message in cases:
        result = trainflow_in_process("predict", model, tmp_path / rows, tmp_path / out)
        assert result.returncode == 2, result.output
        line = result.stderr.strip()
        assert line.startswith("error: " + message.format(tmp=tmp_path)), line
        assert "\n" not in line
