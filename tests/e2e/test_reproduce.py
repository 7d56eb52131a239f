"""`trainflow models reproduce` and the model card, as a user meets them: a project in a git
checkout trains a small digits model from a CSV file, reproduces it (the same weights and
metrics on the CPU, registered as a new version tagged reproduces=1), reads its card, and
is refused once the data or the code has changed.

Real Ray (the session's cluster), Prefect (the session's server) and MLflow; the commands
run in this process through the command-line app, except the refusal that must come before
Ray, which runs as a subprocess pointed at a Ray address where nothing listens.
"""

import json
import os
import socket
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from tests.commands import trainflow_in_process
from tests.flows.test_training_pipeline import read_artifacts
from trainflow.pipelines.data.sources import digits_frame
from trainflow.pipelines.registry import card, lineage, store, versions
from trainflow.testing import small_config
from trainflow.workspace import workspace

NAME = "digits-csv"


def git(repo, *args) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def project(tmp_path_factory, module_trainflow_home):
    """A git checkout holding a CSV of 600 digits and a config that trains on it, as the
    current folder: the lineage's git commit is this checkout's."""
    repo = tmp_path_factory.mktemp("project")
    digits_frame().head(600).to_csv(repo / "digits.csv", index=False)
    config = small_config(name=NAME, data={"source": str(repo / "digits.csv")}, train={"epochs": 2})
    (repo / "config.yaml").write_text(yaml.safe_dump(config))
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "digits")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(repo)
        yield repo


@pytest.fixture(scope="module")
def reproduced(ray_cluster, prefect_harness, project):
    """Version 1 trained from the project's config, then reproduced as version 2."""
    trained = trainflow_in_process("run", "config.yaml")
    assert trained.returncode == 0, trained.output[-3000:]
    out = trainflow_in_process("models", "reproduce", f"{NAME}/1")
    assert out.returncode == 0, out.output[-3000:]
    return out


def test_reproducing_a_cpu_version_gives_its_weights_and_metrics_in_a_version_tagged_reproduces(
    reproduced, project
):
    printed = reproduced.stdout[reproduced.stdout.index("reproduces  ") :].splitlines()
    assert printed[0] == f"reproduces  {NAME} version 1 (tagged reproduces=1)"
    assert printed[1].startswith(f"model       {NAME} version 2 -> ")
    table = [line.split() for line in printed[printed.index("") + 1 :]]
    assert table[0] == ["metric", "v1", "v2", "difference"]
    assert {row[0]: row[3] for row in table[1:]} == {"accuracy": "0", "macro_f1": "0", "weighted_f1": "0"}

    c = store.client(workspace())
    v1, v2 = (c.get_model_version(NAME, v) for v in ("1", "2"))
    assert v2.tags["reproduces"] == "1" and "reproduces" not in v1.tags
    for tag in ("trainflow.config_hash", "trainflow.data_fingerprint", "git.commit"):
        assert v1.tags[tag] == v2.tags[tag], tag
    assert v1.tags["git.commit"] == git(project, "rev-parse", "HEAD")
    # The same weights, byte for byte, and so the same test metrics, to the last digit.
    hashes = [json.loads(v.tags[lineage.HASHES_TAG]) for v in (v1, v2)]
    assert hashes[0]["model.pt"] == hashes[1]["model.pt"]
    metrics = [
        {k: m for k, m in c.get_run(v.run_id).data.metrics.items() if k.startswith("test_")} for v in (v1, v2)
    ]
    assert metrics[0] == metrics[1]
    assert set(metrics[0]) == {"test_accuracy", "test_macro_f1", "test_weighted_f1"}

    compared = next(a.data for a in read_artifacts() if a.key == f"{NAME}-reproduce")
    assert compared.startswith(f"# {NAME} v2 reproduces v1\n\n| metric | v1 | v2 | difference |")
    assert "| accuracy |" in compared and compared.count(" | 0 |") == 3


def test_each_version_has_a_card_in_mlflow_and_in_prefect_with_the_gates_reason(reproduced, project):
    ws = workspace()
    for version in ("1", "2"):
        mv = store.client(ws).get_model_version(NAME, version)
        text = card.read_card(ws, f"{NAME}/{version}")
        assert text.startswith(f"# {NAME} version {version}\n")
        assert f"{mv.tags['gate.reason']}" in text and "Gate on `accuracy` passed: champion." in text
        for expected in [
            "| objective | classification |",
            "| model kind | `mlp` |",
            f"| data source | `{project / 'digits.csv'}` |",
            f"| data fingerprint | `{mv.tags['trainflow.data_fingerprint']}` |",
            f"| config hash | `{mv.tags['trainflow.config_hash']}` |",
            f"| git commit | `{git(project, 'rev-parse', 'HEAD')}` |",
            f"(id `{mv.tags['prefect.flow_run_id']}`) of flow `training-pipeline`",
            "## Drift at training time",
            f'trainflow.load_model("models:/{NAME}/{version}")',
            f"`trainflow models serve {NAME}/{version}`",
        ]:
            assert expected in text, expected
        published = [a.data for a in read_artifacts() if a.key == f"{NAME}-card"]
        assert text in published


def reproduce_as_a_subprocess(project, home, *, ray_address: str):
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env |= {"TRAINFLOW_HOME": str(home), "RAY_ADDRESS": ray_address}
    return subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "models", "reproduce", f"{NAME}/1"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_changed_data_or_code_is_refused_in_one_line_before_ray_and_registers_nothing(
    reproduced, project, module_trainflow_home
):
    fingerprint = store.client(workspace()).get_model_version(NAME, "1").tags["trainflow.data_fingerprint"]
    commit = git(project, "rev-parse", "HEAD")
    csv = project / "digits.csv"
    rows = pd.read_csv(csv)
    rows.loc[0, "pixel_0"] += 1.0  # one pixel of one row
    rows.to_csv(csv, index=False)
    # Ray's address answers nothing: a command that got as far as Ray would say so instead.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    out = reproduce_as_a_subprocess(project, module_trainflow_home, ray_address=dead)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: cannot reproduce {NAME}/1: the data of {csv} has changed (fingerprint {fingerprint} "
        f"when {NAME}/1 was trained, "
    ), lines
    assert lines[0].endswith(" now); --force reproduces it anyway")

    git(project, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "one pixel")
    out = trainflow_in_process("models", "reproduce", f"{NAME}/1")
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line and "the data of" in line
    assert f"; the code's git commit has changed ({commit} when {NAME}/1 was trained, " in line
    assert f"{git(project, 'rev-parse', 'HEAD')} now); --force reproduces it anyway" in line
    assert [v.version for v in versions.version_summaries(workspace(), NAME)] == ["1", "2"]
