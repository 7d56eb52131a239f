"""The sweep flow for real: Ray Tune trials on the session's cluster, two at a time, ASHA,
the Prefect test server and an MLflow registry on SQLite."""

import json
import os
from pathlib import Path

import pytest

from trainflow.config import load_config
from trainflow.flows.sweep import sweep_pipeline
from trainflow.pipelines.registry import store
from trainflow.testing import small_config
from trainflow.workspace import workspace

from .test_training_pipeline import read_artifacts

pytestmark = pytest.mark.slow


def test_sweep_stops_weak_trials_reports_a_failed_one_and_registers_the_best(
    ray_cluster, prefect_harness, trainflow_home, capfd
):
    # Four trials, two at a time: lr 1e6 diverges (a failed trial), lr 0.001 trails the
    # first two at ASHA's first rung and is stopped there. Two at a time is set, not left
    # to the machine: the session's cluster has as many CPUs as the machine (at least 2,
    # which fit two one-worker trials beside Ray Data's CPU), and ASHA's decision above
    # depends on which trials have reached the rung together.
    config = load_config(
        small_config(
            data={"limit": 600},
            train={"epochs": 3, "optimizer": "sgd"},
            sweep={
                "space": {"train.lr": {"grid": [0.05, 0.01, 0.001, 1e6]}},
                "trials": 1,
                "max_concurrent": 2,
                "scheduler": {"kind": "asha", "grace_period": 1, "reduction_factor": 2},
            },
        )
    )
    state = sweep_pipeline(config=config, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()

    trials = {t["params"]["train.lr"]: t for t in result.trials}
    assert sorted(trials) == [0.001, 0.01, 0.05, 1e6]
    assert len({t["trial_id"] for t in result.trials}) == 4
    assert result.max_concurrent == 2  # the cap in force, whatever the machine's CPUs
    assert trials[1e6]["status"] == "failed" and trials[1e6]["epochs"] == 0
    assert "train loss became nan in epoch 1" in trials[1e6]["error"]
    assert trials[0.001]["status"] == "stopped early" and trials[0.001]["epochs"] == 1
    assert trials[0.05]["status"] == "completed" and trials[0.05]["epochs"] == 3
    assert result.best_trial == trials[0.05]["trial_id"]

    # Each trial trained in its Tune trial's process, which the next trial took over (Ray
    # Train started no controller nor workers): the three trials that reported did so from
    # two processes, Tune's result rows say, and kept their checkpoints in their own runs.
    experiment = Path(result.best_config_path).parent
    rows = [json.loads(line) for path in experiment.glob("run_trial_*/result.json") for line in path.open()]
    assert len({row["trial_id"] for row in rows}) == 3 and len({row["pid"] for row in rows}) == 2, rows
    # Tune's result.json and progress.csv per trial, no TensorBoard files; its defaults back after.
    assert len(list(experiment.glob("run_trial_*/progress.csv"))) == 3  # the failed one reported nothing
    assert not list(experiment.glob("run_trial_*/events.out.tfevents*"))
    assert "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS" not in os.environ
    best_checkpoint = Path(trials[0.05]["best_checkpoint"])
    assert best_checkpoint.name == "checkpoint_epoch_000003"
    assert best_checkpoint.parent.name.startswith("trial-")

    # The best trial's config, as YAML that `trainflow run` takes: its lr, one worker.
    best = load_config(result.best_config_path)
    assert best.train.lr == 0.05 and best.sweep is None and best.scaling.num_workers == 1

    # Registered with that config; its checkpoint is the best trial's best epoch.
    reg = result.registered
    assert (reg.name, reg.version, reg.champion) == ("digits-test", "1", True)
    run = store.client(workspace()).get_run(reg.run_id)
    assert run.data.tags["trainflow.config_hash"] == best.config_hash()
    assert run.data.params["train.lr"] == "0.05"
    assert result.test_metrics["accuracy"] > 0.8

    # The trial table and the sweep's report were published.
    artifacts = {a.key: a for a in read_artifacts() if a.key}
    table = artifacts["digits-test-sweep-trials"].data
    assert table.count('"status"') == 4 and "stopped early" in table and "failed" in table
    assert "## The best config" in artifacts["digits-test-sweep"].data

    # The console holds trainflow's lines: none of Tune's own output (its experiment box,
    # results folder and TensorBoard command), and no warning with a traceback from the
    # controller of the trial that ASHA stopped, whose workers trainflow removed.
    console = "".join(capfd.readouterr())
    for noise in ("Configuration for experiment", "View detailed results", "tensorboard", "Traceback"):
        assert noise not in console, console[-3000:]


def test_an_optuna_sweep_runs_the_trials_optunas_sampler_suggests_and_registers_the_best(
    ray_cluster, prefect_harness, trainflow_home, capfd
):
    import optuna

    space = {"train.lr": {"loguniform": [0.001, 0.3]}}
    config = load_config(
        small_config(
            data={"limit": 400},
            sweep={"space": space, "search": "optuna", "trials": 2, "seed": 3, "scheduler": {"kind": "fifo"}},
        )
    )
    state = sweep_pipeline(config=config, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert [t["status"] for t in result.trials] == ["completed", "completed"]

    # What Optuna's TPE sampler, seeded as the sweep is, suggests for the same space first.
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=3), direction="maximize")
    lr = optuna.distributions.FloatDistribution(0.001, 0.3, log=True)
    suggested = [study.ask({"params/train.lr": lr}).params["params/train.lr"] for _ in range(2)]
    tried = sorted(t["params"]["train.lr"] for t in result.trials)
    assert tried == pytest.approx(sorted(suggested))
    assert result.registered.version == "1"
    # Optuna's own INFO lines (the study it created, each trial it finished) stay off the console.
    console = "".join(capfd.readouterr())
    for noise in ("A new study created", "Trial 0 finished", "Traceback"):
        assert noise not in console, console[-3000:]


def test_pb2_takes_the_spaces_bounds_and_pbt_its_dimensions_as_mutations():
    from ray.tune.schedulers import PopulationBasedTraining
    from ray.tune.schedulers.pb2 import PB2

    from trainflow.pipelines.sweep.search import trial_scheduler

    space = {"train.lr": {"loguniform": [1e-3, 0.3]}, "train.batch_size": {"randint": [16, 64]}}
    sweep = {"space": space, "trials": 4, "scheduler": {"kind": "pb2", "perturbation_interval": 3}}
    pb2 = trial_scheduler(load_config(small_config(train={"epochs": 6}, sweep=sweep)))
    assert isinstance(pb2, PB2)
    sweep["scheduler"]["kind"] = "pbt"
    pbt = trial_scheduler(load_config(small_config(train={"epochs": 6}, sweep=sweep)))
    assert type(pbt) is PopulationBasedTraining
