"""Drift while serving, for real: a registered model with a profile behind Ray Serve on
loopback (the session's Ray cluster), HTTP requests, the replica's request sample on
disk, and `trainflow models drift` scoring it in-process against the champion."""

import json
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.pipelines.test_registry import make_checkpoint, register
from tests.web import http, start_serve
from trainflow.cli import app
from trainflow.pipelines.data import profile as profiles
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.data.schema import DataError
from trainflow.pipelines.drift.samples import RequestSample, read_samples, samples_folder
from trainflow.workspace import workspace

pytestmark = pytest.mark.slow  # Ray Serve's controller, proxy and replica

TOY = Preprocessor(["a"], "label", ["no", "yes"], scaler="none", categorical={"c": ["x", "y"]})
SAVED_S = 60.0  # the replica writes its sample every few seconds; a busy host is slower


def train_rows(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {"a": rng.normal(0, 1, n), "c": rng.choice(["x", "y"], n), "label": rng.choice(["no", "yes"], n)}
    )


@pytest.fixture(scope="module")
def served(ray_cluster, module_trainflow_home, tmp_path_factory):
    """The URL of toy-drift's champion behind Serve; the checkpoint carries the profile of
    its train rows, as a trained one does."""
    from ray import serve

    from trainflow.pipelines.serving import QUIET_LOGS, ServeSettings

    ws = workspace()
    folder = make_checkpoint(tmp_path_factory.mktemp("served-drift") / "c1", seed=1, pre=TOY)
    profile = profiles.frame_profile(train_rows(2000), ["a"], ["c", "label"]) | {"label": "label"}
    profiles.save(str(folder), profile)
    register(ws, folder, 0.8, name="toy-drift")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_serve(port)
    from trainflow.pipelines.serving import app as serving_app

    application = serving_app("toy-drift", cpus_per_replica=0.2, settings=ServeSettings(poll_interval_s=0.5))
    serve.run(application, name="toy-drift", route_prefix="/toy-drift", logging_config=QUIET_LOGS)
    try:
        yield f"http://127.0.0.1:{port}/toy-drift"
    finally:
        serve.shutdown()


def drift_command(*args):
    return CliRunner().invoke(app, ["models", "drift", *args])


def wait_for_sample(name: str, rows: int) -> pd.DataFrame:
    deadline = time.monotonic() + SAVED_S
    while time.monotonic() < deadline:
        try:
            sample, seen, _ = read_samples(workspace(), name)
            if seen >= rows:
                return sample
        except DataError:  # no file written yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"no sample of {rows} rows under {samples_folder(workspace(), name)}")


def test_before_any_request_the_command_says_there_is_nothing_to_score(served):
    result = drift_command("toy-drift")
    assert result.exit_code == 2
    assert result.output.startswith("error: no served requests of toy-drift under ")
    assert result.output.count("\n") == 1


def test_served_requests_are_sampled_and_scored_against_the_champion(served):
    # Requests unlike the train rows: a shifted, and c always y.
    rng = np.random.default_rng(5)
    for _ in range(6):
        rows = [{"a": float(v), "c": "y"} for v in rng.normal(3.0, 1.0, 50)]
        r = http.post(f"{served}/predict", json={"rows": rows})
        assert r.status_code == 200, r.text
    sample = wait_for_sample("toy-drift", 300)
    assert len(sample) == 300 and set(sample.columns) == {"a", "c"}
    assert set(sample["c"]) == {"y"} and sample["a"].mean() > 2

    result = drift_command("toy-drift", "--check")
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0] == "300 rows sampled from 300 served rows (1 replica file(s))"
    assert lines[1].startswith("2 of 2 features drifted from toy-drift version 1: ")
    assert "a (psi " in lines[1] and "c (psi " in lines[1]
    assert lines[3].split()[:2] == ["feature", "kind"]
    # Without --check the command reports and exits 0.
    assert drift_command("toy-drift").exit_code == 0


