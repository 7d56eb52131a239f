import json
import pickle
import re
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


def test_a_range_of_workers_is_elastic_and_one_upside_down_is_refused_naming_the_field():
    scaling = load_config({}, ["scaling.num_workers=[1, 4]"]).scaling
    assert (scaling.elastic, scaling.min_workers, scaling.max_workers) == (True, 1, 4)
    assert load_config({"scaling": {"num_workers": 3}}).scaling.elastic is False
    with pytest.raises(
        ConfigError, match=r"scaling\.num_workers: .*\[4, 1\]: give a number of workers \(0: none, .*\), or"
    ):
        load_config({"scaling": {"num_workers": [4, 1]}})
    with pytest.raises(ConfigError, match=r"sweep\.scaling: .*a trial trains on a fixed number of workers"):
        load_config({"sweep": {"scaling": {"num_workers": [1, 2]}}})


def test_no_workers_trains_in_the_flows_process_and_what_needs_workers_is_refused_naming_it():
    scaling = load_config({}, ["scaling.num_workers=0"]).scaling
    assert scaling.in_process and not scaling.elastic
    assert not load_config({}).scaling.in_process
    refused = {
        r"scaling: .*num_workers 0 trains in the flow's own process on its CPU: set use_gpu false": {
            "scaling": {"num_workers": 0, "use_gpu": True}
        },
        r"scaling\.num_workers 0 trains trainflow's own loop .*train\.loop mycode:train_func runs on Ray": {
            "scaling": {"num_workers": 0},
            "train": {"loop": "mycode:train_func"},
        },
        r"train\.in_memory never streams the splits to Ray Train workers, .*use auto or always": {
            "scaling": {"num_workers": 0},
            "train": {"in_memory": "never"},
        },
        r"sweep\.scaling: .*num_workers 0: each trial trains in a process of its own": {
            "sweep": {"scaling": {"num_workers": 0}}
        },
        r"scaling\.num_workers: .*\[0, 2\]: give a number of workers": {"scaling": {"num_workers": [0, 2]}},
    }
    for message, raw in refused.items():
        with pytest.raises(ConfigError, match=message):
            load_config(raw)


def test_an_elastic_runs_workers_share_the_global_batch_of_its_largest_size():
    from trainflow.pipelines.training.settings import TrainSettings

    def per_worker(num_workers, workers: int) -> int:
        raw = {"train": {"batch_size": 64}, "scaling": {"num_workers": num_workers}}
        settings = TrainSettings(config=load_config(raw), model_spec={}, preprocessor={})
        return settings.batch_size(workers)

    assert [per_worker([2, 8], n) for n in (2, 4, 8)] == [256, 128, 64]
    assert per_worker(2, 2) == 64  # a fixed run: per worker as written


def test_split_must_leave_training_rows():
    with pytest.raises(ConfigError, match=r"data\.split: .*val \+ test must be below 1"):
        load_config({"data": {"split": {"val": 0.5, "test": 0.5}}})


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


def sweep(**section) -> dict:
    return {"sweep": {"space": {"train.lr": {"loguniform": [1e-4, 1e-1]}}, **section}}


def test_sweep_space_takes_dotted_or_nested_fields():
    cfg = load_config(
        {
            "sweep": {
                "space": {"train": {"lr": {"uniform": [0.01, 0.1]}}, "model.hidden_sizes": {"choice": [[32]]}}
            }
        }
    )
    assert set(cfg.sweep.space) == {"train.lr", "model.hidden_sizes"}
    assert cfg.sweep.scaling.num_workers == 1  # trials default to one worker each


def test_sweep_space_field_that_does_not_exist_is_named():
    with pytest.raises(
        ConfigError, match=r"sweep\.space\.train\.lrx: unknown field; valid keys of train: epochs"
    ):
        load_config({"sweep": {"space": {"train.lrx": {"uniform": [0, 1]}}}})
    with pytest.raises(
        ConfigError, match=r"sweep\.space\.trainer\.lr: unknown field; valid keys of the config"
    ):
        load_config({"sweep": {"space": {"trainer.lr": {"uniform": [0, 1]}}}})


