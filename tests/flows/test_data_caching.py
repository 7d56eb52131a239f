"""Ingest and preprocess as cached Prefect tasks: a second identical run skips them."""

import shutil
from pathlib import Path

import pytest

from tests.flows.test_training_pipeline import flow_logs
from trainflow.config import load_config
from trainflow.flows.training import training_pipeline
from trainflow.tasks import ingest, preprocess

pytestmark = [
    pytest.mark.slow,
    # The last two task calls run outside a flow: Prefect warns their logs have no flow run.
    pytest.mark.filterwarnings("ignore:Logger .prefect.task_runs. attempted to send logs"),
]
REPO = Path(__file__).resolve().parents[2]


def test_a_second_identical_run_skips_ingest_and_preprocess_and_a_changed_file_does_not(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    csv = tmp_path / "churn.csv"
    shutil.copy(REPO / "configs" / "data" / "churn.csv", csv)
    config = load_config(
        REPO / "configs" / "churn.yaml",
        [f"data.source={csv}", "train.epochs=1", "scaling.num_workers=1", "registry.min_value=0.0"],
    )
    first = training_pipeline(config=config)
    assert first.cached == [] and not first.prepared_reused
    first_source = ingest(config)  # outside a flow: the same cache record answers

    state = training_pipeline(config=config, return_state=True)
    second = state.result()
    assert second.cached == ["ingest", "preprocess"] and second.prepared_reused
    assert second.registered.version == "2"
    # From the flow's own step timings: at most a tenth of the first run's.
    before = first.timings["ingest"] + first.timings["preprocess"]
    after = second.timings["ingest"] + second.timings["preprocess"]
    assert after <= 0.1 * before, (before, after)
    logs = flow_logs(state.state_details.flow_run_id)
    assert "ingest and preprocess: cached from an earlier run with the same data and config" in logs
    assert sum("Finished in state Cached" in line for line in logs) == 2

    # A changed file changes the fingerprint: both steps run again, into a new entry.
    with csv.open("a") as f:
        f.write("12,19.5,3,basic,north,left\n")
    source = ingest(config, return_state=True)
    assert source.name != "Cached" and source.result().fingerprint != first_source.fingerprint
    prepared = preprocess(config, source.result(), return_state=True)
    assert prepared.name != "Cached" and not prepared.result().reused
    assert sum(prepared.result().counts.values()) == 401
