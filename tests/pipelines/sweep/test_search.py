"""What a sweep hands Ray Tune to draw and rank its trials: the search space of each
dimension kind, the search algorithms and schedulers by name, and ASHA's rungs."""

import random
import typing

import numpy as np
import pytest

from trainflow.config import SweepConfig, SweepScheduler, load_config
from trainflow.pipelines.sweep.search import (
    SCHEDULERS,
    SEARCHES,
    asha_rungs,
    search_algorithm,
    search_space,
    trial_scheduler,
)


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


def test_every_search_and_scheduler_a_config_can_name_is_in_its_table():
    named, _ = typing.get_args(SweepConfig.model_fields["search"].annotation)  # Literal[...] | None
    assert set(SEARCHES) == {None, *typing.get_args(named)}
    kinds = typing.get_args(SweepScheduler.model_fields["kind"].annotation)
    assert set(SCHEDULERS) == set(kinds)
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining
    from ray.tune.schedulers.pb2 import PB2

    expected = {"asha": ASHAScheduler, "fifo": FIFOScheduler, "pbt": PopulationBasedTraining, "pb2": PB2}
    space = {"train.lr": {"loguniform": [1e-4, 1e-1]}}
    for kind in kinds:
        config = sweep_config(space, trials=2, scheduler={"kind": kind})
        assert isinstance(trial_scheduler(config), expected[kind]), kind
    for search in SEARCHES:
        algorithm = search_algorithm(sweep_config(space, search=search).sweep, max_concurrent=2)
        assert type(algorithm).__name__ == ("ConcurrencyLimiter" if search else "BasicVariantGenerator")


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

    from trainflow.pipelines.sweep.trials import TuneReports, epoch_rows

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
