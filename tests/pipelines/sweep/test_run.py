"""A sweep's own logic without running trials: the best trial it picks, and where its
trials train (tests/flows/test_sweep.py and tests/flows/test_regression.py run real
sweeps, of grid dimensions)."""

import pytest

from trainflow.config import load_config
from trainflow.pipelines.sweep.run import TrialSummary, best_trial, trains_in_trial, trial_resources
from trainflow.pipelines.sweep.trials import SweepFailed
from trainflow.pipelines.training.settings import PreparedSplits


def sweep_config(space: dict, **section):
    return load_config({"sweep": {"space": space, **section}})


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
