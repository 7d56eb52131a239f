"""Ingest and preprocess as cached Prefect tasks: a second identical run skips them.

The bundled churn config (a CSV with categorical columns) runs twice: first as a flow
call, then through `trainflow run` in this process, whose summary says what it skipped
and whether the gate, comparing both on the same test rows, moved the champion.
"""

import asyncio
import re
import shutil
from pathlib import Path

import pytest

from tests.commands import trainflow_in_process
from tests.flows.test_training_pipeline import flow_logs
from trainflow.config import load_config
from trainflow.flows.training import training_pipeline
from trainflow.pipelines.registry import store
from trainflow.tasks import ingest, preprocess
from trainflow.workspace import workspace

pytestmark = [
    pytest.mark.slow,
    # The last two task calls run outside a flow: Prefect warns their logs have no flow run.
    pytest.mark.filterwarnings("ignore:Logger .prefect.task_runs. attempted to send logs"),
]
REPO = Path(__file__).resolve().parents[2]


def other_flow_run_id(name: str, not_id) -> str:
    """The one flow run called ``name`` other than ``not_id``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName

    async def read():
        async with get_client() as client:
            return await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    name=FlowRunFilterName(any_=[name]), id=FlowRunFilterId(not_any_=[not_id])
                )
            )

    runs = asyncio.run(read())
    assert len(runs) == 1, [r.name for r in runs]
    return runs[0].id


def test_churn_runs_twice_and_the_second_run_skips_ingest_and_preprocess_but_a_changed_file_does_not(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    csv = tmp_path / "churn.csv"
    shutil.copy(REPO / "configs" / "data" / "churn.csv", csv)
    overrides = [
        f"data.source={csv}",
        "train.epochs=1",
        "scaling.num_workers=1",
        "registry.min_value=0.0",
        # Churn's classes are imbalanced (about one in four leaves).
        "train.class_weights=balanced",
        "train.label_smoothing=0.1",
    ]
    config = load_config(REPO / "configs" / "churn.yaml", overrides)
    state = training_pipeline(config=config, return_state=True)
    first = state.result()
    weights = next(line for line in flow_logs(state.state_details.flow_run_id) if line.startswith("loss "))
    stayed, left = (float(w) for w in re.findall(r"(?:stayed|left) ([\d.]+)", weights))
    assert weights.startswith("loss cross_entropy, class weights (balanced): stayed") and left > 1.5 * stayed
    assert first.registered.name == "churn" and first.registered.version == "1"
    assert first.cached == [] and not first.prepared_reused
    first_source = ingest(config)  # outside a flow: the same cache record answers

    # The same config through the command line: its summary says what was skipped.
    out = trainflow_in_process(
        "run", REPO / "configs" / "churn.yaml", *[arg for o in overrides for arg in ("--set", o)]
    )
    assert out.returncode == 0, out.output[-3000:]
    summary = out.stdout[out.stdout.index("model       ") :]
    assert "churn version 2" in summary
    assert "cache       ingest, preprocess skipped: same data and config as an earlier run" in summary
    # The gate compared the two versions on the same test rows: the champion moves only
    # if the second is at least as good (registry.min_improvement 0.0).
    c = store.client(workspace())
    v2 = c.get_model_version("churn", "2")
    improved = c.get_run(v2.run_id).data.metrics["test_accuracy"] >= first.test_metrics["accuracy"]
    assert ("churn version 2 -> champion" in summary) == improved
    assert str(c.get_model_version_by_alias("churn", "champion").version) == ("2" if improved else "1")
    assert v2.aliases == (["champion"] if improved else ["challenger"])
    second_id = other_flow_run_id(f"churn-{config.config_hash()[:8]}", state.state_details.flow_run_id)
    logs = flow_logs(second_id)
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
