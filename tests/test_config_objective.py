"""The ML objective (classification or regression) under its new key, `objective`, and its
old one, `task`, still read for a release: one warning, the same config and the same hashes."""

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from trainflow.config import ConfigError, PipelineConfig, RenamedKey, load_config

REPO = Path(__file__).resolve().parents[1]
WARNING = "config key 'task' is now 'objective'; 'task' is still read in this release"
DIABETES = {"data": {"source": "builtin:diabetes", "label_column": "target"}}


def test_the_old_key_is_read_as_objective_with_one_warning_naming_both():
    with pytest.warns(RenamedKey) as caught:
        old = load_config({"task": "regression", **DIABETES})
    assert [str(w.message) for w in caught] == [WARNING]
    assert old == load_config({"objective": "regression", **DIABETES})
    assert old.objective == "regression" and old.loss == "mse"  # a regression's defaults too
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedKey)
        assert load_config({"objective": "regression", **DIABETES}).objective == "regression"
        assert PipelineConfig().objective == "classification"


def test_both_keys_given_and_different_is_one_line_naming_both():
    disagree = "objective: 'classification' and task: 'regression' disagree"
    with pytest.raises(ValueError, match=disagree):  # pydantic's ValidationError, from Python
        PipelineConfig.model_validate({"task": "regression", "objective": "classification"})
    with pytest.raises(ConfigError) as e:
        load_config({"task": "regression", "objective": "classification"})
    assert str(e.value).startswith(f"invalid config: {disagree}") and "\n" not in str(e.value)
    with pytest.warns(RenamedKey):  # the same value twice is no disagreement
        assert load_config({"task": "regression", "objective": "regression"}).objective == "regression"


def test_an_override_under_either_name_wins_over_the_file_under_either(tmp_path):
    new_file = tmp_path / "new.yaml"
    new_file.write_text(yaml.safe_dump({"objective": "classification", **DIABETES}))
    old_file = tmp_path / "old.yaml"
    old_file.write_text(yaml.safe_dump({"task": "classification", **DIABETES}))
    with pytest.warns(RenamedKey):
        assert load_config(new_file, ["task=regression"]).objective == "regression"
    with pytest.warns(RenamedKey):
        assert load_config(old_file, ["objective=regression"]).objective == "regression"
    assert load_config(new_file, ["objective=regression"]).objective == "regression"


# Hashes of configs computed by the release before the rename (commit 266682a): registered
# versions carry them, `--resume` and the prepared data's checks compare them.
KNOWN = [
    ({}, "39df3e90562f", "88cb5cc0214e"),
    ({"task": "regression"}, "0b9e5d9db0e4", "4f8fb1bf75ff"),
    ({"task": "regression", **DIABETES}, "848bcaea4be4", None),
]


@pytest.mark.parametrize(
    ("raw", "config_hash", "preparation_hash"), KNOWN, ids=["default", "regression", "diabetes"]
)
def test_a_config_hashes_as_before_the_rename_whichever_key_it_spells(raw, config_hash, preparation_hash):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedKey)
        old = load_config(raw)
    new = load_config({("objective" if k == "task" else k): v for k, v in raw.items()})
    assert old.config_hash() == new.config_hash() == config_hash
    if preparation_hash is not None:
        assert old.preparation_hash() == new.preparation_hash() == preparation_hash


def test_the_bundled_configs_hash_as_before_the_rename():
    assert load_config(REPO / "configs" / "digits.yaml").config_hash() == "39df3e90562f"
    regression = load_config(REPO / "configs" / "diabetes-regression.yaml")
    assert (regression.config_hash(), regression.preparation_hash()) == ("f7a8c39e0fab", "57b852d9e1b8")


def test_the_command_says_the_old_key_in_one_line_and_no_traceback(tmp_path):
    config = tmp_path / "old.yaml"
    old = {"task": "regression", **DIABETES, "model": {"kind": "mlp"}}  # 10 features: no cnn's square
    config.write_text(yaml.safe_dump(old))
    out = subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "validate", str(config), "--set", "task=regression"],
        cwd=REPO,
        env={**_env(), "TRAINFLOW_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines() == [f"warning: {WARNING}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedKey)
        expected = load_config(old).config_hash()
    renamed = {("objective" if k == "task" else k): v for k, v in old.items()}
    assert expected == load_config(renamed).config_hash()
    assert out.stdout.startswith(f"ok: digits (config hash {expected})")


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