def test_sweep_values_must_fit_their_field():
    with pytest.raises(
        ConfigError, match=r"sweep\.space\.model\.kind: choice value 'rnn' does not fit: model\.kind"
    ):
        load_config({"sweep": {"space": {"model.kind": {"choice": ["mlp", "rnn"]}}}})
    with pytest.raises(
        ConfigError, match=r"sweep\.space\.train\.epochs: uniform .*integer fields take randint"
    ):
        load_config({"sweep": {"space": {"train.epochs": {"uniform": [1, 3]}}}})
    with pytest.raises(ConfigError, match=r"sweep\.space\.train\.lr: .*loguniform bounds must be above 0"):
        load_config({"sweep": {"space": {"train.lr": {"loguniform": [0, 1]}}}})
    with pytest.raises(ConfigError, match=r"sweep\.space\.train\.lr: .*give exactly one of choice, grid"):
        load_config({"sweep": {"space": {"train.lr": {"loguniform": [0.1, 1], "uniform": [0, 1]}}}})


def test_a_sweep_varies_a_lora_adapters_settings_as_any_train_field(tmp_path):
    from trainflow.config import trial_config

    (tmp_path / "config.json").write_text("{}")  # a folder save_pretrained wrote
    space = {"train.lora.r": {"grid": [2, 8]}, "train.lora.dropout": {"uniform": [0.0, 0.2]}}
    config = load_config(
        {"model": {"kind": f"hf:{tmp_path}"}, "train": {"lora": {"alpha": 32}}, "sweep": {"space": space}}
    )
    trial = trial_config(config, {"train.lora.r": 8, "train.lora.dropout": 0.1})
    assert (trial.train.lora.r, trial.train.lora.alpha, trial.train.lora.dropout) == (8, 32, 0.1)
    with pytest.raises(
        ConfigError,
        match=r"sweep\.space\.train\.lora\.r: grid value 0 does not fit: .*greater than or equal to 1",
    ):
        load_config(
            {"model": {"kind": f"hf:{tmp_path}"}, "sweep": {"space": {"train.lora.r": {"grid": [0, 4]}}}}
        )


def test_sweep_varies_only_model_and_train_fields():
    with pytest.raises(ConfigError, match=r"sweep\.space\.data\.limit: only model\.\* and train\.\* fields"):
        load_config({"sweep": {"space": {"data.limit": {"choice": [100, 200]}}}})


def test_an_optuna_sweep_takes_no_grid_dimension_and_names_it():
    space = {"train.lr": {"loguniform": [1e-4, 1e-1]}, "train.batch_size": {"grid": [32, 64]}}
    with pytest.raises(ConfigError, match=r"sweep: .*give train\.batch_size a choice instead of a grid"):
        load_config({"sweep": {"space": space, "search": "optuna"}})
    space["train.batch_size"] = {"choice": [32, 64]}
    assert load_config({"sweep": {"space": space, "search": "optuna"}}).sweep.search == "optuna"


_LR = {"train.lr": {"loguniform": [1e-4, 1e-1]}}


@pytest.mark.parametrize(
    ("sweep", "train", "expected"),
    [
        ({"search": "optuna"}, {}, r"sweep: scheduler pbt draws each trial's next hyperparameters itself"),
        ({"trials": 1}, {}, r"sweep: scheduler pbt trains a population: give trials 2 or more"),
        (
            {"space": {"model.hidden_sizes": {"choice": [[8], [16]]}}},
            {},
            r"sweep\.space\.model\.hidden_sizes: scheduler pbt hands a trial another trial's weights",
        ),
        ({"space": {"train.epochs": {"choice": [4, 8]}}}, {}, r"sweep\.space\.train\.epochs: scheduler pbt"),
        ({}, {"loop": "mine:fit"}, r"sweep\.scheduler\.kind: pbt .* train\.loop mine:fit is your own"),
        (
            {},
            {"epochs": 2},
            r"sweep\.scheduler\.perturbation_interval: 2 epochs is not below train\.epochs 2",
        ),
        (
            {"scheduler": {"kind": "pb2"}, "space": {"train.batch_size": {"choice": [16, 32]}}},
            {},
            r"sweep: scheduler pb2 chooses numbers within bounds: give train\.batch_size a uniform",
        ),
    ],
)
def test_a_population_sweep_refuses_what_it_cannot_hand_on_in_one_line(sweep, train, expected):
    section = {"space": _LR, "trials": 4, "scheduler": {"kind": "pbt"}, **sweep}
    with pytest.raises(ConfigError, match=expected):
        load_config({"train": {"epochs": 8, **train}, "sweep": section})


