"""The sweep's own logic without running trials: the search space it hands Ray Tune, and
the best trial it picks (tests/flows/test_sweep.py and tests/flows/test_regression.py run
real sweeps, of grid dimensions)."""

import random

import numpy as np
import pytest

from trainflow.config import load_config
from trainflow.pipelines.training.in_process import trains_in_trial, trial_resources
from trainflow.pipelines.training.search import search_space
from trainflow.pipelines.training.settings import PreparedSplits
from trainflow.pipelines.training.tuning import SweepFailed, TrialSummary, best_trial


def sweep_config(space: dict, **section):
    return load_config({"sweep": {"space": space, **section}})


def samples(domain, n: int = 400) -> list:
    random.seed(0)
    np.random.seed(0)
    return [domain.sample() for _ in range(n)]


def test_each_dimension_kind_becomes_the_tune_domain_of_its_bounds():
    space = search_space(
        sweep_config(
            {
                "train.lr": {"loguniform": [1e-4, 1e-1]},
                "train.weight_decay": {"uniform": [0.0, 0.01]},
                "train.epochs": {"randint": [2, 4]},
                "model.hidden_sizes": {"choice": [[16], [32, 16]]},
                "train.batch_size": {"grid": [16, 64]},
            }
        ).sweep
    )

    lr = samples(space["train.lr"])
    assert 1e-4 <= min(lr) and max(lr) <= 1e-1
    # Log-uniform: as many samples in each decade, not nine tenths in the top one.
    assert sum(v < 1e-2 for v in lr) / len(lr) == pytest.approx(2 / 3, abs=0.1)
    decay = samples(space["train.weight_decay"])
    assert 0.0 <= min(decay) and max(decay) <= 0.01
    assert sorted(set(samples(space["train.epochs"]))) == [2, 3]  # randint's high is exclusive
    assert {tuple(v) for v in samples(space["model.hidden_sizes"])} == {(16,), (32, 16)}
    # grid: every value in every sample, which Tune expands itself.
    assert space["train.batch_size"] == {"grid_search": [16, 64]}


def trial(trial_id: str, best: float | None, checkpoint=None, status="completed", error="") -> TrialSummary:
    return TrialSummary(
        trial_id=trial_id,
        params={"train.lr": 0.01},
        status=status,
        epochs=3 if best is not None else 0,
        max_epochs=3,
        best=best,
        best_epoch=3 if best is not None else None,
        best_checkpoint=str(checkpoint) if checkpoint else None,
        run_path=None,
        error=error,
    )


