"""Faults during training: a killed worker and a failed train task both resume from the
last checkpoint, and the run still ends with a registered model."""

import pytest

from tests.faults import marker
from tests.flows.test_training_pipeline import flow_logs, task_runs
from trainflow.config import load_config
from trainflow.flows import training
from trainflow.flows.training import training_pipeline
from trainflow.testing import small_config

pytestmark = pytest.mark.slow


def epochs_logged(logs: list[str], epochs: int) -> list[int]:
    return [e for line in logs for e in range(1, epochs + 1) if line.startswith(f"epoch {e}/{epochs} ")]


# Rank 0, the worker that writes the checkpoints, killed after epoch 2 was collected. The
# same kill of another rank, and what the resumed epochs give, are checked at the Ray level
# in tests/pipelines/test_train.py; here the point is the flow: it still ends registered.
def test_a_worker_killed_mid_run_resumes_and_the_model_registers(
    ray_cluster, prefect_harness, module_trainflow_home
):
    config = load_config(
        small_config(
            name="drill-kill-rank0-at-epoch2",
            train={"epochs": 3, "callbacks": ["tests.faults:kill_rank0_at_epoch2"]},
            failure={"max_failures": 1},
        )
    )
    state = training_pipeline(config=config, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result.registered.version == "1"
    assert marker(result.checkpoint.split("/")[-2]).exists()  # the drill did kill a worker
    logs = flow_logs(state.state_details.flow_run_id)
    assert any(line.startswith("the worker group started 2 times") for line in logs), logs
    resumed = [line for line in logs if line.startswith("resuming from the checkpoint of epoch ")]
    assert resumed == ["resuming from the checkpoint of epoch 2"], logs


def test_a_retried_train_task_resumes_its_ray_run_instead_of_starting_over(
    ray_cluster, prefect_harness, module_trainflow_home, monkeypatch
):
    # No Ray-level retries: the failure after epoch 2 fails the train task, and Prefect's
    # retry of it fits the same Ray run again, for the one epoch left. The task as the
    # flow has it, but without the seconds it waits before retrying (nothing here needs
    # them to pass: the drill fails only once).
    monkeypatch.setattr(training, "train", training.train.with_options(retry_delay_seconds=0))
    config = load_config(
        small_config(
            name="drill-task-retry",
            train={"epochs": 3, "callbacks": ["tests.faults:fail_at_epoch2"]},
            failure={"max_failures": 0},
        )
    )
    state = training_pipeline(config=config, return_state=True)
    assert state.is_completed(), state.message
    flow_run_id = state.state_details.flow_run_id
    train = [t for t in task_runs(flow_run_id) if t.name.startswith("train")]
    assert [t.run_count for t in train] == [2]
    logs = flow_logs(flow_run_id)
    assert "resuming from the checkpoint of epoch 2" in logs
    # Epochs 1 and 2 were trained once, by the first attempt; the retry trained 3.
    assert epochs_logged(logs, 3) == [1, 2, 3]
    assert state.result().registered.version == "1"
