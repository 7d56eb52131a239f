"""The tutorial, followed as its reader would with a CSV of their own: a churn table with a
text column, yes/no labels and a few blank ones. Its config is the page's `churn.yaml` block
on top of the rest of its `tumours.yaml` block, and its commands are the page's own with
`churn` for `tumours`, as the page says; both are read from the page, so a page that changes
wrongly fails here. The commands run as subprocesses from the reader's folder (so
`.trainflow/` lands there), on the session's Ray cluster and Prefect server; the refusals
the page promises run through the same command line in this process. Serving and the UIs
are what tests/cli/test_models_serve.py, tests/e2e/test_readme.py and tests/cli/test_ui.py run."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.commands import session_services, trainflow_in_process

pytestmark = pytest.mark.slow

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
BIN = Path(sys.executable).parent
BLANK_LABELS = 3
HASH = re.compile(r"(?<=config hash )[0-9a-f]{12}")
NUMBER = re.compile(r"\d+\.\d+")  # a metric or seconds in a summary


def blocks(info: str) -> list[str]:
    """The page's fenced blocks whose info string is ``info`` (``yaml``, ``yaml title="churn.yaml"``,
    ``""``: the outputs), in order: each fence that opens a block, then the one that closes it."""
    found, opened, lines = [], None, []
    for line in PAGE.read_text().splitlines(keepends=True):
        if opened is None and line.startswith("```"):
            opened, lines = line[3:].strip(), []
        elif opened is not None and line.strip() == "```":
            if opened == info:
                found.append("".join(lines))
            opened = None
        elif opened is not None:
            lines.append(line)
    return found


def own(text: str) -> str:
    """The page's words for tumours, as the reader of "With a CSV of your own" reads them."""
    return text.replace("tumours", "churn")


def commands() -> dict[str, list[str]]:
    """The first `trainflow` command of the page for each of validate, run and models list,
    split as a shell does, with the reader's names."""
    lines = [line.strip() for block in blocks("bash") for line in block.splitlines()]
    found: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("trainflow "):
            words = [own(word) for word in shlex.split(line, comments=True)]
            found.setdefault(" ".join(words[1:3] if words[1] == "models" else words[1:2]), words)
    return found


def churn_config() -> str:
    """`churn.yaml` as the reader writes it: the page's churn block, then the sections of its
    tumours.yaml that block leaves as they are ("keep the rest of tumours.yaml")."""
    (mine,) = blocks('yaml title="churn.yaml"')
    (tumours,) = blocks("yaml")
    sections = re.split(r"^(?=\S)", tumours, flags=re.M)
    replaced = set(re.findall(r"^(\w+):", mine, flags=re.M))
    kept = [s for s in sections if s and s.split(":")[0] not in replaced]
    return mine + "".join(kept)


def churn_csv(path: Path) -> None:
    """1,200 customers with the columns of the page's example: numbers, a contract type as
    text, churned yes or no, a few labels left blank. Who churns follows the columns with a
    wide margin, so that two epochs clear the page's min_value."""
    (example,) = blocks("text")
    rng = np.random.default_rng(7)
    n = 2400
    frame = pd.DataFrame(
        {
            "tenure_months": rng.integers(0, 72, n),
            "monthly_charges": rng.uniform(20, 110, n).round(1),
            "support_calls": rng.integers(0, 6, n),
            "contract": rng.choice(["month-to-month", "one-year", "two-year"], n),
        }
    )
    score = 3.0 * (frame.contract == "month-to-month") + frame.support_calls / 2 - frame.tenure_months / 12
    frame = frame[(score - 1.0).abs() > 0.75].head(1200).copy()
    frame["churned"] = np.where(score[frame.index] > 1.0, "yes", "no").astype(object)
    frame.iloc[[5, 50, 150], frame.columns.get_loc("churned")] = None  # blank cells in the CSV
    assert list(frame.columns) == example.splitlines()[0].split(",")
    frame.to_csv(path, index=False)


