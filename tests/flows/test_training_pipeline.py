"""The real training flow: Prefect test server, a 2-CPU Ray cluster, MLflow on SQLite."""

import asyncio

import numpy as np
import pytest

from trainflow.config import load_config
from trainflow.flows.training import training_pipeline
from trainflow.pipelines.data.prepare import raw_split
from trainflow.pipelines.data.schema import inspect_source
from trainflow.pipelines.data.sources import digits_frame
from trainflow.pipelines.registry import store
from trainflow.pipelines.training.run import TrainingDiverged
from trainflow.testing import small_config
from trainflow.workspace import workspace

pytestmark = pytest.mark.slow


def flow_logs(flow_run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()

    async def read():
        async with get_client() as client:
            return await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))

    return [log.message for log in asyncio.run(read())]


def flow_run_name(flow_run_id) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).name


def read_artifacts() -> list:
    from prefect.client.orchestration import get_client

    async def read():
        async with get_client() as client:
            return await client.read_artifacts()

    return asyncio.run(read())


def artifact_keys() -> set[str]:
    return {a.key for a in read_artifacts() if a.key}


# Both tests train on digits in one TRAINFLOW_HOME (its splits prepared once), each
# registering under a model name of its own.
def test_flow_trains_registers_and_the_champion_predicts_as_reported(
    ray_cluster, prefect_harness, module_trainflow_home
):
    config = load_config(small_config(train={"epochs": 3}))
    state = training_pipeline(config=config, return_state=True)
    assert state.is_completed(), state.message
    first = state.result()

    # A registered version with its metrics, lineage and the gate's decision.
    reg = first.registered
    assert (reg.name, reg.version, reg.champion) == ("digits-test", "1", True)
    assert first.test_metrics["accuracy"] > 0.85
    assert set(first.timings) == {"ingest", "preprocess", "train", "evaluate", "register"}
    c = store.client(workspace())
    run = c.get_run(reg.run_id)
    assert run.data.metrics["test_accuracy"] == pytest.approx(first.test_metrics["accuracy"])
    assert run.data.tags["trainflow.config_hash"] == config.config_hash()
    assert run.data.tags["prefect.flow_run_id"] == str(state.state_details.flow_run_id)
    # MLflow's UI names the flow run as who made the run; the version's page says the gate's decision.
    flow_run = state.state_details.flow_run_id
    assert run.data.tags["mlflow.user"] == f"Prefect flow run {flow_run_name(flow_run)}"
    assert run.data.tags["mlflow.source.name"] == f"training-pipeline flow run {flow_run}"
    assert c.get_model_version(reg.name, reg.version).description.startswith("Gate passed: champion.")
    # One report per epoch, and training lowered the loss.
    losses = [m.value for m in sorted(c.get_metric_history(reg.run_id, "train_loss"), key=lambda m: m.step)]
    assert len(losses) == 3 and losses[-1] < losses[0]
    # The plots went with the version's run, and the weighted F1 with the metrics.
    logged = {a.path for a in c.list_artifacts(reg.run_id, "reports")}
    assert logged == {"reports/learning_curve.png", "reports/confusion_matrix.png"}
    assert run.data.metrics["test_weighted_f1"] == pytest.approx(first.test_metrics["weighted_f1"])
    assert reg.aliases == ["champion"]

    # Per-epoch metrics reached the train task's Prefect logs, and the artifacts exist.
    logs = flow_logs(state.state_details.flow_run_id)
    assert any(line.startswith("epoch 3/3  train_loss") for line in logs)
    # Both small splits were read once into the workers' memory, and the log says so.
    assert any("train and val in memory; Ray run" in line for line in logs)
    assert {
        "digits-test-summary",
        "digits-test-gate",
        "digits-test-evaluation",
        "digits-test-per-class",
        "digits-test-model",
    } <= artifact_keys()
    # The train task's progress artifact, moved by each epoch, ends at 100%.
    ours = [a for a in read_artifacts() if a.flow_run_id == flow_run]
    (progress,) = [a for a in ours if a.key == "digits-test-training"]
    assert (progress.type, progress.data) == ("progress", 100.0)
    # The gate's artifact is the whole report: decision, metric tables and both plots.
    gate = next(a.data for a in read_artifacts() if a.key == "digits-test-gate")
    assert gate.startswith("# digits-test v1: promoted to **champion**")
    assert "| accuracy |" in gate and "| weighted_f1 |" in gate and "## Per class" in gate
    assert gate.count("](data:image/png;base64,iVBORw0KGgo") == 2

    # The champion, loaded through the public API, predicts the raw test rows with
    # the accuracy the flow reported.
    import trainflow

    test = raw_test_rows(config)
    model = trainflow.load_model("digits-test@champion")
    accuracy = np.mean(model.predict(test) == test["label"].to_numpy())
    assert accuracy == pytest.approx(first.test_metrics["accuracy"])

    # A second run on new data (a different test split): the gate scores the champion
    # again on the new test rows, with its own preprocessing, before comparing. (A second
    # run on the same data, compared on the same test rows, is in test_data_caching.py.)
    champion_before = trainflow.load_model("digits-test@champion")
    newer = load_config(small_config(train={"epochs": 3}, data={"limit": 1500}))
    second = training_pipeline(config=newer).registered
    d = second.decision
    assert second.version == "2" and d["same_test_data"] is False and d["champion_reevaluated"] is True
    new_test = raw_test_rows(newer)
    expected = np.mean(champion_before.predict(new_test) == new_test["label"].to_numpy())
    assert d["champion"] == pytest.approx(expected)
    assert "re-evaluated on this test data" in d["reason"]


def raw_test_rows(config):
    """The digits test split's raw rows, as the run's preparing placed them."""
    kept = config.data.limit or len(digits_frame())
    return raw_split(inspect_source(config.data), config.data.split, "test", kept_rows=kept).to_pandas()


def task_runs(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )

    return asyncio.run(read())


def test_a_diverging_loss_stops_the_run_with_a_clear_error_and_no_retry(
    ray_cluster, prefect_harness, module_trainflow_home
):
    config = load_config(
        small_config(name="digits-diverges", train={"epochs": 3, "lr": 1e6, "optimizer": "sgd"})
    )
    state = training_pipeline(config=config, return_state=True)
    assert state.is_failed()
    with pytest.raises(
        TrainingDiverged, match=r"train loss became nan in epoch 1; lower train.lr \(now 1000000.0\)"
    ):
        state.result()
    train_runs = [t for t in task_runs(state.state_details.flow_run_id) if t.name.startswith("train")]
    assert [t.run_count for t in train_runs] == [1]  # the task's retry was not spent on it
    assert not [t for t in task_runs(state.state_details.flow_run_id) if t.name.startswith("register")]
