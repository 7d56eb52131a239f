"""The checks before a run: each run checks once (the command hands what it found to its flow
run), and a bad run fails in one line."""

import subprocess
import sys

import pytest

from trainflow import run_checks
from trainflow.config import ConfigError, load_config
from trainflow.pipelines.data import schema as data
from trainflow.pipelines.data.schema import DataError


@pytest.fixture
def inspections(monkeypatch, trainflow_home) -> list[str]:
    """Every inspection of a data source in this test, by source."""
    seen: list[str] = []
    inspect = data.inspect_source

    def counted(cfg, *args, **kwargs):
        seen.append(cfg.source)
        return inspect(cfg, *args, **kwargs)

    monkeypatch.setattr(data, "inspect_source", counted)
    return seen


def test_each_call_checks_afresh_and_holds_nothing_for_later(inspections):
    """What a command checked reaches its flow run as the flow's ``checked`` parameter;
    nothing is kept here for whoever calls next (a served deployment's next run checks
    its own data)."""
    config = load_config({"name": "checked"})
    first = run_checks.before_run(config)
    again = run_checks.before_run(config)
    assert again is not first and again.source.fingerprint == first.source.fingerprint
    assert inspections == ["builtin:digits", "builtin:digits"]


def test_a_failed_check_fails_in_one_line_naming_the_source(inspections):
    config = load_config({"name": "bad", "data": {"source": "/no/such/data.csv"}})
    with pytest.raises(DataError, match="data.source /no/such/data.csv: no such file"):
        run_checks.before_run(config)


def test_a_sweep_without_a_sweep_section_is_refused_naming_the_field(inspections):
    with pytest.raises(ConfigError, match=r"^invalid config: sweep: plain has no sweep section; add one"):
        run_checks.before_run(load_config({"name": "plain"}), sweep=True)
    assert inspections == []  # refused before the source is looked at


@pytest.mark.slow
def test_a_command_run_checks_once_and_its_flow_run_takes_the_result(
    ray_cluster, prefect_harness, inspections
):
    from tests.commands import trainflow_in_process

    out = trainflow_in_process("run", "--smoke")
    assert out.returncode == 0, out.output
    assert "model       digits-smoke version 1 -> champion" in out.output
    # The command checked before it started anything; the flow run and its ingest step
    # took that result instead of looking at the source again.
    assert inspections == ["builtin:digits"]


def test_the_checks_before_a_run_import_neither_torch_nor_ray():
    # They run before Prefect's server and Ray start: seconds of imports here would come
    # before everything else a command does, and before a bad config's one line.
    code = (
        "import sys, trainflow.run_checks\n"
        "print(sorted(m for m in ('torch', 'ray', 'prefect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_database_registry_whose_driver_is_missing_fails_before_the_run_in_one_line(
    trainflow_home, monkeypatch
):
    """MLflow would fail at the first registry call, after the run had trained."""
    import importlib.util

    from trainflow.cluster.checks import PreflightError

    if importlib.util.find_spec("pg8000") is not None:
        pytest.skip("pg8000 is installed here: its URI would pass the check")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql+pg8000://ana:secret@127.0.0.1:5432/mlflow")
    with pytest.raises(PreflightError) as refused:
        run_checks.before_run(load_config({"name": "checked"}))
    assert str(refused.value) == (
        "registry: MLFLOW_TRACKING_URI postgresql+pg8000://127.0.0.1:5432/mlflow needs the database driver "
        "pg8000, which is not installed here: install it, or point MLFLOW_TRACKING_URI at an MLflow server "
        "on that database"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql+psycopg9://127.0.0.1/mlflow")
    with pytest.raises(
        PreflightError, match=r"SQLAlchemy has no driver 'postgresql\+psycopg9'; write one it has"
    ):
        run_checks.before_run(load_config({"name": "checked"}))


def test_an_mlflow_server_that_does_not_answer_fails_before_the_run_in_one_line(trainflow_home, monkeypatch):
    """MLflow's client would retry each call for minutes, after the run had trained."""
    import socket

    from trainflow.cluster.checks import PreflightError

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://ana:secret@127.0.0.1:{port}")
    with pytest.raises(PreflightError) as refused:
        run_checks.before_run(load_config({"name": "checked"}))
    assert str(refused.value) == (
        f"registry: no MLflow server answers at http://127.0.0.1:{port} (MLFLOW_TRACKING_URI): "
        "[Errno 111] Connection refused; start it, or unset MLFLOW_TRACKING_URI for the embedded "
        "registry in TRAINFLOW_HOME"
    )


def test_trainflows_cnn_on_a_table_is_refused_before_the_run_unless_its_rows_make_a_square(tmp_path):
    """The cnn reads a row as a square image: a table of 2 numbers, or with a categorical
    column (a width only fitting tells), fails in one line before anything starts; 64
    numbers (the digits) pass, and so does any width for the mlp or with model.image_shape."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=40), "b": rng.normal(size=40), "label": np.arange(40) % 2})
    frame["color"] = np.where(frame["a"] > 0, "red", "blue")
    frame.to_csv(tmp_path / "t.csv", index=False)
    table = {"data": {"source": str(tmp_path / "t.csv"), "feature_columns": ["a", "b"]}}

    def checked(raw):
        config = load_config(raw)
        run_checks.model_fits(config, run_checks.source(config))

    with pytest.raises(ConfigError, match=r"model\.image_shape: 2 features are not a square image"):
        checked(table)
    categorical = {
        "data": {**table["data"], "feature_columns": ["a", "color"], "categorical_columns": ["color"]}
    }
    with pytest.raises(
        ConfigError, match=r"model\.kind cnn reads square images; .*t\.csv is a table with categorical"
    ):
        checked(categorical)
    checked({**categorical, "model": {"kind": "mlp"}})
    checked({**table, "model": {"image_shape": [1, 1, 2]}})
    checked({})  # the digits: 64 numbers, 8 by 8