def run(words: list[str], folder: Path, *extra: str) -> subprocess.CompletedProcess:
    """``words`` as typed in the reader's folder: this environment's console script, no
    TRAINFLOW_HOME (the page's `.trainflow/` in the folder), the session's services."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "PREFECT_API_URL", "MLFLOW_TRACKING_URI", "TRAINFLOW_HOME")
    }
    args = [str(BIN / words[0]), *words[1:], *extra]
    return subprocess.run(
        args, cwd=folder, env={**env, **session_services()}, capture_output=True, text=True, timeout=600
    )


def test_the_tutorial_followed_with_a_csv_of_ones_own(
    ray_cluster, prefect_harness, empty_registry, tmp_path, monkeypatch
):
    folder = tmp_path / "churn"
    folder.mkdir()
    churn_csv(folder / "churn.csv")
    config = churn_config()
    (folder / "churn.yaml").write_text(config)
    # A new registry, its tables made once per session (the same as the first run's own).
    (folder / ".trainflow").mkdir()
    shutil.copyfile(empty_registry, folder / ".trainflow" / "mlflow.db")
    found = commands()
    quoted = [block for block in blocks("") if block.strip()]

    # 2. Validate: the page's ok line; the blank labels named with their count, to be dropped.
    checked = run(found["validate"], folder)
    assert checked.returncode == 0, checked.stderr
    (ok,) = [own(line) for b in quoted for line in b.splitlines() if line.startswith("ok: ")]
    assert HASH.sub("H", checked.stdout.splitlines()[0]) == HASH.sub("H", ok)
    assert re.search(rf"\b{BLANK_LABELS} rows\b.*data\.missing", checked.stdout), checked.stdout

    # What the page says stops a run before it starts, through the same command line.
    monkeypatch.chdir(folder)
    monkeypatch.delenv("TRAINFLOW_HOME", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    refused = {
        "missing labels": ("churn.yaml", ["--set", "data.missing=fail"]),
        "unquoted classes": ("bare.yaml", []),
        "a text column unlisted": ("uncategorised.yaml", []),
    }
    (folder / "bare.yaml").write_text(config.replace("['no', 'yes']", "[no, yes]"))
    (folder / "uncategorised.yaml").write_text(re.sub(r"^  categorical_columns:.*\n", "", config, flags=re.M))
    said = {}
    for mistake, (file, extra) in refused.items():
        out = trainflow_in_process("validate", file, *extra)
        assert out.returncode == 2, (mistake, out.output)
        (said[mistake],) = out.stderr.strip().splitlines()
    assert "'churned'" in said["missing labels"] and f" {BLANK_LABELS} " in said["missing labels"]
    assert "data.missing" in said["missing labels"]
    assert "data.classes" in said["unquoted classes"] and "quote" in said["unquoted classes"]
    assert "contract" in said["a text column unlisted"]
    assert "data.categorical_columns" in said["a text column unlisted"]
    stopped = run(found["run"], folder, "--set", "data.missing=fail")
    assert stopped.returncode == 2 and stopped.stderr.strip() == said["missing labels"], stopped.stderr
    assert not list((folder / ".trainflow" / "runs").glob("*"))

    # 3. Train and register, two epochs for the page's fifteen: a summary of the page's lines.
    trained = run(found["run"], folder, "--set", "train.epochs=2")
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = trained.stdout.strip().splitlines()
    (shown,) = [own(b).splitlines() for b in quoted if b.startswith("model       tumours version 1 ")]
    assert [line[:12] for line in summary] == [line[:12] for line in shown]
    named, gate, test, checkpoint, steps, load_it = zip(summary, shown, strict=True)
    assert named[0] == named[1] == "model       churn version 1 -> champion"
    assert NUMBER.sub("N", gate[0]) == NUMBER.sub("N", gate[1])  # no champion yet; ... clears min_value
    assert NUMBER.sub("N", test[0]) == NUMBER.sub("N", test[1])  # the same metrics
    assert checkpoint[0].startswith(f"checkpoint  {folder.resolve()}/.trainflow/runs/churn-")
    assert NUMBER.sub("N", steps[0]).startswith(NUMBER.sub("N", steps[1]).removesuffix(")"))
    assert load_it[0] == load_it[1]
    assert re.search(rf"\b{BLANK_LABELS} rows\b.*data\.missing", trained.stderr), trained.stderr[-3000:]

    # 5. The registry.
    listed = run(found["models list"], folder)
    assert listed.returncode == 0, listed.stderr
    (header,) = [b.splitlines()[0] for b in quoted if b.startswith("version  aliases")]
    rows = listed.stdout.strip().splitlines()
    assert rows[0].split() == header.split() and len(rows) == 2
    assert rows[1].split()[:2] == ["1", "champion"]

    # 8. From Python: the page's snippet, on the reader's CSV; blank labels never became a class.
    snippet = own(blocks("python")[-1])
    namespace: dict = {}
    exec(snippet, namespace)
    model = namespace["model"]
    assert list(model.classes) == ["no", "yes"]
    predicted = model.predict(pd.read_csv("churn.csv").head(3))
    assert len(predicted) == 3 and set(predicted) <= {"no", "yes"}
