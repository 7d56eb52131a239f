"""`trainflow models list | show | promote | rollback` against a real registry on SQLite.

In-process through Click's runner (a subprocess per command costs seconds of imports);
tests/e2e/test_front_door.py runs `models show` as a subprocess.
"""

import json

import pytest
from typer.testing import CliRunner

from tests.pipelines.test_registry import make_checkpoint, register
from trainflow.cli import app
from trainflow.workspace import workspace


@pytest.fixture
def three_versions(trainflow_home, tmp_path):
    ws = workspace()
    for i, accuracy in enumerate([0.8, 0.9, 0.7], start=1):
        register(ws, make_checkpoint(tmp_path / f"c{i}", seed=i), accuracy)
    return trainflow_home


def trainflow(*args, home):
    result = CliRunner().invoke(app, list(args))
    result.returncode = result.exit_code
    return result


def test_list_show_promote_and_rollback(three_versions):
    home = three_versions
    listed = trainflow("models", "list", "toy", home=home)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.strip().splitlines()]
    assert rows[0][:5] == ["version", "aliases", "accuracy", "macro_f1", "gate"]
    assert [r[:5] for r in rows[1:]] == [
        ["1", "-", "0.8000", "0.8000", "passed"],
        ["2", "champion", "0.9000", "0.9000", "passed"],
        ["3", "challenger", "0.7000", "0.7000", "failed"],
    ]

    shown = json.loads(trainflow("models", "show", "toy@challenger", home=home).stdout)
    assert shown["version"] == "3" and shown["gate"]["passed"] is False
    assert shown["gate"]["champion_version"] == "2" and shown["metrics"]["test_accuracy"] == 0.7
    assert json.loads(trainflow("models", "show", "toy/1", home=home).stdout)["aliases"] == []

    out = trainflow("models", "promote", "toy", "3", home=home)
    assert out.returncode == 0 and out.stdout.strip() == "toy: champion -> v3 (was v2)"
    out = trainflow("models", "rollback", "toy", home=home)
    assert out.returncode == 0 and out.stdout.strip() == "toy: champion -> v2 (rolled back from v3)"
    shown = json.loads(trainflow("models", "show", "toy@champion", home=home).stdout)
    assert shown["version"] == "2"
    assert [m["action"] for m in shown["alias_moves"]] == ["gate", "rollback"]


def test_list_without_a_name_lists_every_model_with_its_champion_and_latest_version(three_versions, tmp_path):
    # A model whose only version the gate refused: no champion. The gate's queues, kept in
    # the registry beside each model, are no models of the user's.
    register(workspace(), make_checkpoint(tmp_path / "weak"), 0.3, name="weak")
    listed = trainflow("models", "list", home=three_versions)
    assert listed.returncode == 0, listed.output
    assert [line.split() for line in listed.stdout.strip().splitlines()] == [
        ["model", "champion", "latest", "versions"],
        ["toy", "2", "3", "3"],
        ["weak", "-", "1", "1"],
    ]


def test_list_without_a_name_in_an_empty_registry_says_so(trainflow_home):
    listed = trainflow("models", "list", home=trainflow_home)
    assert listed.returncode == 0, listed.output
    assert listed.stdout == "no registered models yet: `trainflow run` registers one\n"


def test_show_types_the_gate_as_the_serving_endpoint_does(three_versions):
    """`models show` and GET /model read a version's gate decision the same way: MLflow's
    tags are strings, its values are not."""
    from trainflow.pipelines.serving.served import Served

    shown = json.loads(trainflow("models", "show", "toy/3", home=three_versions).stdout)
    gate = shown["gate"]
    assert gate["passed"] is False and gate["same_test_data"] is True
    assert gate["champion_reevaluated"] is False and gate["reason"].startswith("accuracy 0.7000 vs")
    assert gate["candidate"] == 0.7 and gate["champion"] == 0.9 and gate["min_value"] == 0.5
    assert gate["champion_version"] == "2" and gate["metric"] == "accuracy"
    assert Served.load(workspace(), "toy", "3").gate == gate  # what GET /model answers


ERRORS = [
    (["show", "nobody@champion"], "unknown model 'nobody'; registered models: toy"),
    (["show", "toy/9"], "toy has no version 9; its versions: 1, 2, 3"),
    (["show", "toy@staging"], "toy has no alias 'staging'; its aliases: challenger, champion"),
    (["list", "nobody"], "unknown model 'nobody'; registered models: toy"),
    (["promote", "toy", "9"], "toy has no version 9; its versions: 1, 2, 3"),
    (["rollback", "toy"], "toy has no previous champion to roll back to (champion: v1)"),
]


def test_errors_are_one_line_with_exit_code_2(three_versions):
    # v1 then v2 took over through the gate: after one rollback there is no earlier one.
    assert trainflow("models", "rollback", "toy", home=three_versions).returncode == 0
    for args, message in ERRORS:
        out = trainflow("models", *args, home=three_versions)
        assert out.returncode == 2, (args, out.output)
        assert out.stderr.strip().splitlines() == [f"error: {message}"]


def test_the_registry_commands_import_no_torch(three_versions):
    """`trainflow models list | show | promote | rollback` read and move MLflow's records:
    PyTorch's seconds of imports are for the commands that load a model."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from trainflow.cli import app\n"
        "moves = (['promote', 'toy', '1'], ['rollback', 'toy'])\n"
        "for args in (['list'], ['list', 'toy'], ['show', 'toy/2'], *moves):\n"
        "    result = CliRunner().invoke(app, ['models', *args])\n"
        "    assert result.exit_code == 0, (args, result.output)\n"
        "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
