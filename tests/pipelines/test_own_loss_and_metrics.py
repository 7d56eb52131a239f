"""A loss and metrics of the user's own (train.loss, evaluation.metrics), named as
package.module:name in a module of the user's project on sys.path: the loss the loop
trains with, the metrics scored on the whole validation split each epoch (val_<name>,
the same on every worker) and on the test split, and each bad value refused in one line
before any worker starts."""

import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from trainflow.config import ConfigError, DataConfig, PreprocessConfig, load_config
from trainflow.pipelines.data.entry import read_split_batches
from trainflow.pipelines.data.prepare import prepare
from trainflow.pipelines.data.preprocess import FEATURES, LABEL
from trainflow.pipelines.data.schema import inspect_source
from trainflow.pipelines.evaluation.evaluate import evaluate_split
from trainflow.pipelines.models.checkpoint import load_checkpoint
from trainflow.pipelines.registry import gate
from trainflow.pipelines.training import loop as training_loop
from trainflow.pipelines.training import optim
from trainflow.pipelines.training.losses import make_loss
from trainflow.pipelines.training.run import run_training
from trainflow.pipelines.training.settings import PreparedSplits, TrainSettings
from trainflow.run_checks import before_run
from trainflow.testing import small_config

# A user's module: a focal loss (a class built with train.loss_args), a loss function,
# metrics, and the mistakes a user makes, each under a name of its own.
USER_CODE = """
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn


    class FocalLoss(nn.Module):
        def __init__(self, gamma=2.0):
            super().__init__()
            self.gamma = gamma

        def forward(self, outputs, targets):
            log_p = F.log_softmax(outputs.float(), dim=1).gather(1, targets[:, None]).squeeze(1)
            return (-((1 - log_p.exp()) ** self.gamma) * log_p).mean()


    def scaled_ce(outputs, targets, scale=1.0):
        return scale * F.cross_entropy(outputs, targets)


    def mean_abs(outputs, targets):
        assert outputs.shape == targets.shape and outputs.dtype == targets.dtype
        return (outputs - targets).abs().mean()


    def top2(targets, outputs):
        top = np.argsort(-outputs, axis=1)[:, :2]
        return float(np.mean((top == targets[:, None]).any(axis=1)))


    def brier(targets, outputs):
        onehot = np.eye(outputs.shape[1])[targets]
        return float(np.mean(np.sum((outputs - onehot) ** 2, axis=1)))


    def per_row(outputs, targets):
        return F.cross_entropy(outputs, targets, reduction="none")


    def from_numpy(outputs, targets):
        return torch.tensor(float(np.mean(outputs.detach().numpy())))


    def raises(*args):
        raise ValueError("labels must be one-hot")


    def nan_metric(targets, outputs):
        return float("nan")


    def array_metric(targets, outputs):
        return outputs.max(axis=1)


    def text_metric(targets, outputs):
        return "0.9"
"""


def user_module(tmp_path: Path, monkeypatch) -> str:
    """The user's module, under a name of its own, on this process's sys.path (a run ships
    it to the Ray workers)."""
    name = f"own_{uuid.uuid4().hex[:8]}"
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / f"{name}.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.syspath_prepend(str(code))
    return name


@pytest.fixture
def mod(tmp_path, monkeypatch) -> str:
    return user_module(tmp_path, monkeypatch)


def settings_of(**sections):
    """What the train task builds in the driver before any worker starts, for digits."""
    config = load_config(small_config(**sections))
    return TrainSettings.from_config(config, preprocessor={}, num_features=64, num_outputs=10)


