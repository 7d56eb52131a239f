"""`trainflow` as a user runs it: a subprocess, its exit code and what it prints."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINFLOW = [sys.executable, "-m", "trainflow.cli"]


def trainflow(
    *args, home: Path, timeout=600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`trainflow ARGS` as a subprocess, as a user types it: its own imports, Prefect's
    temporary server and Ray cluster, each a few seconds of start-up. ``env``: more
    environment variables (:func:`session_services` to use the session's instead)."""
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "PREFECT_API_URL", "MLFLOW_TRACKING_URI")
    }
    env = {**inherited, **(env or {}), "TRAINFLOW_HOME": str(home)}
    return subprocess.run(
        [*TRAINFLOW, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def session_services(ray_address: bool = True, prefect_api: bool = True) -> dict[str, str]:
    """The environment by which a subprocess finds the session's Ray cluster and Prefect
    server (the ``ray_cluster`` and ``prefect_harness`` fixtures, which the test must ask
    for) instead of starting its own: for subprocess tests about something else than how
    a run starts them (tests/e2e/test_front_door.py's first run starts both itself)."""
    env = {}
    if ray_address:
        import ray

        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        if "RAY_AUTH_MODE" in os.environ:  # the session cluster's token auth, for its clients
            env["RAY_AUTH_MODE"] = os.environ["RAY_AUTH_MODE"]
    if prefect_api:
        from prefect.settings import PREFECT_API_URL

        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    return env


def trainflow_in_process(*args):
    """`trainflow ARGS` through the same command-line app, in this process: the session's
    Ray cluster and Prefect server (the ``ray_cluster`` and ``prefect_harness`` fixtures)
    serve it, and TRAINFLOW_HOME comes from the environment (``trainflow_home``). For
    tests about what a run does rather than how the command starts."""
    from typer.testing import CliRunner

    from trainflow.cli import app

    result = CliRunner().invoke(app, [str(arg) for arg in args])
    result.returncode = result.exit_code
    return result


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "train.learning_rate=0.1"], r"train.learning_rate: unknown key"),
        (["--set", "train.epochs=ten"], r"train.epochs: Input should be a valid integer"),
        (["--set", "data.label_column=target"], r"data.label_column 'target' is not a column"),
        (["--set", "data.source=/no/such/data.csv"], r"data.source /no/such/data.csv: no such file"),
        (["configs/missing.yaml"], r"config file configs/missing.yaml: no such file"),
    ],
)
def test_bad_input_fails_in_one_line_before_ray_and_registers_nothing(tmp_path, args, message):
    import re

    out = trainflow("run", *args, home=tmp_path / "home")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert re.search(message, lines[0])
    # Neither Prefect, Ray nor MLflow started: nothing was written.
    assert not (tmp_path / "home" / "mlflow.db").exists()
    assert not list((tmp_path / "home").glob("runs/*"))
    assert "Ray" not in out.stdout + out.stderr


def test_blank_labels_are_named_with_their_count_by_validate_and_stop_a_run_before_ray(tmp_path):
    from tests.pipelines.test_missing import churn

    churn().to_csv(tmp_path / "churn.csv", index=False)
    config = tmp_path / "churn.yaml"
    config.write_text(
        f"data:\n  source: {tmp_path / 'churn.csv'}\n  label_column: churned\n"
        "  categorical_columns: [contract]\n  classes: ['no', 'yes']\nmodel: {kind: mlp}\n"
    )
    said = (
        f"error: data.source {tmp_path / 'churn.csv'}: column 'churned' has 3 missing values "
        "(blank, null or NaN) in 60 rows; set data.missing=drop to drop such rows\n"
    )
    for command in ("validate", "run"):
        out = trainflow(command, config, home=tmp_path / "home")
        assert (out.returncode, out.stderr) == (2, said)
    assert not list((tmp_path / "home").glob("runs/*")) and "Ray" not in out.stdout + out.stderr
    dropped = trainflow("validate", config, "--set", "data.missing=drop", home=tmp_path / "home")
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.splitlines()[1] == "note: 3 rows without a label are dropped (data.missing=drop)"