def test_a_reservoir_keeps_a_uniform_bounded_sample(tmp_path):
    sample = RequestSample(tmp_path, capacity=200, seed=0)
    for start in range(0, 20_000, 100):
        sample.add({"x": np.arange(start, start + 100, dtype=float), "c": np.array(["k"] * 100)}, 100, "3")
    rows = sample.rows()
    assert sample.seen == 20_000 and len(rows) == 200
    # Uniform over everything seen, not the first or the last rows.
    assert rows["x"].mean() == pytest.approx(10_000, rel=0.15)
    assert (rows["x"] < 10_000).sum() > 60 and (rows["x"] >= 10_000).sum() > 60
    sample.save()
    saved, seen, files = read_samples_from(tmp_path)
    assert (len(saved), seen, files) == (200, 20_000, 1)
    # Images are not sampled.
    sample.add({"image": [b"png"]}, 1, "3")
    assert sample.seen == 20_000


def read_samples_from(folder):
    import pyarrow.parquet as pq

    files = sorted(folder.glob("requests-*.parquet"))
    table = pq.read_table(files[0])
    return table.to_pandas(), int(table.schema.metadata[b"trainflow.seen"]), len(files)


def test_watch_served_emits_only_under_retrain_with_data_no_version_was_trained_on(
    served, prefect_harness, tmp_path
):
    """The watch-served flow, as its deployment runs it, on the served champion: drift under
    the champion's drift.action warn is logged; under retrain it emits the event when the
    data moved on since that config was trained, and says what to do when it did not."""
    from trainflow import run_checks
    from trainflow.config import PipelineConfig
    from trainflow.pipelines.registry.lineage import CONFIG_HASH_TAG, DATA_FINGERPRINT_TAG

    rng = np.random.default_rng(7)
    rows = [{"a": float(v), "c": "y"} for v in rng.normal(3.0, 1.0, 100)]
    assert http.post(f"{served}/predict", json={"rows": rows}).status_code == 200
    wait_for_sample("toy-drift", 100)
    emitted, logs = watched("toy-drift")
    assert emitted is False  # the fixture's champion: drift.action warn
    assert "(drift.action warn)" in logs

    ws = workspace()
    retrain = PipelineConfig.model_validate({"name": "toy-drift", "drift": {"action": "retrain"}})
    now = run_checks.source(retrain).fingerprint
    for version, (accuracy, fingerprint) in enumerate([(0.9, "older-data"), (0.95, now)], start=2):
        folder = make_checkpoint(tmp_path / f"c{version}", seed=version, pre=TOY)
        (Path(folder) / "config.json").write_text(json.dumps(retrain.model_dump(mode="json")))
        profiles.save(
            folder, profiles.frame_profile(train_rows(2000), ["a"], ["c", "label"]) | {"label": "label"}
        )
        tags = {CONFIG_HASH_TAG: retrain.config_hash(), DATA_FINGERPRINT_TAG: fingerprint}
        assert register(ws, folder, accuracy, name="toy-drift", tags=tags).champion
        emitted, logs = watched("toy-drift")
        if fingerprint == now:  # this config was trained on the data as it is: nothing new to learn
            assert emitted is False
            assert f"version {version} was trained on builtin:digits as it is now" in logs
            assert "add the newer data there to retrain" in logs
        else:
            assert emitted is True
            assert "emitted trainflow.model.drifted" in logs


def watched(model: str) -> tuple[bool, str]:
    """What the watch-served flow returned for ``model``, and its run's logs."""
    from tests.flows.test_training_pipeline import flow_logs
    from trainflow.flows.retrain import watch_served

    state = watch_served(model=model, return_state=True)
    return state.result(), "\n".join(flow_logs(state.state_details.flow_run_id))


@pytest.mark.parametrize("uri", [False, True], ids=["shared-folder", "uri"])
def test_samples_go_under_the_models_storage_where_every_machine_reads_them(trainflow_home, tmp_path, uri):
    ws = workspace()
    storage = ("file://" if uri else "") + str(tmp_path / "shared")
    folder = samples_folder(ws, "churn", storage)
    assert folder == f"{storage}/serving/churn"
    for replica in range(2):  # two replicas' files, as two machines write them
        sample = RequestSample(folder, capacity=50, seed=replica)
        sample.path = sample.path.replace(".parquet", f"-{replica}.parquet")
        sample.add({"x": np.arange(80, dtype=float)}, 80, "2")
        sample.save()
    rows, seen, files = read_samples(ws, "churn", storage)
    assert (len(rows), seen, files) == (100, 160, 2)
    assert sorted((tmp_path / "shared" / "serving" / "churn").iterdir())[0].name.startswith("requests-")
    with pytest.raises(DataError, match=f"no served requests of churn under {storage}-none/serving/churn"):
        read_samples(ws, "churn", f"{storage}-none")
