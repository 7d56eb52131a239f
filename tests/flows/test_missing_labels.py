"""A user's own CSV with blank label cells, trained: under data.missing=drop the run
trains on the other rows, its log says how many it dropped, and the registered model's
classes are the labels written, never a blank one."""

from tests.flows.test_training_pipeline import flow_logs
from tests.pipelines.test_missing import churn
from trainflow import load_model
from trainflow.config import load_config
from trainflow.flows.training import training_pipeline


def test_a_run_under_drop_trains_on_the_labelled_rows_and_says_how_many_it_dropped(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    churn(n=300).to_csv(tmp_path / "churn.csv", index=False)
    config = tmp_path / "churn.yaml"
    config.write_text(
        f"name: churn-blanks\n"
        f"data:\n  source: {tmp_path / 'churn.csv'}\n  label_column: churned\n"
        "  categorical_columns: [contract]\n  classes: ['no', 'yes']\n  missing: drop\n"
        "model: {kind: mlp, hidden_sizes: [16]}\n"
        "train: {epochs: 1}\nscaling: {num_workers: 0}\nregistry: {min_value: null}\n"
    )
    state = training_pipeline(config=load_config(config), return_state=True)
    assert state.is_completed(), state.message
    logs = flow_logs(state.state_details.flow_run_id)
    assert "dropped 3 rows with a missing value (data.missing=drop)" in logs
    model = load_model("churn-blanks/1")
    assert model.classes == ["no", "yes"]
    predicted = model.predict(churn(n=20, blank=()).drop(columns=["churned"]))
    assert set(predicted.tolist()) <= {"no", "yes"}