def test_a_population_sweep_counts_each_grid_value_as_a_trial():
    sweep = {"space": {"train.lr": {"grid": [0.1, 0.01]}}, "trials": 1, "scheduler": {"kind": "pb2"}}
    with pytest.raises(ConfigError, match="pb2 chooses numbers within bounds: give train.lr"):
        load_config({"sweep": sweep})
    sweep["scheduler"]["kind"] = "pbt"
    assert load_config({"sweep": sweep}).sweep.population == 2


def test_sweep_metric_and_mode_agree():
    with pytest.raises(ConfigError, match=r"sweep: .*val_loss is best at its minimum: set mode to min"):
        load_config(sweep(metric="val_loss"))
    assert load_config(sweep(metric="val_loss", mode="min")).sweep.mode == "min"


def test_a_trial_config_runs_as_is_and_hashes_as_a_plain_config():
    from trainflow.config import trial_config

    cfg = load_config(sweep(metric="val_loss", mode="min"))
    trial = trial_config(cfg, {"train.lr": 0.02})
    assert trial.train.lr == 0.02 and trial.sweep is None and trial.scaling == cfg.sweep.scaling
    assert (trial.checkpoint.metric, trial.checkpoint.mode) == ("val_loss", "min")
    # A config without a sweep hashes as before sweeps existed: no "sweep" key in it (nor
    # "cache", where prepared splits are kept, nor registry.lease_s, which no config's hash
    # holds, nor an unset drift section, nor the newer fields that hold their empty default).
    import hashlib

    from trainflow.config.pipeline import HASHED_UNLESS_DEFAULT, HASHED_WHEN_SET

    dropped = ("sweep", "cache", "drift")
    plain = {k: v for k, v in trial.model_dump(mode="json").items() if k not in dropped}
    del plain["registry"]["lease_s"]
    plain["task"] = plain.pop("objective")  # hashed under its name before the rename
    for *parents, field in [*HASHED_WHEN_SET, *HASHED_UNLESS_DEFAULT]:
        if parents[0] in plain:  # not the sweep's, dropped whole
            del plain[parents[0]][field]
    canonical = json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()
    assert trial.config_hash() == hashlib.sha256(canonical).hexdigest()[:12]
    assert cfg.config_hash() != load_config({}).config_hash()


def test_the_sweep_example_config_loads():
    cfg = load_config(REPO / "configs" / "digits-sweep.yaml")
    assert cfg.sweep is not None and cfg.sweep.trials == 8 and cfg.sweep.scheduler.kind == "asha"


