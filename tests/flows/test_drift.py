"""Drift before training, through the real training flow: Prefect's test server, the
session's Ray cluster, MLflow on SQLite. One champion is trained on digits written to a
file; a drifted copy of the file then stops a run under drift.action block and trains
under warn, with the table and plot published in Prefect and MLflow."""

import shutil

import pytest
from prefect import flow

from trainflow.config import load_config
from trainflow.config.outputs import RegistryConfig
from trainflow.flows.training import training_pipeline
from trainflow.pipelines.data import profile as profiles
from trainflow.pipelines.data.sources import digits_frame
from trainflow.pipelines.drift.compare import DataDrift
from trainflow.pipelines.registry import registration, store, versions
from trainflow.tasks import drift, ingest, preprocess
from trainflow.testing import small_config
from trainflow.workspace import workspace

from .test_training_pipeline import flow_logs, read_artifacts, task_runs

pytestmark = pytest.mark.slow

# Brighter strokes in the middle of every image, as a new scanner might give.
BRIGHTER = ("pixel_20", "pixel_28", "pixel_36")


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("drift-data")
    frame = digits_frame()
    frame.to_parquet(folder / "digits.parquet")
    drifted = frame.copy()
    for column in BRIGHTER:
        drifted[column] = (drifted[column] + 8).clip(upper=16)
    drifted.to_parquet(folder / "drifted.parquet")
    return folder


def model_card(version: str) -> str:
    """The Prefect artifact of a digits-drift version's model card."""
    cards = [a.data for a in read_artifacts() if a.key == "digits-drift-card"]
    return next(card for card in cards if card.startswith(f"# digits-drift version {version}\n"))


def config_for(data_files, file: str, action: str, name: str = "digits-drift"):
    return load_config(
        small_config(name=name, data={"source": str(data_files / file)}, drift={"action": action})
    )


@pytest.fixture(scope="module")
def champion(ray_cluster, prefect_harness, module_trainflow_home, data_files):
    """The first run: drift has no champion to compare with, says so, and training goes on."""
    state = training_pipeline(config=config_for(data_files, "digits.parquet", "block"), return_state=True)
    assert state.is_completed(), state.message
    logs = flow_logs(state.state_details.flow_run_id)
    assert "drift: digits-drift has no champion to compare with; training goes on" in logs
    card = model_card("1")
    assert "## Drift at training time\n\ndrift: digits-drift has no champion to compare with" in card
    return state.result()


def test_a_registered_model_carries_its_train_splits_profile(champion):
    reg = champion.registered
    assert (reg.version, reg.champion) == ("1", True)
    ws = workspace()
    folder = versions.local_checkpoint(ws, versions.resolve(ws, "digits-drift/1"))
    saved = profiles.load(str(folder))
    assert saved["label"] == "label" and saved["sample_rows"] == 1000
    assert set(saved["numeric"]) == {f"pixel_{i}" for i in range(64)}
    assert sum(saved["categorical"]["label"]["counts"]) == saved["rows"] > 1000
    # The summary lists the drift step among those that ran.
    assert list(champion.timings) == ["ingest", "preprocess", "drift", "train", "evaluate", "register"]


@flow
def measure_drift(config):
    return drift(config, preprocess(config, ingest(config)))


def test_undrifted_data_passes_and_a_champion_without_a_profile_is_named(champion, data_files):
    # The champion's own data: nothing drifted, even under block.
    same = measure_drift(config_for(data_files, "digits.parquet", "block"))
    assert same.reference == "digits-drift version 1" and same.drifted == []
    assert same.summary == "0 of 65 features drifted from digits-drift version 1"

    # A version registered before profiles were saved: drift says so in one line and goes on.
    old = workspace().home / "old-checkpoint"
    shutil.copytree(champion.checkpoint, old)
    (old / profiles.PROFILE).unlink()
    registration.register_checkpoint(
        workspace(),
        name="digits-old",
        checkpoint_dir=str(old),
        params={},
        metrics={"accuracy": 0.9},
        history=[],
        tags={},
        gate=RegistryConfig(min_value=None),
    )
    state = measure_drift(
        config_for(data_files, "digits.parquet", "block", name="digits-old"), return_state=True
    )
    assert state.is_completed() and state.result().reference == ""
    assert (
        "drift: digits-old version 1 was registered without a data profile; nothing to compare with, "
        "training goes on"
    ) in flow_logs(state.state_details.flow_run_id)


def test_drifted_data_under_block_stops_before_training_naming_the_features(champion, data_files):
    state = training_pipeline(config=config_for(data_files, "drifted.parquet", "block"), return_state=True)
    assert state.is_failed()
    with pytest.raises(DataDrift) as stopped:
        state.result()
    message = str(stopped.value)
    assert message.startswith("drift.action block: 3 of 65 features drifted from digits-drift version 1: ")
    for column in BRIGHTER:
        assert f"{column} (psi " in message
    assert "\n" not in message and message.endswith("(or raise drift.psi, lower drift.ks_pvalue)")
    ran = {t.name.split("-")[0] for t in task_runs(state.state_details.flow_run_id)}
    assert "drift" in ran and "train" not in ran and "register" not in ran


def test_drifted_data_under_warn_trains_and_publishes_the_table_and_plot(champion, data_files):
    state = training_pipeline(config=config_for(data_files, "drifted.parquet", "warn"), return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result.registered.version == "2"
    logs = flow_logs(state.state_details.flow_run_id)
    warned = [line for line in logs if line.startswith("drift: 3 of 65 features drifted")]
    assert warned and warned[0].endswith("training goes on (drift.action warn)")

    # The Prefect artifact: the table, the drifted features first, and the plot.
    # This run's: the runs of the tests before published theirs under the same key.
    run_id = state.state_details.flow_run_id
    (ours,) = [a for a in read_artifacts() if a.key == "digits-drift-drift" and a.flow_run_id == run_id]
    table = ours.data
    rows = [line for line in table.splitlines() if line.startswith("| pixel_")]
    assert {row.split(" | ")[0][2:] for row in rows[:3]} == set(BRIGHTER)
    assert all("**yes**" in row for row in rows[:3]) and "**yes**" not in rows[3]
    assert table.count("](data:image/png;base64,iVBORw0KGgo") == 1
    # The version's model card says what drift was measured before it was trained.
    card = model_card("2")
    drift_part = card.split("## Drift at training time\n\n")[1].split("\n## ")[0]
    assert drift_part.startswith("3 of 65 features drifted from digits-drift version 1: ")
    assert "| pixel_20 | numeric |" in drift_part

    # MLflow: the report and the plot went with the registered version's run.
    c = store.client(workspace())
    logged = {a.path for a in c.list_artifacts(result.registered.run_id, "reports")}
    assert {"reports/drift.json", "reports/drift.png"} <= logged