def test_a_loss_class_is_built_with_loss_args_and_a_function_gets_them_as_keywords(mod):
    outputs, targets = torch.randn(8, 10), torch.arange(8) % 10
    cross_entropy = nn.functional.cross_entropy(outputs, targets)
    # Focal loss with gamma 0 is cross entropy; with gamma 2, rows get less than that.
    focal_0 = make_loss(f"{mod}:FocalLoss", loss_args={"gamma": 0.0})
    assert focal_0(outputs, targets).item() == pytest.approx(cross_entropy.item())
    assert make_loss(f"{mod}:FocalLoss", loss_args={"gamma": 2.0})(outputs, targets) < cross_entropy
    doubled = make_loss(f"{mod}:scaled_ce", loss_args={"scale": 2.0})
    assert doubled(outputs, targets).item() == pytest.approx(2 * cross_entropy.item())
    # A regression's loss gets one output per row, against the label in the outputs' dtype.
    outputs, label = torch.randn(5, 1), torch.randn(5, dtype=torch.float64)
    regression = make_loss(f"{mod}:mean_abs", objective="regression")
    assert regression(outputs, label).item() == pytest.approx((outputs[:, 0] - label).abs().mean().item())
    # The settings the workers get pass the checks and cross to them with the loss named.
    settings = settings_of(train={"loss": f"{mod}:FocalLoss", "loss_args": {"gamma": 1.0}})
    assert settings.config.train.loss_args == {"gamma": 1.0}


@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed"])
def test_the_loop_trains_with_a_users_loss_in_every_precision(mod, precision):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = [
        {FEATURES: torch.randn(32, 8, generator=g), LABEL: torch.randint(0, 3, (32,), generator=g)}
    ] * 4
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    focal = make_loss(f"{mod}:FocalLoss", loss_args={"gamma": 2.0})
    p = optim.Precision(precision, torch.device("cpu"))
    losses = [training_loop.train_epoch(model, batches, optimizer, focal, p) for _ in range(5)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert training_loop.validate(model, batches, focal, p)["val_loss"] < losses[0]


@pytest.mark.parametrize(
    ("loss", "loss_args", "message"),
    [
        ("{mod}:nothing", {}, "train.loss {mod}:nothing: module {mod} has no 'nothing'"),
        ("{mod}:FocalLoss", {"alpha": 0.25}, "train.loss {mod}:FocalLoss raised TypeError: "),
        ("{mod}:raises", {}, "train.loss {mod}:raises raised ValueError: labels must be one-hot"),
        (
            "{mod}:per_row",
            {},
            "train.loss {mod}:per_row: returned a Tensor of shape [4] for outputs of shape [4, 10], "
            "not a scalar tensor; reduce it over the batch (.mean())",
        ),
        (
            "{mod}:from_numpy",
            {},
            "train.loss {mod}:from_numpy: its result for outputs of shape [4, 10] carries no gradient",
        ),
    ],
    ids=["not-there", "bad-args", "raises", "not-a-scalar", "no-gradient"],
)
def test_a_bad_loss_fails_in_one_line_in_the_driver(mod, loss, loss_args, message):
    with pytest.raises(ConfigError) as e:
        settings_of(train={"loss": loss.format(mod=mod), "loss_args": loss_args})
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(message.format(mod=mod)), e.value


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("{mod}:raises", "evaluation.metrics.m.fn {mod}:raises raised ValueError: labels must be one-hot"),
        ("{mod}:nan_metric", "evaluation.metrics.m.fn {mod}:nan_metric: returned nan on a sample of 20 rows"),
        (
            "{mod}:array_metric",
            "evaluation.metrics.m.fn {mod}:array_metric: returned a ndarray of shape [20]",
        ),
        ("{mod}:text_metric", "evaluation.metrics.m.fn {mod}:text_metric: returned a str, not a float"),
    ],
    ids=["raises", "not-finite", "an-array", "a-str"],
)
def test_a_bad_metric_fails_in_one_line_in_the_driver(mod, fn, message):
    with pytest.raises(ConfigError) as e:
        settings_of(evaluation={"metrics": {"m": {"fn": fn.format(mod=mod), "mode": "max"}}})
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(message.format(mod=mod)), e.value