def test_a_regression_defaults_to_its_own_loss_metrics_and_an_unbounded_gate():
    config = load_config(
        {"objective": "regression", "data": {"source": "builtin:diabetes", "label_column": "target"}}
    )
    assert config.loss == "mse"
    assert (config.checkpoint.metric, config.checkpoint.mode) == ("val_loss", "min")
    assert config.registry.gate_metric == "rmse" and config.registry.lower_is_better
    assert config.registry.min_value is None  # a bound only when the config sets one
    # What the config sets wins over the objective's defaults.
    bounded = load_config({"objective": "regression", "registry": {"min_value": 60.0, "gate_metric": "mae"}})
    assert (bounded.registry.min_value, bounded.registry.gate_metric) == (60.0, "mae")
    # A classification keeps its defaults: a floor of 0.9 on accuracy.
    assert (PipelineConfig().registry.gate_metric, PipelineConfig().registry.min_value) == ("accuracy", 0.9)
    assert PipelineConfig().loss == "cross_entropy"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"registry": {"gate_metric": "accuracy"}},
            r"registry.gate_metric: accuracy does not measure a regression; use one of rmse, mae, r2",
        ),
        (
            {"train": {"loss": "cross_entropy"}},
            r"train.loss: cross_entropy does not measure a regression; use one of mse, l1, huber",
        ),
        (
            {"checkpoint": {"metric": "val_accuracy"}},
            r"checkpoint.metric: val_accuracy does not measure a regression",
        ),
        ({"train": {"label_smoothing": 0.1}}, r"train.label_smoothing applies to classification"),
        ({"data": {"classes": [1, 2]}}, r"data.classes: a regression's label is a number"),
    ],
)
def test_a_regression_refuses_what_only_classification_means_naming_the_field(raw, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config({"objective": "regression", **raw})
    assert "\n" not in str(e.value)


def test_a_classification_refuses_regression_metrics_and_losses():
    with pytest.raises(ConfigError, match=r"registry.gate_metric: rmse does not measure a classification"):
        load_config({"registry": {"gate_metric": "rmse"}})
    with pytest.raises(ConfigError, match=r"train.loss: mse does not measure a classification"):
        load_config({"train": {"loss": "mse"}})


def test_the_regression_example_config_loads():
    config = load_config(Path(__file__).parent.parent / "configs" / "diabetes-regression.yaml")
    assert config.objective == "regression" and config.data.source == "builtin:diabetes"
    assert config.registry.min_value is None


def test_the_cache_is_a_folder_or_a_uri_and_does_not_change_the_hash(tmp_path, monkeypatch):
    from trainflow.cluster.checks import shared_folders
    from trainflow.workspace import cache_folder, cache_location

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    default, moved = load_config({}), load_config({}, [f"cache={tmp_path / 'shared' / 'cache'}"])
    assert cache_folder(default) == tmp_path / "home" / "cache"
    assert cache_folder(moved) == tmp_path / "shared" / "cache" and cache_folder(moved).is_dir()
    assert shared_folders(moved)["cache"] == str(tmp_path / "shared" / "cache")
    # Where prepared splits are kept changes no result (and configs hash as before the field).
    assert moved.config_hash() == default.config_hash()
    # A URI is where the splits go; what stays on this machine (downloads, ingest records)
    # stays in TRAINFLOW_HOME/cache.
    remote = load_config({"cache": "s3://bucket/cache?region=eu-west-1"})
    assert cache_location(remote) == shared_folders(remote)["cache"] == "s3://bucket/cache?region=eu-west-1"
    assert cache_folder(remote) == tmp_path / "home" / "cache"
    assert remote.config_hash() == default.config_hash()
    with pytest.raises(
        ConfigError,
        match=r"^invalid config: cache: 'http://host/cache' is not a folder or a URI .* s3://, gs://.*file://$",
    ):
        load_config({"cache": "http://host/cache"})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, "39df3e90562f"),
        (
            {"objective": "regression", "data": {"source": "builtin:diabetes", "label_column": "target"}},
            "848bcaea4be4",
        ),
        (
            {
                "data": {"limit": 600, "split": {"seed": 3}},
                "train": {"early_stopping": {"patience": 2}, "callbacks": ["pkg.hooks:on_epoch"]},
                "cache": "s3://bucket/cache",
                "sweep": {
                    "space": {"train.lr": {"loguniform": [1e-4, 1e-1]}},
                    "metric": "val_loss",
                    "mode": "min",
                },
            },
            "e76fc0b9a0e7",
        ),
    ],
    ids=["default", "regression", "sweep"],
)
def test_a_known_config_hashes_to_its_known_value(raw, expected):
    # Registered models carry this hash and `--resume` compares it: the same config hashes
    # the same in every release, whatever module defines the schema.
    assert load_config(raw).config_hash() == expected


def test_the_preparation_hash_follows_data_preprocess_and_objective_only():
    base = load_config({})
    trains_otherwise = load_config(
        {}, ["train.lr=0.02", "model.kind=mlp", "scaling.num_workers=1", "name=other", "cache=/elsewhere"]
    )
    assert trains_otherwise.preparation_hash() == base.preparation_hash()
    assert trains_otherwise.config_hash() != base.config_hash()
    assert re.fullmatch(r"[0-9a-f]{12}", base.preparation_hash())
    for change in ("data.limit=100", "data.split.seed=1", "preprocess.scaler=minmax", "objective=regression"):
        assert load_config({}, [change]).preparation_hash() != base.preparation_hash(), change


