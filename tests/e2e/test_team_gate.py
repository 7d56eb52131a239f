"""The gate on a team: three runs on homes of their own (their own TRAINFLOW_HOME and
PREFECT_HOME, no Prefect server between them) that share only an MLflow server on
PostgreSQL register and gate versions of one model at the same instant, round after
round. Every round the champion is the best version that passed, and every version
that took the champion compared itself against the champion its move replaced."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.team import mlflow_server, postgres, with_postgres_driver
from tests.e2e.test_ui_cli import ui_python  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RUNS = 3
ROUNDS = 20

# One run's side: a checkpoint of its own, then, for each accuracy read from stdin, a
# version registered and gated through the registry step's own function.
RUN = """\
import json, sys
from tests.pipelines.test_registry import make_checkpoint, register
from trainflow.workspace import workspace

ws = workspace()
folder = make_checkpoint(ws.home / "checkpoint")
print("READY", flush=True)
for line in sys.stdin:
    r = register(ws, folder, float(line), name="team")
    print(json.dumps({"version": r.version, "passed": r.decision.passed,
                      "against": r.decision.champion_version}), flush=True)
"""


@pytest.fixture(scope="module")
def team_registry(ui_python, tmp_path_factory):  # noqa: F811
    """An MLflow server on PostgreSQL, its artifacts in a folder of its own."""
    python = with_postgres_driver(ui_python)
    with postgres() as db, mlflow_server(python, db, tmp_path_factory.mktemp("mlflow")) as url:
        yield url


def test_runs_that_share_only_the_registry_gate_one_at_a_time(team_registry, tmp_path):
    from mlflow import MlflowClient

    runs = []
    for i in range(RUNS):
        home = tmp_path / f"run{i}"
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
        env.update(
            MLFLOW_TRACKING_URI=team_registry,
            TRAINFLOW_HOME=str(home / "trainflow"),
            PREFECT_HOME=str(home / "prefect"),
        )
        runs.append(
            subprocess.Popen(
                [sys.executable, "-c", RUN],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    try:
        for run in runs:
            assert run.stdout.readline().strip() == "READY", run.stderr.read()
        c = MlflowClient(tracking_uri=team_registry, registry_uri=team_registry)
        rng = random.Random(0)
        accuracy: dict[str, float] = {}
        decisions: dict[str, dict] = {}
        for round_ in range(ROUNDS):
            # Each round's versions all beat every earlier one, in an order of chance: all
            # of them pass against the champion the round starts with, and only one at a
            # time deciding leaves the best as champion.
            sent = rng.sample([0.5 + 0.02 * round_ + 0.005 * i for i in range(RUNS)], RUNS)
            for run, acc in zip(runs, sent, strict=True):  # every run starts its round at once
                run.stdin.write(f"{acc}\n")
                run.stdin.flush()
            for run, acc in zip(runs, sent, strict=True):
                line = run.stdout.readline()
                assert line, run.stderr.read()[-3000:]
                answer = json.loads(line)
                accuracy[answer["version"]] = acc
                decisions[answer["version"]] = answer
            best = max(accuracy, key=accuracy.get)
            champion = str(c.get_model_version_by_alias("team", "champion").version)
            assert champion == best, f"round {round_ + 1}: champion v{champion}, best v{best}: {accuracy}"
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