def test_a_loss_or_metric_that_does_not_import_fails_the_checks_before_anything_starts(mod):
    loss = load_config(small_config(train={"loss": "not_my_code.losses:Focal"}))
    with pytest.raises(ConfigError, match=r"^train\.loss not_my_code\.losses:Focal: module 'not_my_code' is"):
        before_run(loss)
    metric = load_config(small_config(evaluation={"metrics": {"top2": {"fn": f"{mod}:top3", "mode": "max"}}}))
    with pytest.raises(ConfigError, match=rf"^evaluation\.metrics\.top2\.fn {mod}:top3: module {mod} has no"):
        before_run(metric)


def test_the_config_refuses_what_cannot_apply_in_one_line():
    def refused(**sections) -> str:
        with pytest.raises(ConfigError) as e:
            load_config(small_config(**sections))
        assert "\n" not in str(e.value)
        return str(e.value)

    top2 = {"metrics": {"top2": {"fn": "mine:top2", "mode": "max"}}}
    assert "evaluation.metrics: accuracy is a built-in metric's name" in refused(
        evaluation={"metrics": {"accuracy": {"fn": "mine:acc", "mode": "max"}}}
    )
    assert "train.label_smoothing applies to the built-in cross_entropy, not to train.loss mine:Focal" in (
        refused(train={"loss": "mine:Focal", "label_smoothing": 0.1})
    )
    assert "train.class_weights applies to the built-in cross_entropy" in refused(
        train={"loss": "mine:Focal", "class_weights": "balanced"}
    )
    assert "train.loss_args are for a loss of your own" in refused(train={"loss_args": {"gamma": 2}})
    assert (
        "registry.gate_metric: top3 does not measure a classification; use one of accuracy, macro_f1, "
        in (refused(evaluation=top2, registry={"gate_metric": "top3"}))
    )
    assert "checkpoint.mode: min ranks val_top2 the wrong way; evaluation.metrics.top2.mode is max" in (
        refused(evaluation=top2, checkpoint={"metric": "val_top2", "mode": "min"})
    )
    # What a metric of one's own may do, in one config.
    config = load_config(
        small_config(
            evaluation=top2,
            registry={"gate_metric": "top2"},
            checkpoint={"metric": "val_top2", "mode": "max"},
            train={"early_stopping": {"metric": "val_top2", "mode": "max"}},
        )
    )
    assert config.user_modules == {"mine": "evaluation.metrics.top2.fn"}
    assert not config.lower_is_better("top2")


def test_the_gate_follows_a_metrics_mode():
    config = load_config(
        small_config(
            evaluation={"metrics": {"brier": {"fn": "mine:brier", "mode": "min"}}},
            registry={"gate_metric": "brier", "min_value": 0.2},
        )
    )
    thresholds, lower = config.registry, config.lower_is_better("brier")
    assert lower
    assert gate.decide("brier", 0.10, 0.12, thresholds, lower_is_better=lower, champion_version="1").passed
    worse = gate.decide("brier", 0.13, 0.12, thresholds, lower_is_better=lower, champion_version="1")
    assert not worse.passed and "(lower is better)" in worse.reason
    ceiling = gate.decide("brier", 0.25, None, thresholds, lower_is_better=lower)
    assert not ceiling.passed and "above the ceiling min_value 0.2" in ceiling.reason


# --- a real run: two Ray Train workers on the prepared digits -----------------------


@pytest.fixture(scope="module")
def splits(ray_cluster, tmp_path_factory):
    info = inspect_source(DataConfig(limit=600))
    prepared = prepare(info, DataConfig().split, PreprocessConfig(), tmp_path_factory.mktemp("cache"))
    pre = prepared.preprocessor
    return PreparedSplits(str(prepared.path), pre.to_dict(), pre.num_features, len(pre.classes))