def test_a_config_crosses_to_a_worker_pickled_and_unchanged():
    config = load_config(sweep(metric="val_loss", mode="min"))
    copy = pickle.loads(pickle.dumps(config))
    assert copy == config and copy.config_hash() == config.config_hash()


def test_an_unknown_key_in_an_optional_section_lists_that_sections_keys():
    with pytest.raises(
        ConfigError, match=r"train\.early_stopping\.bogus: unknown key; valid keys here: metric, mode"
    ):
        load_config({"train": {"early_stopping": {"bogus": 1}}})
    with pytest.raises(
        ConfigError, match=r"sweep\.scheduler\.bogus: unknown key; valid keys here: kind, grace"
    ):
        load_config(sweep(scheduler={"bogus": 1}))
    with pytest.raises(
        ConfigError, match=r"sweep\.space\.train\.lr\.bogus: unknown key; valid keys here: choice"
    ):
        load_config({"sweep": {"space": {"train.lr": {"choice": [0.1], "bogus": 1}}}})


def test_each_field_hashed_unless_default_holds_that_default_in_the_schema():
    from trainflow.config.pipeline import HASHED_UNLESS_DEFAULT

    config = load_config({"sweep": {"space": {"train.lr": {"loguniform": [1e-4, 1e-1]}}}})
    for path, default in HASHED_UNLESS_DEFAULT.items():
        value = config
        for key in path:
            value = getattr(value, key)
        assert value == default, path
    changed = load_config({"sweep": {"space": config.sweep.space, "scheduler": {"synch": True}}})
    assert changed.config_hash() != config.config_hash()


def test_the_gates_lease_is_no_part_of_a_configs_hash_and_must_be_positive():
    assert load_config({}, ["registry.lease_s=5"]).config_hash() == load_config({}).config_hash()
    with pytest.raises(ConfigError, match=r"registry\.lease_s: .*greater than 0"):
        load_config({}, ["registry.lease_s=0"])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"preprocess": {"tokenizer": {"column": "text"}}},
            "preprocess.tokenizer.name: null takes the tokenizer of an hf: model.kind; cnn has none",
        ),
        (
            {"model": {"kind": "mlp"}, "train": {"lora": {"r": 4}}},
            "train.lora adapts an hf: model.kind, not mlp",
        ),
        (
            {"preprocess": {"transform": "pkg.text:tokens", "tokenizer": {"name": "bert-base-uncased"}}},
            "give transform or tokenizer, not both",
        ),
    ],
    ids=["tokenizer-without-a-model", "lora-of-an-mlp", "transform-and-tokenizer"],
)
def test_hugging_face_settings_that_do_not_fit_fail_naming_the_field(raw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(raw)


def test_an_hf_kind_with_its_tokenizer_and_lora_loads_and_hashes_apart_from_the_default():
    config = load_config(
        {"model": {"kind": "hf:org/model"}, "preprocess": {"tokenizer": {}}, "train": {"lora": {}}}
    )
    assert config.preprocess.tokenizer.model_dump() == {"name": None, "column": "text", "max_length": 128}
    assert config.train.lora.model_dump() == {
        "r": 8,
        "alpha": 16,
        "dropout": 0.05,
        "target_modules": None,
        "merge": False,
    }
    assert config.config_hash() != load_config({"model": {"kind": "hf:org/model"}}).config_hash()


def test_the_drift_section_is_checked_and_hashed_only_when_set():
    plain = load_config({})
    assert plain.drift is None
    warned = load_config({"drift": {}})
    assert (warned.drift.action, warned.drift.psi, warned.drift.ks_pvalue) == ("warn", 0.2, 0.001)
    assert warned.config_hash() != plain.config_hash()
    assert load_config({}, ["drift.action=block"]).drift.action == "block"
    with pytest.raises(ConfigError, match="drift.action"):
        load_config({"drift": {"action": "stop"}})
    with pytest.raises(ConfigError, match="drift.ks_pvalue"):
        load_config({"drift": {"ks_pvalue": 1.5}})