def test_the_best_trial_is_the_highest_or_lowest_by_mode_among_those_with_a_checkpoint(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    trials = [
        trial("a", 0.8, tmp_path / "a"),
        trial("b", 0.9, tmp_path / "b"),
        trial("c", 0.7, tmp_path / "c"),
        trial("gone", 0.95, tmp_path / "removed"),  # its checkpoint folder no longer exists
        trial("failed", None, status="failed", error="ValueError: boom"),
    ]
    accuracy = sweep_config({"train.lr": {"grid": [0.01]}}, metric="val_accuracy", mode="max")
    assert best_trial(accuracy, trials).trial_id == "b"
    loss = sweep_config({"train.lr": {"grid": [0.01]}}, metric="val_loss", mode="min")
    assert best_trial(loss, trials).trial_id == "c"


def test_a_sweep_whose_every_trial_failed_says_why_each_did():
    config = sweep_config({"train.lr": {"grid": [0.01, 1e6]}})
    trials = [
        trial("a1", None, status="failed", error="TrainingDiverged: train loss became nan in epoch 1"),
        trial("a2", None, status="stopped early"),
    ]
    with pytest.raises(SweepFailed) as failed:
        best_trial(config, trials)
    assert str(failed.value) == (
        "no trial of the sweep produced a checkpoint: trial a1: TrainingDiverged: train loss "
        "became nan in epoch 1; trial a2: stopped early"
    )


def test_trials_of_one_cpu_worker_on_data_in_memory_train_in_their_own_reused_process(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split in ("train", "val"):
        (tmp_path / split).mkdir()
        pq.write_table(pa.table({"x": [0.0, 1.0], "label": [0, 1]}), tmp_path / split / "part.parquet")
    prepared = PreparedSplits(path=str(tmp_path), preprocessor={}, num_features=1, num_outputs=2)
    space = {"train.lr": {"grid": [0.01, 0.1]}}
    assert trains_in_trial(sweep_config(space), prepared)
    half = sweep_config(space, scaling={"num_workers": 1, "resources_per_worker": {"CPU": 0.5}})
    assert trial_resources(half, trains_in_trial(half, prepared)) == {"CPU": 0.5}
    # Trials that need Ray Train's own workers, or PBT's hand-over of checkpoints, keep them.
    for others in (
        {"reuse_workers": False},
        {"scaling": {"num_workers": 2}},
        {"scaling": {"num_workers": 1, "use_gpu": True}},
        {"scheduler": {"kind": "pbt"}},
    ):
        config = sweep_config(space, **others)
        assert not trains_in_trial(config, prepared), others
        assert trial_resources(config, trains_in_trial(config, prepared)) == {"CPU": 0, "memory": 1}
    for train in ({"in_memory": "never"}, {"loop": "pkg.loops:fit"}):
        assert not trains_in_trial(load_config({"sweep": {"space": space}, "train": train}), prepared), train


@pytest.mark.parametrize(
    ("every_s", "at_epochs", "tops"),
    [(0.0, (), [1, 2, 3, 4, 5]), (3600.0, (), [5]), (3600.0, (2, 4), [2, 4, 5])],
)
def test_a_trials_epochs_go_to_tune_at_once_or_together_and_each_reaches_the_sweep(
    ray_cluster, tmp_path, every_s, at_epochs, tops
):
    """Each report is a round trip to the sweep's driver that the trial waits for: with
    ``every_s`` 0 every epoch goes at once; else the epochs of a second go as one report,
    an epoch of ``at_epochs`` (ASHA's rungs) at once with those before it, and the sweep
    still sees every epoch, in order, each with its checkpoint."""
    from ray import tune

    from trainflow.pipelines.training.trial_reports import CHECKPOINT_PATH, TuneReports, epoch_rows

    def trial(config):
        reports = TuneReports(every_s=config["every_s"], at_epochs=config["at_epochs"])
        for epoch in range(1, 6):
            reports.add({"epoch": epoch, "val_loss": 1 / epoch}, tmp_path / f"checkpoint_{epoch}")
        reports.flush()

    results = []

    class Seen(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            results.append(result)

    run = tune.RunConfig(storage_path=str(tmp_path / "tune"), callbacks=[Seen()], verbose=0)
    space = {"every_s": every_s, "at_epochs": list(at_epochs)}
    grid = tune.Tuner(trial, param_space=space, run_config=run).fit()
    assert grid.errors == []
    assert [result["epoch"] for result in results] == tops  # each report's latest epoch at its top
    rows = [row for result in results for row in epoch_rows(result)]
    assert [row["epoch"] for row in rows] == [1, 2, 3, 4, 5]
    assert [row[CHECKPOINT_PATH] for row in rows] == [str(tmp_path / f"checkpoint_{e}") for e in range(1, 6)]


@pytest.mark.parametrize(
    ("scheduler", "rungs"),
    [
        ({"grace_period": 2, "reduction_factor": 2}, {2, 4, 8, 12}),
        ({"grace_period": 1, "reduction_factor": 3}, {1, 3, 9, 12}),
        ({"grace_period": 2, "reduction_factor": 1.5}, {2, 3, 5, 7, 11, 12}),  # 4.5 and 6.75: 5, 7
        ({"grace_period": 20, "reduction_factor": 2}, {12}),
    ],
)
def test_ashas_rungs_are_its_grace_period_times_its_reduction_factor_up_to_the_last_epoch(scheduler, rungs):
    from trainflow.pipelines.training.search import asha_rungs

    config = load_config(
        {
            "train": {"epochs": 12},
            "sweep": {"space": {"train.lr": {"grid": [0.1]}}, "scheduler": {"kind": "asha", **scheduler}},
        }
    )
    assert asha_rungs(config) == rungs
    fifo = load_config({"sweep": {"space": {"train.lr": {"grid": [0.1]}}, "scheduler": {"kind": "fifo"}}})
    assert asha_rungs(fifo) == frozenset()


def test_asha_stops_the_same_trials_after_the_same_epochs_when_trials_report_between_rungs_together(
    ray_cluster, tmp_path
):
    """A trial that trains in its Tune process sends the epochs between ASHA's rungs as one
    report; ASHA, counting the epoch each report holds, stops the same trials after the same
    epochs as when every epoch is a report of its own."""
    from ray import tune

    from trainflow.pipelines.training.search import asha_rungs, trial_scheduler
    from trainflow.pipelines.training.trial_reports import TuneReports, epoch_rows

    config = load_config(
        {
            "train": {"epochs": 8},
            "sweep": {
                "space": {"train.lr": {"grid": [0.1]}},
                "scheduler": {"kind": "asha", "grace_period": 1, "reduction_factor": 2},
                "metric": "val_loss",
                "mode": "min",
            },
        }
    )

    def trial(params):
        reports = TuneReports(every_s=params["every_s"], at_epochs=params["at_epochs"])
        for epoch in range(1, 9):  # a loss that zigzags: a rung's value differs from its neighbours'
            loss = params["quality"] / epoch + (0.3 if epoch % 2 else 0.0) * params["quality"]
            reports.add({"epoch": epoch, "val_loss": loss}, tmp_path / f"checkpoint_{epoch}")
        reports.flush()

    def last_epochs(together: bool) -> dict[float, int]:
        seen: dict[float, int] = {}

        class Seen(tune.Callback):
            def on_trial_result(self, iteration, trials, trial, result, **info):
                seen[trial.config["quality"]] = epoch_rows(result)[-1]["epoch"]

        space = {
            "quality": tune.grid_search([0.9, 0.2, 0.6, 0.4, 1.0, 0.1, 0.7, 0.3]),
            "every_s": 3600.0 if together else 0.0,
            "at_epochs": sorted(asha_rungs(config)) if together else [],
        }
        tune_config = tune.TuneConfig(
            metric="val_loss",
            mode="min",
            scheduler=trial_scheduler(config, in_trial=together),
            max_concurrent_trials=1,
        )
        run = tune.RunConfig(storage_path=str(tmp_path / f"tune-{together}"), callbacks=[Seen()], verbose=0)
        assert (
            tune.Tuner(trial, param_space=space, tune_config=tune_config, run_config=run).fit().errors == []
        )
        return seen

    one_by_one = last_epochs(together=False)
    assert sorted(set(one_by_one.values())) != [8]  # ASHA stopped some trials early
    assert last_epochs(together=True) == one_by_one
