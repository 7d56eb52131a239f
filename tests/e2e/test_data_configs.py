"""The bundled image-folder config end to end through `trainflow run`, and a bad row
stopping `trainflow run` before training, in one line.

Both run the command in this process, on the session's Ray cluster and Prefect server:
what the run does is the point here (tests/cli/test_run_commands.py runs the command as a user
types it). The bundled churn config runs twice in tests/flows/test_data_caching.py."""

import asyncio
import re

import numpy as np
import pytest

from tests.commands import REPO, trainflow_in_process
from tests.flows.test_training_pipeline import flow_logs, task_runs
from trainflow.config import load_config

pytestmark = pytest.mark.slow


def flow_run_named(name: str):
    """The one flow run of the session called ``name``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async def read():
        async with get_client() as client:
            return await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name]))
            )

    runs = asyncio.run(read())
    assert len(runs) == 1, [r.name for r in runs]
    return runs[0]


def summary_of(out) -> str:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout[out.stdout.index("model       ") :]


def test_shapes_image_folder_runs_and_predicts_class_names(
    ray_cluster, prefect_harness, trainflow_home, monkeypatch
):
    from PIL import Image

    from trainflow.pipelines.models.checkpoint import load_checkpoint

    # In this process, from the checkout's root as a user runs it: the run, not the
    # command's start-up, is what this test is about.
    monkeypatch.chdir(REPO)
    # One worker: the images' path (decoding, augmentation in the worker, the class map)
    # is the point; several workers' shards are tests/pipelines/test_train.py's.
    out = trainflow_in_process(
        "run", "configs/shapes.yaml", "--set", "train.epochs=1", "--set", "scaling.num_workers=1"
    )
    summary = summary_of(out)
    assert "shapes version 1" in summary
    # One epoch is too few to ask for accuracy (it measured 0.2 here, chance is 1/3); what
    # a user must be able to trust is that the gate decided on the accuracy it reports
    # (configs/shapes.yaml: registry.min_value 0.6).
    accuracy = float(re.search(r"test        accuracy (\d\.\d+)", summary).group(1))
    assert ("shapes version 1 -> champion" in summary) == (accuracy >= 0.6), summary
    checkpoint = re.search(r"checkpoint  (\S+)", summary).group(1)
    # The class map travels in the checkpoint: raw images in, folder names out.
    model = load_checkpoint(REPO / checkpoint if not checkpoint.startswith("/") else checkpoint)
    assert model.classes == ["checker", "horizontal", "vertical"]
    assert model.preprocessor.image["shape"] == [3, 16, 16]
    images = [
        np.asarray(Image.open(p)) for p in sorted((REPO / "configs/data/shapes/vertical").glob("*.png"))[:4]
    ]
    import pandas as pd

    predicted = model.predict(pd.DataFrame({"image": images}))
    assert set(predicted) <= {"checker", "horizontal", "vertical"} and len(predicted) == 4


def test_a_bad_row_stops_the_run_before_training_with_one_line_naming_it(
    ray_cluster, prefect_harness, trainflow_home, tmp_path, monkeypatch, capfd
):
    import pandas as pd

    bad = pd.read_csv(REPO / "configs" / "data" / "churn.csv")
    bad.loc[[3, 7], "monthly_fee"] = float("inf")
    bad.to_csv(tmp_path / "bad.csv", index=False)
    monkeypatch.chdir(REPO)
    override = f"data.source={tmp_path / 'bad.csv'}"
    capfd.readouterr()
    out = trainflow_in_process("run", "configs/churn.yaml", "--set", override)
    assert out.returncode == 2, out.stderr[-3000:]
    # The console (Prefect's handlers write to the process's stderr) says it once, with
    # no traceback: the task's and the flow's failure records stay off it.
    console = capfd.readouterr().err + out.stdout + out.stderr
    errors = [line for line in console.splitlines() if "monthly_fee" in line]
    assert len(errors) == 1, console[-3000:]
    assert re.fullmatch(
        r"error: data\.source .*bad\.csv: column 'monthly_fee' holds inf in 2 of 400 rows", errors[0]
    )
    assert "Traceback" not in console
    assert not list(trainflow_home.glob("runs/*"))  # no training started
    # Bad data stays bad: the preprocess step's retry was not spent on it.
    config = load_config(REPO / "configs" / "churn.yaml", [override])
    run = flow_run_named(f"churn-{config.config_hash()[:8]}")
    preprocess = [t for t in task_runs(run.id) if t.name.startswith("preprocess")]
    assert [t.run_count for t in preprocess] == [1]
    # What a deployment run shows: the failure in its state and logs, one line each.
    assert run.state.is_failed() and "column 'monthly_fee' holds inf" in run.state.message
    logs = flow_logs(run.id)
    assert any("monthly_fee" in line for line in logs)
    assert not [line for line in logs if "Traceback" in line], logs
