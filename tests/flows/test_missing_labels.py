"""A user's own CSV with blank label cells, trained as `trainflow run` trains it: under
data.missing=drop the run trains on the other rows, says how many it dropped, and the
registered model's classes are the labels written, never a blank one."""

from tests.e2e.test_cli import trainflow_in_process
from tests.pipelines.test_missing import churn
from trainflow import load_model


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
    out = trainflow_in_process("run", config)
    assert out.returncode == 0, out.output[-3000:]
    assert "dropped 3 rows with a missing value (data.missing=drop)" in out.output
    model = load_model("churn-blanks/1")
    assert model.classes == ["no", "yes"]
    predicted = model.predict(churn(n=20, blank=()).drop(columns=["churned"]))
    assert set(predicted.tolist()) <= {"no", "yes"}
