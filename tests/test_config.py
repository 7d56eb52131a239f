import json
from pathlib import Path

import pytest

from trainflow.config import ConfigError, PipelineConfig, load_config, parse_overrides

REPO = Path(__file__).resolve().parents[1]


def test_bundled_default_config_is_the_schema_default():
    # `trainflow run` with no config and `trainflow run configs/digits.yaml` are one job.
    assert load_config(REPO / "configs" / "digits.yaml") == PipelineConfig()


def test_overrides_are_typed_and_nested():
    cfg = load_config(
        {},
        [
            "train.lr=0.01",
            "scaling.num_workers=1",
            "model.image_shape=[1, 8, 8]",
            "data.feature_columns=null",
        ],
    )
    assert cfg.train.lr == 0.01
    assert cfg.scaling.num_workers == 1
    assert cfg.model.image_shape == [1, 8, 8]
    assert parse_overrides(["a.b=true"]) == {"a": {"b": True}}


def test_unknown_key_names_the_dotted_field():
    with pytest.raises(ConfigError, match=r"train\.learning_rate: unknown key; valid keys here: epochs"):
        load_config({"train": {"learning_rate": 0.1}})


def test_unknown_top_level_section_is_refused():
    with pytest.raises(ConfigError, match=r"trainer: unknown key"):
        load_config({"trainer": {}})


def test_wrong_type_names_the_field_and_value():
    with pytest.raises(ConfigError, match=r"train\.epochs: .*integer.*'many'"):
        load_config({}, ["train.epochs=many"])


def test_split_must_leave_training_rows():
    with pytest.raises(ConfigError, match=r"data\.split: .*val \+ test must be below 1"):
        load_config({"data": {"split": {"val": 0.5, "test": 0.5}}})


def test_augmentation_cannot_be_read_once_into_memory():
    with pytest.raises(
        ConfigError, match=r"^invalid config: train\.in_memory: 'always' .* preprocess\.augment"
    ):
        load_config({"preprocess": {"augment": True}, "train": {"in_memory": "always"}})
    load_config({"preprocess": {"augment": True}, "train": {"in_memory": "auto"}})


def test_config_errors_are_one_line():
    with pytest.raises(ConfigError) as err:
        load_config({"train": {"epochs": 0, "lr": "x"}, "model": {"kind": "transformer"}})
    message = str(err.value)
    assert "\n" not in message
    for field in ("train.epochs", "train.lr", "model.kind"):
        assert field in message


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config({}, ["train.lr"])
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n- not a mapping\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(bad)


def test_json_file_loads(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "x", "train": {"epochs": 3}}))
    assert load_config(path).train.epochs == 3


def test_hash_is_stable_and_sensitive():
    a = load_config({"train": {"lr": 0.01}})
    b = load_config({}, ["train.lr=0.01"])
    assert a.config_hash() == b.config_hash()
    assert a.config_hash() != load_config({}, ["train.lr=0.02"]).config_hash()


def test_train_loop_config_is_json_and_refuses_what_is_not():
    cfg = PipelineConfig()
    loop = cfg.to_train_loop_config(model_spec={"kind": "mlp"})
    json.dumps(loop)
    assert loop["epochs"] == cfg.train.epochs and loop["lr"] == cfg.train.lr
    with pytest.raises(ConfigError, match=r"train_loop_config\.extra\.fn: a function"):
        cfg.to_train_loop_config(extra={"fn": lambda: 0})
    with pytest.raises(ConfigError, match=r"train_loop_config\.scale: nan is not a finite"):
        cfg.to_train_loop_config(scale=float("nan"))
