"""trainflow's steps in a flow of a user's own: examples/custom_flow runs as a user runs it
(a process of its own, where nothing opened Ray), and a step handed something it cannot
use fails in one line, naming it, before anything trains."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect import flow

from tests.commands import session_services
from tests.flows.test_training_pipeline import flow_logs
from trainflow.config import load_config
from trainflow.pipelines.registry import versions
from trainflow.tasks import evaluate, ingest, preprocess, register, train
from trainflow.tasks.results import Evaluated, Trained
from trainflow.testing import small_config
from trainflow.workspace import workspace

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_the_custom_flow_example_trains_evaluates_and_registers(ray_cluster, prefect_harness, tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env.update(session_services(), TRAINFLOW_HOME=str(home))
    overrides = ["train.epochs=1", "model.kind=mlp", "model.hidden_sizes=[32]", "scaling.num_workers=1"]
    out = subprocess.run(
        [sys.executable, "examples/custom_flow/flow.py", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "registered digits version 1"
    # The user's own tasks ran between trainflow's: the class check before training.
    logs = out.stdout + out.stderr
    assert logs.index("train rows per class") < logs.index("training mlp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINFLOW_HOME", str(home))
        assert versions.load_model("digits/1").version == "1"


def _fails_in_one_line(user_flow) -> str:
    """The flow run's failure message, checked to be one line, with no traceback in its logs."""
    state = user_flow(return_state=True)
    assert state.is_failed(), state
    message = state.message.strip()
    assert "\n" not in message, message
    assert not any("Traceback" in line for line in flow_logs(state.state_details.flow_run_id))
    return message


def test_a_step_handed_another_configs_prepared_data_or_another_steps_result_fails_in_one_line(
    ray_cluster, prefect_harness, module_trainflow_home
):
    mine = load_config(small_config(name="steps-mine"))
    other = load_config(small_config(name="steps-other", preprocess={"scaler": "minmax"}))

    @flow
    def train_on_other_data():
        return train(mine, preprocess(other, ingest(other)))

    message = _fails_in_one_line(train_on_other_data)
    assert (
        "train: prepared was made by a config whose data, preprocess or objective differ from steps-mine's"
        in (message)
    )

    @flow
    def train_on_the_source():
        return train(mine, ingest(mine))

    message = _fails_in_one_line(train_on_the_source)
    assert "train: prepared is a SourceInfo; give it what preprocess returns (Prepared)" in message


def test_evaluate_and_register_refuse_results_of_another_run(
    ray_cluster, prefect_harness, module_trainflow_home
):
    config = load_config(small_config(name="steps-mixed"))
    elsewhere = Trained(
        run_name="steps-mixed-elsewhere", run_path="/nowhere", best_checkpoint="/nowhere/checkpoint",
        best_metrics={"epoch": 1}, history=[], prepared="another-entry",
    )  # fmt: skip

    @flow
    def evaluate_another_runs_training():
        return evaluate(config, preprocess(config, ingest(config)), elsewhere)

    message = _fails_in_one_line(evaluate_another_runs_training)
    assert "evaluate: trained (steps-mixed-elsewhere) was trained on other prepared data" in message

    @flow
    def register_another_checkpoints_scores():
        source = ingest(config)
        prepared = preprocess(config, source)
        trained = elsewhere.model_copy(update={"prepared": prepared.fingerprint})
        scored = Evaluated(checkpoint="/somewhere/else", metrics={"accuracy": 0.9})
        return register(config, source, prepared, trained, scored)

    message = _fails_in_one_line(register_another_checkpoints_scores)
    assert "register: evaluated scored /somewhere/else, not trained's best checkpoint" in message
    with pytest.raises(versions.RegistryError):  # nothing was registered
        versions.version_summaries(workspace(), "steps-mixed")