def test_validate_checks_config_and_source(tmp_path):
    out = trainflow("validate", "configs/digits.yaml", "--set", "train.epochs=2", home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok: digits (config hash ")


def test_schedule_and_deploy_refuse_to_start_without_a_server(tmp_path):
    scheduled = trainflow("schedule", "--interval", "60", home=tmp_path)
    assert scheduled.returncode == 2 and "schedule needs a Prefect server" in scheduled.stderr
    # A missing config is refused before the server is looked for, naming the file (exit
    # code 2 alone is also what a Click usage error gives).
    missing = trainflow("schedule", "configs/nope.yaml", "--interval", "60", home=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "error: config file configs/nope.yaml: no such file"
    deployed = trainflow("deploy", home=tmp_path)
    assert deployed.returncode == 2 and "deploy needs a Prefect server" in deployed.stderr


def test_schedule_takes_exactly_one_schedule_and_deploy_an_existing_file(monkeypatch, tmp_path):
    """In this process (the refusals come before anything is reached or started): schedule
    with neither or both of --cron and --interval, deploy with a deployments file that is
    not there."""
    from typer.testing import CliRunner

    from trainflow.cli import app

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # a server is named, never asked
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    config = str(REPO / "configs" / "digits.yaml")
    for schedule in ([], ["--cron", "0 2 * * *", "--interval", "60"]):
        out = CliRunner().invoke(app, ["schedule", config, *schedule])
        assert out.exit_code == 2, out.output
        assert out.stderr.strip() == "error: give one schedule: --cron '0 2 * * *' or --interval SECONDS"
    # `serve`, the command's former name, still works for a release and says so in one line.
    out = CliRunner().invoke(app, ["serve", config])
    assert out.exit_code == 2, out.output
    assert out.stderr.strip().splitlines() == [
        "trainflow serve is now trainflow schedule; serve goes in the next release",
        "error: give one schedule: --cron '0 2 * * *' or --interval SECONDS",
    ]
    out = CliRunner().invoke(app, ["deploy", "--prefect-file", str(tmp_path / "nope.yaml")])
    assert out.exit_code == 2, out.output
    assert out.stderr.strip() == (
        f"error: {tmp_path}/nope.yaml: no such file; run trainflow deploy from the trainflow checkout"
    )


@pytest.mark.parametrize(
    "args, code, printed",
    [
        (["validate", "configs/digits.yaml"], 0, "ok: digits (config hash"),
        (["run", "--set", "train.epochs=ten"], 2, ""),
    ],
)
def test_a_command_ends_with_its_exit_code_once_every_exit_hook_ran(tmp_path, args, code, printed):
    import re

    # The command ends its process without the interpreter's teardown, after the exit
    # hooks (cli._exit_without_teardown): the timeline's mark, the first hook registered,
    # runs last, and what the command printed before is all there.
    out = trainflow(*args, home=tmp_path / "home", env={"TRAINFLOW_TIMELINE": "1"})
    assert out.returncode == code, out.stderr
    assert re.fullmatch(r"timeline [\d.]+ exit", out.stderr.strip().splitlines()[-1]), out.stderr
    assert printed in out.stdout


def test_the_command_imports_a_configs_own_code_from_the_current_folder(tmp_path):
    """As its README runs it: the console script, from the folder that holds the model's module."""
    import shutil

    folder = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "custom_model", folder)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRAINFLOW_HOME"] = str(tmp_path / "home")
    script = Path(sys.executable).with_name("trainflow")
    out = subprocess.run(
        [script, "validate", "digits-resmlp.yaml"], cwd=folder, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok: digits-resmlp ")


def test_every_commands_summary_in_help_is_one_whole_sentence_an_80_column_terminal_prints_whole():
    """`trainflow --help` and each group's list every command by the first paragraph of its
    help: one line, a sentence ending in a full stop. Rich's list wraps it; Click's plain
    list (TYPER_USE_RICH=0, or typer without rich) cuts it with "..." past the terminal's
    width less the longest command name, so it is held to what fits 80 columns there."""
    import inspect

    from trainflow.cli.main import click_command

    def groups(group, path: str):
        yield path, group
        for name, command in group.commands.items():
            if getattr(command, "commands", None) is not None:
                yield from groups(command, f"{path} {name}")

    found = {}
    for path, group in groups(click_command, "trainflow"):
        # Click's own width at an 80-column terminal: 78.
        ctx = group.make_context(path, [], resilient_parsing=True, terminal_width=78)
        plain = ctx.make_formatter()
        group.format_commands(ctx, plain)
        listed = dict(line.strip().split(maxsplit=1) for line in plain.getvalue().splitlines()[1:])
        for name, command in group.commands.items():
            if command.hidden:
                continue
            first = inspect.cleandoc(command.help or "").split("\n\n")[0]
            found[f"{path} {name}"] = first
            assert "\n" not in first and first.endswith("."), f"{path} {name}: {first!r}"
            assert listed[name] == first, f"{path} {name}: --help lists {listed[name]!r}"
    assert {"trainflow run", "trainflow ui", "trainflow models promote", "trainflow stack up"} <= set(found)


def test_no_help_shows_a_flag_as_taking_a_value():
    """Every command's --help, as a terminal shows it: a flag (--help, --smoke, --force, ...)
    is listed bare, never as taking a ``<bool>``."""
    from typer.testing import CliRunner

    from trainflow.cli import app
    from trainflow.cli.main import click_command

    def paths(command, path: list[str]):
        yield path
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from paths(sub, [*path, name])

    helped = 0
    for path in paths(click_command, []):
        out = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
        assert out.exit_code == 0, (path, out.output)
        assert "<bool>" not in out.output, (path, out.output)
        helped += 1
    assert helped > 20


def test_version_prints_the_release(tmp_path):
    from trainflow.version import __version__

    out = trainflow("--version", home=tmp_path / "home")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"trainflow {__version__}\n"
