"""The batch prediction flow: a registered digits model over 10,000 rows, on real Ray.

How fast it goes on 100,000 rows and more is the benchmarks' question; here 10,000 rows
in batches of 2,048 are enough to compare every way of running the model."""

import numpy as np
import pandas as pd
import pytest

from trainflow.config import ModelConfig, PipelineConfig, RegistryConfig
from trainflow.flows.batch_predict import batch_predict
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.data.schema import DataError
from trainflow.pipelines.data.sources import digits_frame
from trainflow.pipelines.models.build import build_model, model_spec
from trainflow.pipelines.models.checkpoint import load_checkpoint, save_checkpoint
from trainflow.pipelines.registry import registration, versions
from trainflow.workspace import workspace

from .test_training_pipeline import task_runs

pytestmark = pytest.mark.slow
PIXELS = [f"pixel_{i}" for i in range(64)]


def digits_checkpoint(folder):
    """A digits-shaped checkpoint (64 features, 10 classes), untrained: what it predicts
    does not matter here, only that every way of running it agrees."""
    import torch

    torch.manual_seed(0)
    frame = digits_frame()
    spec = model_spec(ModelConfig(kind="mlp", hidden_sizes=[32]), 64, 10)
    pre = Preprocessor(
        PIXELS,
        "label",
        list(range(10)),
        frame[PIXELS].mean().tolist(),
        (frame[PIXELS].std(ddof=0).replace(0, 1.0)).tolist(),
    )
    return save_checkpoint(
        folder,
        model=build_model(spec),
        spec=spec,
        preprocessor=pre.to_dict(),
        config=PipelineConfig().model_dump(mode="json"),
        metrics={"epoch": 1},
    )


def register_digits_model(tmp_path) -> None:
    register(digits_checkpoint(tmp_path / "ckpt"), "digits-batch")


def register(folder, name: str) -> None:
    registration.register_checkpoint(
        workspace(),
        name=name,
        checkpoint_dir=str(folder),
        params={},
        metrics={"accuracy": 0.5},
        history=[],
        tags={},
        gate=RegistryConfig(min_value=0.0),
    )


