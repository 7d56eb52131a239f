"""A training function of the user's own (train.loop), written as Ray Train's guide writes
one: its config, the checks before any worker starts, its reports followed per epoch, its
checkpoint's model.pt made trainflow's checkpoint, and its runs resumed. Fits run on real
Ray Train workers over the prepared digits (tests/pipelines/own_loops.py holds the loops)."""

import json
import logging
import pickle
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.controller_probe import ControllerModules, controller_imported_torch, controller_record
from trainflow.config import (
    ConfigError,
    DataConfig,
    ModelConfig,
    PipelineConfig,
    PreprocessConfig,
    load_config,
)
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.models.build import build_model, model_spec
from trainflow.pipelines.models.checkpoint import load_checkpoint
from trainflow.pipelines.training.loop_reports import HISTORY, LoopHistory, LoopReports
from trainflow.pipelines.training.run import run_training
from trainflow.pipelines.training.settings import PreparedSplits, TrainSettings
from trainflow.pipelines.training.user_loop import check_loop, converted_checkpoint, loop_config
from trainflow.run_checks import before_run
from trainflow.testing import small_config

HERE = Path(__file__).parent


def loop_run_config(loop: str, **sections) -> PipelineConfig:
    """A small digits config whose training is ``loop``, ranked by what the loops report."""
    sections.setdefault("checkpoint", {"metric": "val_accuracy", "mode": "max"})
    sections["train"] = {"loop": loop, **sections.get("train", {})}
    return load_config(small_config(**sections))


# The config, and what the loop is called with.


def test_the_config_keeps_train_fields_only_trainflows_loop_reads_at_their_defaults():
    with pytest.raises(ConfigError, match=r"^invalid config: train\.early_stopping: trainflow's own loop"):
        load_config(small_config(train={"loop": "mine:fit", "early_stopping": {"patience": 2}}))
    with pytest.raises(ConfigError, match=r"^invalid config: train\.optimizer: .* train\.loop mine:fit"):
        load_config(small_config(train={"loop": "mine:fit", "optimizer": "sgd"}))
    with pytest.raises(ConfigError, match=r"^invalid config: train\.loop_config: lr is a key trainflow"):
        load_config(small_config(train={"loop": "mine:fit", "loop_config": {"lr": 0.1}}))
    with pytest.raises(ConfigError, match=r"^invalid config: train\.loop_config: settings for train\.loop"):
        load_config(small_config(train={"loop_config": {"warmup": 1}}))
    # A copy of configs/digits.yaml spells every field at its default: it takes a loop.
    digits = load_config(HERE.parents[1] / "configs" / "digits.yaml", ["train.loop=mine:fit"])
    assert digits.hooks() == {"train.loop": "mine:fit"} and digits.user_modules == {"mine": "train.loop"}
    # The loop ranks its checkpoints by whatever it reports.
    assert (
        load_config({"train": {"loop": "mine:fit"}, "checkpoint": {"metric": "loss"}}).checkpoint.metric
        == "loss"
    )
    # A config without a loop hashes as before the fields existed.
    assert PipelineConfig().config_hash() == load_config({"train": {"loop": None}}).config_hash()


def test_the_loop_gets_train_settings_its_own_and_the_runs_config_as_plain_json():
    config = loop_run_config("mine:fit", train={"epochs": 3, "loop_config": {"warmup": 2, "tags": ["a"]}})
    settings = TrainSettings.from_config(config, preprocessor={}, num_features=64, num_outputs=10)
    given = loop_config(settings)
    assert {k: given[k] for k in ("epochs", "batch_size", "lr", "seed", "warmup", "tags")} == {
        "epochs": 3,
        "batch_size": 32,
        "lr": 0.01,
        "seed": 0,
        "warmup": 2,
        "tags": ["a"],
    }
    assert given["trainflow"]["train"]["loop"] == "mine:fit" and given["trainflow"]["name"] == "digits-test"
    assert given["trainflow"]["model_spec"] == settings.model_spec
    assert json.loads(json.dumps(given)) == given  # plain JSON, as Ray's controller unpickles it