@pytest.fixture(scope="module")
def focal_run(splits, tmp_path_factory):
    """A run on two workers that trains with the focal loss, ranks checkpoints by val_top2
    and stops early by it (no epoch can beat the first by 10): (config, result, rows)."""
    with pytest.MonkeyPatch.context() as mp:
        mod = user_module(tmp_path_factory.mktemp("user"), mp)
        config = load_config(
            small_config(
                train={
                    "epochs": 6,
                    "loss": f"{mod}:FocalLoss",
                    "loss_args": {"gamma": 2.0},
                    "early_stopping": {"metric": "val_top2", "mode": "max", "patience": 2, "min_delta": 10.0},
                },
                evaluation={"metrics": {"top2": {"fn": f"{mod}:top2", "mode": "max"}}},
                checkpoint={"metric": "val_top2", "mode": "max"},
                scaling={"num_workers": 2},
            )
        )
        rows = []
        result = run_training(
            config,
            splits,
            run_name=f"own-{uuid.uuid4().hex[:8]}",
            storage=str(tmp_path_factory.mktemp("runs")),
            on_row=rows.append,
        )
        yield config, result, [r for r in rows if r["kind"] == "epoch"], mod


def top2(targets, outputs) -> float:
    return float(np.mean((np.argsort(-outputs, axis=1)[:, :2] == targets[:, None]).any(axis=1)))


@pytest.mark.slow
def test_two_workers_score_a_metric_on_the_whole_val_split_rank_by_it_and_stop_together(focal_run, splits):
    config, result, epochs, mod = focal_run
    # Early stopping by val_top2 stopped both workers after 1 + patience epochs.
    assert (result.status, result.epoch) == ("early_stopped", 3)
    assert result.message == "val_top2 did not improve for 2 epochs"
    assert [row["epoch"] for row in epochs] == [1, 2, 3] and all("val_top2" in row for row in epochs)
    # The best checkpoint is the epoch of the highest val_top2.
    best = max(result.history, key=lambda m: m["val_top2"])
    assert result.best_metrics["epoch"] == best["epoch"]
    # Its val_top2 and val_loss are its model's on every val row, though each worker held
    # half of them: the metric saw the rows gathered, the loss is the focal loss.
    batch = next(iter(read_split_batches(f"{splits.path}/val", batch_size=1 << 16)))
    x, y = torch.tensor(batch[FEATURES]), torch.tensor(batch[LABEL])
    with torch.no_grad():
        logits = load_checkpoint(result.best_checkpoint).model(x)
    probabilities = torch.softmax(logits, dim=1).numpy()
    assert result.best_metrics["val_top2"] == pytest.approx(top2(y.numpy(), probabilities))
    focal = make_loss(f"{mod}:FocalLoss", loss_args={"gamma": 2.0})(logits, y).item()
    assert result.best_metrics["val_loss"] == pytest.approx(focal, rel=1e-5)
    assert focal < nn.functional.cross_entropy(logits, y).item()


@pytest.mark.slow
def test_the_test_split_is_scored_by_the_metric_in_the_driver_and_on_actors_alike(focal_run, splits):
    config, result, _, _ = focal_run
    test = f"{splits.path}/test"
    rows = sum(len(b[LABEL]) for b in read_split_batches(test, batch_size=1 << 16))
    in_driver, where = evaluate_split(result.best_checkpoint, test, rows, config.evaluation)
    on_actors, where_actors = evaluate_split(
        result.best_checkpoint, test, rows, config.evaluation.model_copy(update={"in_driver_max_rows": 0})
    )
    assert (where, where_actors) == ("in the driver", "by 1 Ray Data actor(s)")
    batch = next(iter(read_split_batches(test, batch_size=1 << 16)))
    with torch.no_grad():
        logits = load_checkpoint(result.best_checkpoint).model(torch.tensor(batch[FEATURES]))
    expected = top2(batch[LABEL], torch.softmax(logits, dim=1).numpy())
    assert in_driver["top2"] == pytest.approx(expected) and on_actors["top2"] == pytest.approx(expected)
    assert in_driver["top2"] >= in_driver["accuracy"]
