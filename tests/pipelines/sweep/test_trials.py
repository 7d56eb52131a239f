"""What one trial of a sweep reports and holds: its epochs on their way to Ray Tune, at
once or together, and the placement groups of its worker groups, removed by the sweep."""

import uuid

import pytest

from trainflow.pipelines.sweep.trials import (
    CHECKPOINT_PATH,
    PlacementTracker,
    TuneReports,
    epoch_rows,
    record_placement,
)


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


def test_a_sweep_removes_the_placement_groups_its_worker_groups_recorded(ray_cluster):
    import ray
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    tracker = PlacementTracker(f"test-sweep-{uuid.uuid4().hex[:8]}")
    groups = {run: placement_group([{"CPU": 0.01}]) for run in ("trial-a", "trial-b")}
    for run, group in groups.items():
        ray.get(group.ready())
        strategy = PlacementGroupSchedulingStrategy(placement_group=group)
        # What rank 0 of a sweep's worker group does as it starts, inside its group.
        ray.get(
            ray.remote(record_placement)
            .options(num_cpus=0.01, scheduling_strategy=strategy)
            .remote(tracker.name, run)
        )
    assert tracker.groups("trial-a") == [groups["trial-a"].id.hex()]
    assert sorted(tracker.groups()) == sorted(g.id.hex() for g in groups.values())
    tracker.release("trial-a")
    assert placement_group_table(groups["trial-a"])["state"] == "REMOVED"
    assert placement_group_table(groups["trial-b"])["state"] == "CREATED"
    tracker.close()
    assert placement_group_table(groups["trial-b"])["state"] == "REMOVED"
    assert tracker.groups() == []