def test_a_loop_is_imported_and_takes_one_argument_or_fails_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "loops_signatures.py").write_text(
        "def one(config): pass\n"
        "def more(config, extra=1): pass\n"
        "def none(): pass\n"
        "def two(config, other): pass\n"
        "value = 3\n"
        "raise_here = None\n"
    )
    (tmp_path / "loops_broken.py").write_text("import no_such_package_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check_loop("loops_signatures:one").__name__ == "one"
    assert check_loop("loops_signatures:more").__name__ == "more"
    for path, message in [
        ("loops_signatures:none", r"none\(\) does not take one argument; .* as def none\(config\)$"),
        ("loops_signatures:two", r"two\(config, other\) does not take one argument"),
        ("loops_signatures:value", r"loops_signatures\.value is a int, not a callable$"),
        ("loops_missing:fit", r"module 'loops_missing' is not importable here"),
        ("loops_broken:fit", r"importing loops_broken failed: No module named 'no_such_package_here'$"),
    ]:
        with pytest.raises(ConfigError, match=rf"^train\.loop {path}: {message}") as e:
            check_loop(path)
        assert "\n" not in str(e.value)
    # The command's checks, before Prefect's server and Ray start; a sweep trains
    # trainflow's own loop only.
    with pytest.raises(ConfigError, match=r"^train\.loop loops_signatures:two: two\(config, other\)"):
        before_run(loop_run_config("loops_signatures:two"))
    sweep = {"space": {"train.lr": {"loguniform": [1e-3, 1e-1]}}, "trials": 2}
    with pytest.raises(ConfigError, match=r"^invalid config: sweep: .* not train\.loop loops_signatures:one"):
        before_run(loop_run_config("loops_signatures:one", sweep=sweep), sweep=True)


# The loop's reports, as the controller follows them.


def test_the_history_counts_epochs_from_1_whether_the_loop_counts_from_0_1_or_not_at_all():
    guide = LoopHistory()
    assert [guide.add({"loss": 0.5, "epoch": e})["epoch"] for e in (0, 1, 2)] == [1, 2, 3]
    assert guide.rows[0] == {"loss": 0.5, "epoch": 1}
    ones = LoopHistory()
    assert [ones.add({"epoch": e})["epoch"] for e in (1, 2)] == [1, 2]
    counted = LoopHistory()
    assert [counted.add({"loss": 1.0, "note": "text", "flag": True})["epoch"] for _ in range(3)] == [1, 2, 3]
    assert counted.rows[0] == {"loss": 1.0, "epoch": 1}  # numbers only, for MLflow and the log

    # Epochs 1 and 2 checkpointed, 3 reported, then the workers fail: the rows after the
    # checkpoint go, and the restarted group's epochs follow it, counted or reported.
    counted.rewind()
    assert counted.rows == []  # no checkpoint was taken: the group starts over
    history = LoopHistory()
    for e in (0, 1):
        history.add({"epoch": e})
        saved = history.checkpoint()
    history.add({"epoch": 2})
    history.rewind()
    assert [r["epoch"] for r in history.rows] == [1, 2]
    history.add({"epoch": 2, "loss": 0.1})
    assert history.rows[-1] == {"epoch": 3, "loss": 0.1}
    # A driver fitting the run again starts from the checkpoint's history.
    resumed = LoopHistory.from_json(saved)
    assert resumed.add({"epoch": 2})["epoch"] == 3 and resumed.add({})["epoch"] == 4


@pytest.mark.slow
def test_what_ray_trains_controller_unpickles_of_a_loops_run_imports_no_torch():
    sent = pickle.dumps(LoopReports("progress-name", {"history": [{"epoch": 1}], "epoch_offset": 1}))
    code = (
        "import sys, pickle\n"
        "reports = pickle.loads(sys.stdin.buffer.read())\n"
        "assert reports.history.rows == [{'epoch': 1}]\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], input=sent, capture_output=True, check=True)
    assert out.stdout.decode().strip() == "[]"


# A loop's model.pt, made trainflow's checkpoint.


def settings_of(kind: str, tmp_path: Path, **model) -> TrainSettings:
    pre = Preprocessor([f"p{i}" for i in range(64)], "label", [0, 1, 2], [0.0] * 64, [1.0] * 64)
    config = loop_run_config("mine:fit", model={"kind": kind, **model})
    return TrainSettings.from_config(config, preprocessor=pre.to_dict(), num_features=64, num_outputs=3)


def loop_checkpoint(folder: Path, state) -> str:
    folder.mkdir(parents=True)
    torch.save(state, folder / "model.pt")
    return str(folder)


def test_a_loops_model_pt_becomes_a_checkpoint_that_predicts_as_the_loops_model(tmp_path):
    torch.manual_seed(0)
    rows = pd.DataFrame(np.random.default_rng(0).normal(size=(4, 64)), columns=[f"p{i}" for i in range(64)])
    # An MLP saved as DDP wraps it (module. names), and a resnet18 as the guide builds it,
    # inside what trainflow wraps a torchvision model in.
    for kind, extra in [
        ("mlp", {"hidden_sizes": [16]}),
        ("torchvision:resnet18", {"image_shape": [1, 8, 8]}),
    ]:
        settings = settings_of(kind, tmp_path, **extra)
        trained = build_model(settings.model_spec).eval()
        inner = getattr(trained, "net", trained)
        state = {f"module.{k}": v for k, v in inner.state_dict().items()}
        folder = loop_checkpoint(tmp_path / kind.replace(":", "-") / "checkpoint_1", state)
        metrics = {"epoch": 2, "loss": 0.3, "history": [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.3}]}
        converted = converted_checkpoint(folder, settings, metrics)
        assert Path(converted).name == "trainflow-checkpoint_1"
        predictor = load_checkpoint(converted)
        assert predictor.metrics == metrics and predictor.config["train"]["loop"] == "mine:fit"
        with torch.no_grad():
            expected = trained(torch.tensor(rows.to_numpy(), dtype=torch.float32)).argmax(1).numpy()
        assert list(predictor.predict(rows)) == list(expected)


def test_a_loops_checkpoint_without_a_model_pt_that_fits_fails_in_one_line_naming_both(tmp_path):
    settings = settings_of("mlp", tmp_path, hidden_sizes=[16])
    other = build_model(model_spec(ModelConfig(kind="mlp", hidden_sizes=[8]), 64, 3)).state_dict()
    for name, make, message in [
        ("empty", lambda f: f.mkdir(parents=True), r"its checkpoint holds no model\.pt \(nothing\)"),
        (
            "listed",
            lambda f: loop_checkpoint(f, [torch.zeros(2)]),
            r"its checkpoint's model\.pt holds a list, not",
        ),
        (
            "other",
            lambda f: loop_checkpoint(f, other),
            r"its checkpoint's model\.pt does not fit the model model\.kind mlp builds: 0\.weight \[8, 64\] "
            r"where the model has \[16, 64\]; 0\.bias \[8\] where the model has \[16\]; 3\.weight",
        ),
    ]:
        make(tmp_path / name)
        with pytest.raises(ConfigError, match=rf"^train\.loop mine:fit: {message}") as e:
            converted_checkpoint(str(tmp_path / name), settings, {"epoch": 1})
        assert "\n" not in str(e.value)


# Whole runs, on two Ray Train workers.


@pytest.fixture(scope="module")
def prepared(ray_cluster, tmp_path_factory):
    from trainflow.pipelines.data.prepare import prepare
    from trainflow.pipelines.data.schema import inspect_source

    info = inspect_source(DataConfig(limit=400))
    entry = prepare(info, DataConfig().split, PreprocessConfig(), tmp_path_factory.mktemp("cache"))
    pre = entry.preprocessor
    return PreparedSplits(str(entry.path), pre.to_dict(), pre.num_features, len(pre.classes))


@pytest.fixture(scope="module")
def loops(tmp_path_factory) -> str:
    """tests/pipelines/own_loops.py as a module of this run's own name, on the driver's path
    only: the run ships it to the workers."""
    code = tmp_path_factory.mktemp("code")
    name = f"own_loops_{uuid.uuid4().hex[:8]}"
    shutil.copyfile(HERE / "own_loops.py", code / f"{name}.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(code))
        yield name


def fit(config: PipelineConfig, prepared: PreparedSplits, storage: Path, run_name: str | None = None, **kw):
    rows = []
    result = run_training(
        config, prepared, run_name=run_name or f"loop-{uuid.uuid4().hex[:8]}", storage=str(storage),
        on_row=rows.append, **kw,
    )  # fmt: skip
    return result, rows


@pytest.mark.slow
def test_a_guide_style_loop_trains_on_two_workers_from_shards_and_its_best_checkpoint_loads(
    prepared, loops, tmp_path
):
    config = loop_run_config(f"{loops}:train_with_val", train={"epochs": 2}, scaling={"num_workers": 2})
    run_name = f"guide-{uuid.uuid4().hex[:8]}"
    result, rows = fit(config, prepared, tmp_path, run_name, callbacks=[ControllerModules()])
    # The plan, each worker group's start, then an epoch row per report, counted from 1.
    assert rows[0]["kind"] == "plan" and rows[0]["loop"] == f"{loops}:train_with_val"
    assert rows[0]["in_memory"] == [] and rows[0]["streamed"] == ["train", "val"]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    assert [r["kind"] for r in rows[1:]] == ["start", "epoch", "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2] and all("val_accuracy" in r for r in epochs)
    assert result.history == [{k: v for k, v in r.items() if k != "kind"} for r in epochs]
    assert (result.status, result.epoch, result.starts, result.in_memory) == ("completed", 2, [0], ())

    # The shards held what trainflow's loop reads, whatever train.in_memory would say.
    top = max(r["val_accuracy"] for r in epochs)  # epochs may tie on it: Ray keeps either
    assert result.best_metrics in [{k: v for k, v in r.items() if k != "kind"} for r in epochs]
    assert result.best_metrics["val_accuracy"] == top
    best = result.best_metrics
    ray_checkpoint = Path(result.best_checkpoint).with_name(
        Path(result.best_checkpoint).name[len("trainflow-") :]
    )
    seen = json.loads((ray_checkpoint / "batch.json").read_text())
    assert seen["seen"] == {"features": ["torch.float32", [64]], "label": ["torch.int64", []]}
    assert seen["config"]["epochs"] == 2 and seen["config"]["trainflow"]["model_spec"]["kind"] == "mlp"
    assert json.loads((ray_checkpoint / HISTORY).read_text())["history"][-1]["epoch"] == best["epoch"]

    # The best checkpoint, converted, is trainflow's: it loads and predicts the classes.
    predictor = load_checkpoint(result.best_checkpoint)
    assert predictor.metrics["epoch"] == best["epoch"] and len(predictor.metrics["history"]) == best["epoch"]
    assert set(predictor.predict(pd.DataFrame([[0.0] * 64], columns=predictor.preprocessor.input_columns)))
    # Ray Train's controller unpickled the loop's reports follower and what the workers
    # returned without importing torch (unless its process held torch already).
    assert controller_record(run_name) is not None and controller_imported_torch(run_name) in (False, None)


@pytest.mark.slow
def test_a_loop_without_a_checkpoint_or_its_metric_fails_in_one_line(prepared, loops, tmp_path, caplog):
    with pytest.raises(
        ConfigError, match=rf"^train\.loop {loops}:no_checkpoint: reported no checkpoint; "
    ) as e:
        fit(loop_run_config(f"{loops}:no_checkpoint"), prepared, tmp_path)
    assert "\n" not in str(e.value)
    # A checkpoint.metric the config names and the loop does not report: the run stops at
    # the loop's first checkpoint, before any epoch is logged, however many it would train.
    config = loop_run_config(f"{loops}:returns_a_tensor", train={"epochs": 1000})
    rows = []
    with pytest.raises(
        ConfigError,
        match=rf"^checkpoint\.metric val_accuracy: train\.loop {loops}:returns_a_tensor reports no such "
        r"metric with its checkpoints; it reports loss: name one of them$",
    ):
        run_training(config, prepared, run_name="no-metric", storage=str(tmp_path), on_row=rows.append)
    assert [r["kind"] for r in rows if r["kind"] == "epoch"] == []

    # The same metric left at its default, which the loop need not know: its latest
    # checkpoint is kept, as Ray keeps it, and the log says so once.
    config = loop_run_config(f"{loops}:returns_a_tensor", train={"epochs": 2}, checkpoint={})
    with caplog.at_level(logging.WARNING, logger="trainflow"):
        result, _ = fit(config, prepared, tmp_path)
    assert result.epoch == 2 and result.best_metrics["epoch"] == 2
    warned = [r.getMessage() for r in caplog.records if "checkpoint.metric" in r.getMessage()]
    assert warned == [
        f"train.loop {loops}:returns_a_tensor reports no val_accuracy (checkpoint.metric's default): its "
        "latest checkpoint is kept; set checkpoint.metric to one it reports (loss) to keep its best"
    ]


@pytest.mark.slow
def test_a_loop_whose_module_does_not_import_fails_before_any_worker_starts(prepared, tmp_path):
    rows = []
    with pytest.raises(ConfigError, match=r"^train\.loop no_such_loops:fit: module 'no_such_loops' is not"):
        run_training(
            loop_run_config("no_such_loops:fit"), prepared, run_name="never", storage=str(tmp_path),
            on_row=rows.append,
        )  # fmt: skip
    assert rows == [] and not (tmp_path / "never").exists()


@pytest.mark.slow
def test_a_loop_resumes_from_its_checkpoint_after_a_lost_worker_and_when_fitted_again(
    prepared, loops, tmp_path
):
    def config(max_failures: int, marker: Path) -> PipelineConfig:
        loop_config = {"fail_at": 1, "fail_marker": str(marker)}
        return loop_run_config(
            f"{loops}:train_with_val",
            train={"epochs": 2, "loop_config": loop_config},
            scaling={"num_workers": 2},
            failure={"max_failures": max_failures},
        )

    # A worker lost after epoch 1's checkpoint: Ray restarts the group from it.
    result, rows = fit(config(1, tmp_path / "lost"), prepared, tmp_path)
    assert result.starts == [0, 1]
    assert [h["epoch"] for h in result.history] == [1, 2]
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [1, 2]

    # The same loss with no restart left: the fit fails; fitted again under the same run
    # name (a Prefect retry of the train task), the run resumes from epoch 1's checkpoint.
    run_name = f"again-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match="a worker lost at epoch 1"):
        fit(config(0, tmp_path / "retried"), prepared, tmp_path, run_name)
    result, rows = fit(config(0, tmp_path / "retried"), prepared, tmp_path, run_name)
    assert result.starts == [1]
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [2]
    assert [h["epoch"] for h in result.history] == [1, 2]
    assert load_checkpoint(result.best_checkpoint).metrics["history"][0]["epoch"] == 1