def digits_rows(n: int, seed: int = 0) -> pd.DataFrame:
    """n rows shaped like digits: the real images tiled, with a little noise."""
    frame = digits_frame()
    reps = -(-n // len(frame))
    rng = np.random.default_rng(seed)
    pixels = np.tile(frame[PIXELS].to_numpy(), (reps, 1))[:n]
    pixels = (pixels + rng.normal(0, 0.5, pixels.shape)).astype(np.float32)
    out = pd.DataFrame(pixels, columns=PIXELS)
    out.insert(0, "id", np.arange(n, dtype=np.int64))
    return out


ROWS = 10_000


def test_batch_prediction_of_10k_rows_equals_load_model(
    ray_cluster, prefect_harness, trainflow_home, tmp_path, capfd
):
    register_digits_model(tmp_path)
    rows = digits_rows(ROWS)
    rows.to_parquet(tmp_path / "input.parquet", index=False)

    result = batch_predict(
        model="digits-batch@champion",
        input=str(tmp_path / "input.parquet"),
        output=str(tmp_path / "predictions"),
        batch_size=2048,
    )
    assert result.rows == ROWS and result.version == "1"

    out = pd.read_parquet(tmp_path / "predictions").sort_values("id").reset_index(drop=True)
    proba = [f"proba_{c}" for c in range(10)]
    assert list(out.columns) == ["id", "prediction", *proba, "model_version"]
    assert (out["id"].to_numpy() == np.arange(ROWS)).all()
    assert set(out["model_version"]) == {"1"}
    np.testing.assert_allclose(out[proba].sum(axis=1), 1.0, rtol=1e-5)
    assert not list(tmp_path.glob(".tmp-*"))  # the temporary folder was renamed into place
    # Nothing on the console but Prefect's lines: no native ERROR line of Ray's core about
    # the pool actors' restarts (they do not restart: evaluate._on_actor_pool).
    console = "".join(capfd.readouterr())
    assert "core_worker" not in console and "max_restarts" not in console, console[-3000:]

    import trainflow

    model = trainflow.load_model("digits-batch/1")
    sample = rows.sample(500, random_state=1).sort_values("id")
    got = out.set_index("id").loc[sample["id"]]
    np.testing.assert_array_equal(got["prediction"].to_numpy(), model.predict(sample))
    np.testing.assert_allclose(got[proba].to_numpy(), model.predict_proba(sample), rtol=1e-4, atol=1e-6)


def test_an_input_missing_a_feature_fails_naming_it_before_ray_work(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    register_digits_model(tmp_path)
    digits_rows(50).drop(columns=["pixel_5"]).to_csv(tmp_path / "input.csv", index=False)
    state = batch_predict(
        model="digits-batch/1",
        input=str(tmp_path / "input.csv"),
        output=str(tmp_path / "predictions"),
        return_state=True,
    )
    assert state.is_failed()
    with pytest.raises(
        DataError, match=r"input .*input.csv lacks the feature column 'pixel_5' that the model"
    ):
        state.result()
    assert not (tmp_path / "predictions").exists()


def test_an_existing_output_and_an_unknown_model_are_refused(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    register_digits_model(tmp_path)
    digits_rows(10).to_parquet(tmp_path / "input.parquet", index=False)
    (tmp_path / "predictions").mkdir()
    state = batch_predict(
        model="digits-batch@champion",
        input=str(tmp_path / "input.parquet"),
        output=str(tmp_path / "predictions"),
        return_state=True,
    )
    with pytest.raises(DataError, match="predictions already exists"):
        state.result()
    state = batch_predict(
        model="digits-batch@staging", input=str(tmp_path / "input.parquet"), output="x", return_state=True
    )
    with pytest.raises(versions.RegistryError, match="digits-batch has no alias 'staging'"):
        state.result()
    # An unknown alias stays unknown: the resolve step's retries are not spent on it.
    resolved = [t for t in task_runs(state.state_details.flow_run_id) if t.name.startswith("resolve-model")]
    assert [t.run_count for t in resolved] == [1]


def test_asking_for_a_gpu_the_cluster_lacks_fails_instead_of_waiting(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    import ray

    from trainflow.cluster.checks import PreflightError

    if ray.cluster_resources().get("GPU"):
        pytest.skip("this machine has a GPU")
    register_digits_model(tmp_path)
    digits_rows(10).to_parquet(tmp_path / "input.parquet", index=False)
    state = batch_predict(
        model="digits-batch/1",
        input=str(tmp_path / "input.parquet"),
        output=str(tmp_path / "out"),
        use_gpu=True,
        return_state=True,
    )
    asks = r"use_gpu \(--gpu\) asks for 1 GPU per actor, the Ray cluster has 0"
    with pytest.raises(PreflightError, match=asks):
        state.result()
    assert not (tmp_path / "out").exists()


def test_a_categorical_input_column_is_required_and_never_copied_to_the_output(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    import torch

    torch.manual_seed(0)
    pre = Preprocessor(["x"], "label", ["no", "yes"], [1.0], [2.0], categorical={"plan": ["basic", "pro"]})
    spec = model_spec(ModelConfig(kind="mlp", hidden_sizes=[4]), pre.num_features, 2)
    folder = save_checkpoint(
        tmp_path / "ckpt",
        model=build_model(spec),
        spec=spec,
        preprocessor=pre.to_dict(),
        config=PipelineConfig().model_dump(mode="json"),
        metrics={"epoch": 1},
    )
    register(folder, "plans")
    rows = pd.DataFrame({"id": [1, 2, 3], "x": [0.5, 1.5, 3.0], "plan": ["pro", "basic", "gold"]})
    rows.drop(columns=["plan"]).to_parquet(tmp_path / "no-plan.parquet", index=False)
    state = batch_predict(
        model="plans/1",
        input=str(tmp_path / "no-plan.parquet"),
        output=str(tmp_path / "a"),
        return_state=True,
    )
    with pytest.raises(DataError, match=r"no-plan.parquet lacks the feature column 'plan' that the model"):
        state.result()
    assert not (tmp_path / "a").exists()

    rows.to_parquet(tmp_path / "input.parquet", index=False)
    batch_predict(model="plans/1", input=str(tmp_path / "input.parquet"), output=str(tmp_path / "b"))
    out = pd.read_parquet(tmp_path / "b").sort_values("id")
    assert list(out.columns) == ["id", "prediction", "proba_no", "proba_yes", "model_version"]
    model = load_checkpoint(folder)
    assert out["prediction"].tolist() == model.predict(rows).tolist()
