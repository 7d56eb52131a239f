"""The gate on a team: three runs on homes of their own (their own TRAINFLOW_HOME and
PREFECT_HOME, no Prefect server between them) that share only an MLflow server on
PostgreSQL gate versions of one model at the same instant, round after round (the
versions made first, so that the rounds race the gates alone). Every round the champion
is the best version gated so far, and every version that took the champion compared
itself against the champion its move replaced."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.team import mlflow_server, postgres, with_postgres_driver

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RUNS = 3
ROUNDS = 8

# One run's side: its versions made first, each with its run's test accuracy (from the
# command line), then one gated per line read from stdin, through the register step's gate.
RUN = """\
import json, sys
from trainflow.cluster.quiet import apply_quiet_env
from trainflow.config import RegistryConfig
from trainflow.pipelines.registry import store
from trainflow.pipelines.registry.gate import gate_version
from trainflow.workspace import workspace

apply_quiet_env()  # as in every trainflow process: MLflow's run URLs off stdout
ws = workspace()
c = store.client(ws)
experiment = store.experiment_id(c, ws)
try:
    c.create_registered_model("team")
except Exception:
    pass  # another run made it
versions = []
for accuracy in map(float, sys.argv[1:]):
    run = c.create_run(experiment)
    c.log_metric(run.info.run_id, "test_accuracy", accuracy)
    c.set_terminated(run.info.run_id)
    mv = c.create_model_version("team", f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)
    versions.append((str(mv.version), accuracy))
print(json.dumps(dict(versions)), flush=True)
gate = RegistryConfig(min_value=0.5)
for (version, accuracy), _ in zip(versions, sys.stdin):
    d = gate_version(ws, c, "team", version, {"accuracy": accuracy}, None, gate, None)
    print(json.dumps({"version": version, "passed": d.passed, "against": d.champion_version}), flush=True)
"""


@pytest.fixture(scope="module")
def team_registry(tmp_path_factory):
    """An MLflow server on PostgreSQL, its artifacts in a folder of its own."""
    python = with_postgres_driver()
    with postgres() as db, mlflow_server(python, db, tmp_path_factory.mktemp("mlflow")) as url:
        yield url


def test_runs_that_share_only_the_registry_gate_one_at_a_time(team_registry, tmp_path):
    from mlflow import MlflowClient

    rng = random.Random(0)
    # Round r's versions all beat every earlier round's, in an order of chance: each of
    # them passes against the champion the round starts with, and only gates that decide
    # one at a time leave the best as champion.
    rounds = [rng.sample([0.5 + 0.02 * r + 0.005 * i for i in range(RUNS)], RUNS) for r in range(ROUNDS)]
    runs = []
    for i in range(RUNS):
        home = tmp_path / f"run{i}"
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
        env.update(
            MLFLOW_TRACKING_URI=team_registry,
            TRAINFLOW_HOME=str(home / "trainflow"),
            PREFECT_HOME=str(home / "prefect"),
        )
        accuracies = [str(round(r[i], 3)) for r in rounds]
        runs.append(
            subprocess.Popen(
                [sys.executable, "-c", RUN, *accuracies],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    try:
        accuracy: dict[str, float] = {}
        for run in runs:
            line = run.stdout.readline()
            assert line, run.stderr.read()[-3000:]
            accuracy.update(json.loads(line))
        c = MlflowClient(tracking_uri=team_registry, registry_uri=team_registry)
        decisions: dict[str, dict] = {}
        gated: set[str] = set()
        for round_ in range(ROUNDS):
            for run in runs:  # every run gates its round's version at once
                run.stdin.write("go\n")
                run.stdin.flush()
            for run in runs:
                line = run.stdout.readline()
                assert line, run.stderr.read()[-3000:]
                answer = json.loads(line)
                decisions[answer["version"]] = answer
                gated.add(answer["version"])
            best = max(gated, key=accuracy.get)
            champion = str(c.get_model_version_by_alias("team", "champion").version)
            assert champion == best, f"round {round_ + 1}: champion v{champion}, best v{best}"
    finally:
        for run in runs:
            run.stdin.close()
            run.wait(60)
    # Each move of the champion by the gate replaced the champion that version's decision
    # compared against: no decision was made against a champion that had moved meanwhile.
    moves = [
        json.loads(v)
        for k, v in sorted(c.get_registered_model("team").tags.items())
        if k.startswith("trainflow.move.")
    ]
    gated = [m for m in moves if m["alias"] == "champion" and m["action"] == "gate"]
    assert len(gated) == sum(d["passed"] for d in decisions.values()) >= ROUNDS
    for move in gated:
        assert move["previous"] == decisions[move["version"]]["against"], move
    for version, decision in decisions.items():
        tags = c.get_model_version("team", version).tags
        assert tags["gate.champion_version"] == str(decision["against"]), version
