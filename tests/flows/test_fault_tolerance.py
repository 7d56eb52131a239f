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


def test_a_registry_server_down_at_register_keeps_the_training_and_resume_registers_it_untrained(
    ray_cluster, prefect_harness, module_trainflow_home, monkeypatch
):
    # The registry's server answers the run's check, then goes down (nothing answers at its
    # address): the register step fails, naming it, and the trained run is left to register.
    from trainflow.pipelines.training.run_records import records
    from trainflow.workspace import storage_location

    down = server_answering_once()
    monkeypatch.setattr(training, "register", training.register.with_options(retry_delay_seconds=0))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    config = load_config(small_config(name="drill-registry-down", train={"epochs": 2}))
    with monkeypatch.context() as server_down:
        server_down.setenv("MLFLOW_TRACKING_URI", down)
        state = training_pipeline(config=config, return_state=True)
    assert state.is_failed()
    assert state.message.endswith(
        f"RegistryError: registry: the MLflow server at {down} stopped answering ([Errno 111] Connection "
        "refused); the trained checkpoint is kept: once the server is back, the same run with --resume "
        "registers it without training again"
    ), state.message
    (record,) = records(storage_location(config), config.name)
    assert record.status == "completed" and record.to_register

    # The server is back: --resume registers that training's checkpoint without training again.
    state = training_pipeline(config=config, resume=True, return_state=True)
    assert state.is_completed(), state.message
    logs = flow_logs(state.state_details.flow_run_id)
    assert (
        f"{record.describe()} trained to its end (completed): registering it, without training again" in logs
    )
    assert epochs_logged(logs, 2) == []
    assert state.result().registered.version == "1"
    assert state.result().checkpoint == record.trained["best_checkpoint"]
    (record,) = records(storage_location(config), config.name)
    assert record.registered == "1" and not record.to_register


def server_answering_once() -> str:
    """The URL of an HTTP server on loopback that answers one request (the registry check's
    ``/health``) and then stops, its port closed."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)

    def once():
        server.handle_request()
        server.server_close()

    threading.Thread(target=once, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"
